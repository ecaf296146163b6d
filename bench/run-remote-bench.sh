#!/usr/bin/env bash
# What a remote child costs and how fast it ships, two one-node clusters on
# loopback (same machine: client, parent and remote share its cores).
# Usage: bench/run-remote-bench.sh [SECONDS_PER_RUN] [ROUNDS] [SHARDS]
#
# - produce: 1 KiB single produces at 64 connections to a topic with no
#   child, one fanout child and one remote child (16 partitions each), in
#   turns for ROUNDS rounds; after each run it waits until the child copied
#   all and reports the copy's rate over the run and its catch-up
#   (messages / (run + catch-up seconds)).
# - backlog: what 5 s of 1 KiB produces at 64 connections accept waits
#   while the remote child points at a closed port; then the child is pointed at the remote and the time
#   until it shipped them all gives its drain rate (its batches, one request
#   in flight per partition, children.remote_max_in_flight per node).
# - lag: produce -> consumable at 5,000 msg/s (8 producers, 10,000
#   messages), read from the parent, from a fanout child and from the
#   remote cluster's copy; 3 runs each.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
rounds="${2:-3}"
shards="${3:-$(nproc)}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

for name in parent remote; do
  target/release/narad serve --data-dir "$work/$name" --listen 127.0.0.1:0 --shards "$shards" \
    --peer-listen 127.0.0.1:0 --set storage.wal_ring_bytes=268435456 \
    >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
done
parent=$(address_of parent)
remote=$(address_of remote)
msgs() { grep -o '[0-9]* msg/s' | awk '{print $1}'; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
put() { curl -sf -X PUT "http://$1$2" -d "$3" >/dev/null; }
# Seconds (to 0.1 s) until every child of topic $1 copied all it has.
caught_up() {
  local started
  started=$(date +%s.%N)
  while curl -sf "http://$parent/v1/topics/$1/children" | grep -q '"lag_messages":[1-9]'; do
    sleep 0.1
  done
  awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $started}"
}

kinds=(none fanout remote)
put "$parent" /v1/topics/t-none '{"partitions": 16}'
put "$parent" /v1/topics/t-fanout '{"partitions": 16}'
put "$parent" /v1/topics/t-fanout/children/t-fanout-copy '{"kind": "fanout", "topic": {"partitions": 16}}'
put "$parent" /v1/topics/t-remote '{"partitions": 16}'
put "$remote" /v1/topics/t-far '{"partitions": 16}'
remote_child "$parent" t-remote t-remote-copy "http://$remote" t-far
for k in "${kinds[@]}"; do : >"$work/rate-$k"; : >"$work/copy-$k"; done

echo "== produce: 1 KiB single produces, 64 connections, $seconds s a run, $rounds rounds ($shards shards)"
for round in $(seq 1 "$rounds"); do
  line="round $round:"
  for k in 0 1 2; do
    kind=${kinds[$(( (k + round) % 3 ))]}
    rate=$(target/release/narad-bench produce --server "http://$parent" --topic "t-$kind" \
      --seconds "$seconds" --connections 64 | msgs)
    wait_s=$(caught_up "t-$kind")
    copy=$(awk "BEGIN {printf \"%d\", $rate * $seconds / ($seconds + $wait_s)}")
    echo "$rate" >>"$work/rate-$kind"
    echo "$copy" >>"$work/copy-$kind"
    line="$line  $kind: $rate msg/s, copied at $copy msg/s (caught up ${wait_s} s after)"
  done
  echo "$line"
done
base=$(median <"$work/rate-none")
for kind in "${kinds[@]}"; do
  m=$(median <"$work/rate-$kind")
  c=$(median <"$work/copy-$kind")
  echo "median: $kind: produce $m msg/s ($(awk "BEGIN {printf \"%.3f\", $m/$base}")x of no child), copy $c msg/s"
done

echo "== backlog: 5 s of 1 KiB produces, shipped after the link returns"
put "$parent" /v1/topics/backlog '{"partitions": 16}'
put "$remote" /v1/topics/backlog-far '{"partitions": 16}'
# A port nothing listens on: the copy fails and waits.
closed=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
remote_child "$parent" backlog far "http://127.0.0.1:$closed" backlog-far
target/release/narad-bench produce --server "http://$parent" --topic backlog \
  --seconds 5 --connections 64 >/dev/null
before=$(held "$remote" backlog-far)
waiting=$(held "$parent" backlog)
started=$(date +%s.%N)
remote_child "$parent" backlog far "http://$remote" backlog-far
while curl -sf "http://$parent/v1/topics/backlog/children" | grep -q '"lag_messages":[1-9]'; do sleep 0.05; done
took=$(awk "BEGIN {printf \"%.2f\", $(date +%s.%N) - $started}")
shipped=$(( $(held "$remote" backlog-far) - before ))
echo "shipped $shipped of $waiting waiting messages in $took s: $(awk "BEGIN {printf \"%d\", $shipped / $took}") msg/s"

echo "== lag: produce -> consumable at 5000 msg/s, 8 producers, 10000 messages"
put "$parent" /v1/topics/lag-plain '{"partitions": 16}'
put "$parent" /v1/topics/lag-fan '{"partitions": 16}'
put "$parent" /v1/topics/lag-fan/children/lag-fan-copy '{"kind": "fanout", "topic": {"partitions": 16}}'
put "$parent" /v1/topics/lag-rem '{"partitions": 16}'
put "$remote" /v1/topics/lag-far '{"partitions": 16}'
remote_child "$parent" lag-rem lag-rem-copy "http://$remote" lag-far
for run in 1 2 3; do
  target/release/narad-bench latency --server "http://$parent" --topic lag-plain --rate 5000 \
    --producers 8 --messages 10000
  target/release/narad-bench latency --server "http://$parent" --topic lag-fan \
    --consume-topic lag-fan-copy --rate 5000 --producers 8 --messages 10000
  target/release/narad-bench latency --server "http://$parent" --topic lag-rem \
    --consume-server "http://$remote" --consume-topic lag-far --rate 5000 --producers 8 \
    --messages 10000
done
