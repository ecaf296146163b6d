#!/usr/bin/env bash
# Two builds of the node, side by side, taking turns: for each workload and
# round, a fresh node of build A, then one of build B, each running the
# workload with `narad-bench workload`. Per run it prints the rate kept, end
# to end p50 and p99, the node's CPU time per accepted message (utime +
# stime of /proc/PID/stat over the run) and the long-poll rounds a wake-up
# started that found nothing (narad_consume_empty_wakes_total, per
# message); then the medians of each build.
#
# Usage: bench/run-ab.sh BIN_A BIN_B [SECONDS] [ROUNDS] [SHARDS] [WORKLOAD...]
#   BIN_A, BIN_B: paths to two `narad` binaries (copy one aside before
#   rebuilding, e.g. cp target/release/narad /tmp/narad-before).
#   WORKLOAD: files under bench/workloads (default the 1 KiB 5k and 20k ones).
#   DRIVER_A, DRIVER_B (environment): the `--driver` of each side (default
#   narad); one binary twice with DRIVER_B=narad-idempotent measures what
#   idempotency keys cost.
set -euo pipefail
cd "$(dirname "$0")/.."
bin_a="$1"
bin_b="$2"
seconds="${3:-15}"
rounds="${4:-3}"
shards="${5:-2}"
shift $(($# < 5 ? $# : 5))
workloads=("$@")
if [[ ${#workloads[@]} -eq 0 ]]; then
  workloads=(bench/workloads/1-topic-16-partitions-1kb-5k.yaml
    bench/workloads/1-topic-16-partitions-1kb-20k.yaml)
fi
cargo build --release -p narad-bench >/dev/null
work="$(mktemp -d)"
pids=()
cleanup() {
  for f in "$work"/*.pid; do [[ -e $f ]] && pids+=("$(cat "$f")"); done
  stop_all "${pids[@]}"
  rm -rf "$work"
}
trap cleanup EXIT
. bench/lib.sh

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
empty_wakes() { # address: the counter's value (0 before its first count)
  curl -sf "http://$1/metrics" | awk '/^narad_consume_empty_wakes_total/ {s+=$2} END {print s+0}'
}

results="$work/results.tsv"
run=0
for workload in "${workloads[@]}"; do
  for round in $(seq 1 "$rounds"); do
    for build in A B; do
      bin=$bin_a
      driver=${DRIVER_A:-narad}
      if [[ $build == B ]]; then
        bin=$bin_b
        driver=${DRIVER_B:-narad}
      fi
      run=$((run + 1))
      name="run$run"
      "$bin" serve --data-dir "$work/$name" --listen 127.0.0.1:0 --shards "$shards" \
        >"$work/$name.out" 2>"$work/$name.err" &
      pid=$!
      echo $pid >"$work/$name.pid"
      address=$(address_of "$name")
      before=$(ticks "$pid")
      wakes_before=$(empty_wakes "$address")
      target/release/narad-bench workload "$workload" --driver "$driver" --server "http://$address" \
        --duration-seconds "$seconds" --warmup-seconds 0 --out "$work/$name-out" \
        >"$work/$name.txt" 2>&1
      after=$(ticks "$pid")
      wakes_after=$(empty_wakes "$address")
      stop_all "$pid"
      rm -f "$work/$name.pid"
      rm -rf "${work:?}/$name"
      python3 - "$work/$name-out" "$seconds" "$build" "$(basename "$workload" .yaml)" \
        "$(((after - before)))" "$hz" "$((wakes_after - wakes_before))" >>"$results" <<'EOF'
import json, pathlib, sys
out, seconds, build, workload, ticks, hz, wakes = sys.argv[1:]
result = json.loads(sorted(pathlib.Path(out).glob("*.json"))[-1].read_text())
rates = result.get("publishRate", [])
rate = sum(rates) / max(len(rates), 1)
sent = max(rate * float(seconds), 1.0)
cpu_us = int(ticks) / int(hz) * 1e6 / sent
print("\t".join(str(v) for v in [
    workload, build, f"{rate:.0f}",
    f"{result['aggregatedEndToEndLatency50pct']:.2f}",
    f"{result['aggregatedEndToEndLatency99pct']:.2f}",
    f"{cpu_us:.1f}", f"{int(wakes) / sent:.3f}"]))
EOF
      tail -1 "$results"
    done
  done
done

echo "== medians (workload, build, rate msg/s, e2e p50 ms, e2e p99 ms, CPU us/msg, empty wakes/msg)"
python3 - "$results" <<'EOF'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
keys = []
for r in rows:
    if (r[0], r[1]) not in keys:
        keys.append((r[0], r[1]))
for workload, build in keys:
    mine = [r for r in rows if r[0] == workload and r[1] == build]
    cols = [statistics.median(float(r[i]) for r in mine) for i in range(2, 7)]
    print(f"{workload}\t{build}\t" + "\t".join(f"{c:g}" for c in cols))
EOF
