#!/usr/bin/env bash
# What a search costs: a fresh node (release build, topic bench x16) filled
# with MESSAGES messages of MESSAGE_BYTES by HTTP batch produce, then ROUNDS
# searches for a text no message holds, each following its cursor until
# every retained message was searched (each call scans at most 10,000
# messages of each partition). Prints each search's time and the node's CPU
# time, per million messages scanned, then their medians.
#
# Usage: bench/run-search-bench.sh [MESSAGES] [ROUNDS] [SHARDS] [MESSAGE_BYTES]
set -euo pipefail
cd "$(dirname "$0")/.."
messages="${1:-1000000}"
rounds="${2:-3}"
shards="${3:-2}"
bytes="${4:-256}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

hz=$(getconf CLK_TCK)
target/release/narad serve --data-dir "$work/node" --listen 127.0.0.1:0 --shards "$shards" \
  >"$work/node.out" 2>"$work/node.err" &
pid=$!
pids+=("$pid")
node=$(address_of node)
curl -sf -X PUT "http://$node/v1/topics/bench" -d '{"partitions": 16}' >/dev/null
while (($(held "$node" bench) < messages)); do
  target/release/narad-bench produce --server "http://$node" --topic bench \
    --seconds 2 --connections 32 --batch 100 --message-bytes "$bytes" >/dev/null
done
scanned=$(held "$node" bench)
echo "filled: $scanned messages of $bytes bytes in 16 partitions on $shards shards"

results="$work/results.tsv"
for round in $(seq 1 "$rounds"); do
  before=$(ticks "$pid")
  start=$(date +%s%N)
  calls=0
  cursor=""
  while :; do
    calls=$((calls + 1))
    answer=$(curl -sf "http://$node/v1/topics/bench/messages?contains=no-message-holds-this&limit=1000${cursor:+&cursor=$cursor}")
    cursor=$(echo "$answer" | python3 -c 'import json, sys; c = json.load(sys.stdin)["cursor"]; print(c or "")')
    [[ -z $cursor ]] && break
  done
  end=$(date +%s%N)
  after=$(ticks "$pid")
  secs=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.3f", (e - s) / 1e9 }')
  per_million=$(awk -v t="$secs" -v n="$scanned" 'BEGIN { printf "%.2f", t * 1e6 / n }')
  cpu_per_million=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$scanned" 'BEGIN { printf "%.2f", t / hz * 1e6 / n }')
  echo "round $round: $calls calls, $secs s; per million scanned: $per_million s, node CPU $cpu_per_million s"
  printf '%s\t%s\n' "$per_million" "$cpu_per_million" >>"$results"
done
echo "medians of $rounds: $(cut -f1 "$results" | median) s and $(cut -f2 "$results" | median) s of node CPU per million messages scanned ($bytes-byte messages)"
