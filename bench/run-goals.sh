#!/usr/bin/env bash
# The data path's figures in one run, each beside what it is compared with
# (docs/benchmarks.md, "The data path's figures in one run").
# Usage: bench/run-goals.sh [SECONDS_PER_RUN] [ROUNDS] [SHARDS]
#
# 1. end to end, 20,000 msg/s open loop and max rate: `narad-bench compare`
#    of the 5k, 20k and max 1 KiB workloads on Narad (its own driver and
#    the stock reqwest one) and Redis streams with redis-rs, ROUNDS rounds;
#    at max rate also narad-coalescing and redis-pipelined.
# 2. produce -> consumable at 100 msg/s on an idle node.
# 3. server CPU per accepted message: the node's CPU time (utime + stime
#    of /proc/PID/stat) over one workload run at 5k, 20k and max rate,
#    divided by the messages it accepted; the same for redis-server.
# 4. the node against the bare ceiling endpoint with the same shards, and
#    batch produce (100 messages of 1 KiB per request, 64 connections):
#    bench/run-produce-bench.sh.
# Needs redis-server (bench/peers.sh install) and the peers build.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
rounds="${2:-3}"
shards="${3:-$(nproc)}"
cargo build --release -p narad-broker >/dev/null
cargo build --release -p narad-bench --features peers >/dev/null
work="$(mktemp -d)"
pids=()
started_peers=no
cleanup() {
  # fresh_node runs in a command substitution: its pids are in files.
  for f in "$work"/*.pid; do [[ -e $f ]] && pids+=("$(cat "$f")"); done
  stop_all "${pids[@]}"
  if [[ $started_peers == yes ]]; then bench/peers.sh stop; fi
  rm -rf "$work"
}
trap cleanup EXIT

. bench/lib.sh

if [[ $(bench/peers.sh status) != *"redis: running"* ]]; then started_peers=yes; fi
bench/peers.sh start
fresh_node() { # name: starts a node with its own folder, prints its address
  target/release/narad serve --data-dir "$work/$1" --listen 127.0.0.1:0 --shards "$shards" \
    >"$work/$1.out" 2>"$work/$1.err" &
  echo $! >"$work/$1.pid"
  address_of "$1"
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
workloads=(1kb-5k 1kb-20k 1kb-max)

echo "== 1. compare: ${workloads[*]}, $rounds rounds of $seconds s"
node=$(fresh_node compare)
for w in "${workloads[@]}"; do
  peers=narad-reqwest,redis
  # At max rate also the coalescing producer, beside Redis pipelining.
  if [[ $w == 1kb-max ]]; then peers=narad-reqwest,narad-coalescing,redis,redis-pipelined; fi
  target/release/narad-bench compare "bench/workloads/1-topic-16-partitions-$w.yaml" \
    --server "http://$node" --peers "$peers" --rounds "$rounds" \
    --duration-seconds "$seconds" --warmup-seconds 5 --out "$work/compare-$w" 2>&1 \
    | grep -v '^\s*$'
done

echo "== 2. produce -> consumable at 100 msg/s"
idle=$(fresh_node idle)
curl -sf -X PUT "http://$idle/v1/topics/light" -d '{"partitions": 4}' >/dev/null
for run in 1 2 3; do
  target/release/narad-bench latency --server "http://$idle" --topic light --rate 100 --messages 500
done

echo "== 3. server CPU per accepted message ($seconds s runs)"
redis_pid=$(pgrep -f 'redis-server.*16379' | head -1)
for w in "${workloads[@]}"; do
  for system in narad redis; do
    if [[ $system == narad ]]; then
      name="cpu-$w"
      address=$(fresh_node "$name")
      pid=$(cat "$work/$name.pid")
      args=(--server "http://$address")
    else
      pid=$redis_pid
      args=(--driver redis)
    fi
    before=$(ticks "$pid")
    target/release/narad-bench workload "bench/workloads/1-topic-16-partitions-$w.yaml" \
      "${args[@]}" --duration-seconds "$seconds" --warmup-seconds 0 --out "$work/cpu-$system-$w" \
      >"$work/cpu-$system-$w.txt" 2>&1
    after=$(ticks "$pid")
    sent=$(python3 - "$work/cpu-$system-$w" "$seconds" <<'EOF'
import json, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
rates = json.loads(files[-1].read_text()).get("publishRate", [])
print(int(sum(rates) / max(len(rates), 1) * float(sys.argv[2])))
EOF
)
    echo "$w $system: $(awk "BEGIN {printf \"%.1f\", ($after - $before) / $hz}") CPU-s for $sent messages: $(awk "BEGIN {printf \"%.1f\", ($after - $before) / $hz * 1e6 / ($sent > 0 ? $sent : 1)}") us per message"
  done
done

echo "== 4. the node against the ceiling, and batch produce"
bench/run-produce-bench.sh 10 "$shards" | grep -E '==|connections|batch'
