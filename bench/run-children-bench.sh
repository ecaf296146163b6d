#!/usr/bin/env bash
# What children cost, on one node. Usage:
#   bench/run-children-bench.sh [SECONDS_PER_RUN] [ROUNDS] [SHARDS]
#
# - produce: 1 KiB single produces at 64 connections to topics with 0, 1, 2
#   and 4 fanout children (16 partitions each, the children too), in turns
#   for ROUNDS rounds; between runs it waits until every child copied all
#   (so no copy backlog leaks into the next run) and reports how long that
#   took. Prints every run, the median of each, and the ratio to 0 children.
# - lag: produce -> consumable at 5,000 msg/s (8 producer threads), in the
#   parent and in its fanout child, 3 runs each; the child's figure minus
#   the parent's is what the copy adds.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
rounds="${2:-3}"
shards="${3:-$(nproc)}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

target/release/narad serve --data-dir "$work/node" --listen 127.0.0.1:0 --shards "$shards" \
  --set storage.wal_ring_bytes=268435456 >"$work/node.out" 2>"$work/node.err" &
pids+=($!)
node=$(address_of node)
msgs() { grep -o '[0-9]* msg/s' | awk '{print $1}'; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
put() { curl -sf -X PUT "http://$node$1" -d "$2" >/dev/null; }

counts=(0 1 2 4)
for n in "${counts[@]}"; do
  put "/v1/topics/c$n" '{"partitions": 16}'
  for i in $(seq 1 "$n"); do
    put "/v1/topics/c$n/children/c$n-child$i" '{"kind": "fanout", "topic": {"partitions": 16}}'
  done
  : >"$work/c$n"
done

# Seconds until every child of topic $1 copied all it has.
caught_up() {
  local started=$SECONDS
  while curl -sf "http://$node/v1/topics/$1/children" | grep -q '"lag_messages":[1-9]'; do sleep 0.2; done
  echo $((SECONDS - started))
}

echo "== produce: 1 KiB single produces, 64 connections, $seconds s a run, $rounds rounds ($shards shards)"
for round in $(seq 1 "$rounds"); do
  line="round $round:"
  # Turns rotate which count goes first.
  for k in 0 1 2 3; do
    n=${counts[$(( (k + round) % 4 ))]}
    rate=$(target/release/narad-bench produce --server "http://$node" --topic "c$n" \
      --seconds "$seconds" --connections 64 | msgs)
    wait_s=$(caught_up "c$n")
    echo "$rate" >>"$work/c$n"
    line="$line  $n children $rate msg/s (copies caught up ${wait_s} s after)"
  done
  echo "$line"
done
base=$(median <"$work/c0")
for n in "${counts[@]}"; do
  m=$(median <"$work/c$n")
  echo "median: $n children $m msg/s, $(awk "BEGIN {printf \"%.3f\", $m/$base}")x of no children"
done

echo "== lag: produce -> consumable at 5000 msg/s, 8 producers, 10000 messages"
# Two topics, so that neither run finds the other's messages waiting: one
# read directly, one read through its child (nobody reads that parent).
put "/v1/topics/lag-plain" '{"partitions": 16}'
put "/v1/topics/lag-parent" '{"partitions": 16}'
put "/v1/topics/lag-parent/children/lag-child" '{"kind": "fanout", "topic": {"partitions": 16}}'
for run in 1 2 3; do
  target/release/narad-bench latency --server "http://$node" --topic lag-plain --rate 5000 \
    --producers 8 --messages 10000
  target/release/narad-bench latency --server "http://$node" --topic lag-parent \
    --consume-topic lag-child --rate 5000 --producers 8 --messages 10000
done
