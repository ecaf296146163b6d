#!/usr/bin/env bash
# The cost of the inter-node hop: the same produce, latency and drain runs
# against one node and against a three-node cluster on this machine (the
# same cores, so this shows the hop, not scaling). Every node runs one shard.
# Usage: bench/run-cluster-bench.sh [SECONDS_PER_LEVEL]
# Starts only what it stops: narad nodes on free ports in a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

ready() { # address: waits (with a deadline) until /readyz answers 200
  for _ in $(seq 1 600); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$1/readyz")" = 200 ]; then return 0; fi
    sleep 0.1
  done
  echo "$1 never became ready" >&2; return 1
}

free_udp_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_suite() { # label, client address
  local label="$1" node="$2"
  curl -s -X PUT "http://$node/v1/topics/bench" -d '{"partitions": 16}' >/dev/null
  echo "== $label: produce at $node, topic bench x16, 1 KiB messages"
  target/release/narad-bench produce --server "http://$node" --topic bench --seconds "$seconds" --connections 1,16,64
  target/release/narad-bench produce --server "http://$node" --topic bench --seconds "$seconds" --connections 64 --batch 100
  curl -s -X PUT "http://$node/v1/topics/latency" -d '{"partitions": 6}' >/dev/null
  target/release/narad-bench latency --server "http://$node" --topic latency --rate 100 --messages 500
  curl -s -X PUT "http://$node/v1/topics/drain" -d '{"partitions": 16}' >/dev/null
  target/release/narad-bench drain --server "http://$node" --topic drain --messages 20000 --consumers 4
}

# One node.
target/release/narad serve --data-dir "$work/single" --listen 127.0.0.1:0 --shards 1 >"$work/single.out" 2>"$work/single.err" &
pids+=($!)
single=$(address_of single)
ready "$single"
run_suite "one node" "$single"
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true

# Three nodes.
ports=($(free_udp_port) $(free_udp_port) $(free_udp_port))
peers="1=127.0.0.1:${ports[0]},2=127.0.0.1:${ports[1]},3=127.0.0.1:${ports[2]}"
for i in 1 2 3; do
  target/release/narad serve --data-dir "$work/n$i" --listen 127.0.0.1:0 --shards 1 \
    --node-id "$i" --peer-listen "127.0.0.1:${ports[$((i - 1))]}" --peers "$peers" \
    --cluster-secret bench >"$work/n$i.out" 2>"$work/n$i.err" &
  pids+=($!)
done
first=$(address_of n1); address_of n2 >/dev/null; address_of n3 >/dev/null
ready "$first"
run_suite "three nodes (2/3 of partitions on the other nodes)" "$first"
