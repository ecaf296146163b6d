#!/usr/bin/env bash
# Produce benchmark of one node beside the bare ceiling endpoint, same machine,
# same run. Usage: bench/run-produce-bench.sh [SECONDS_PER_LEVEL] [SHARDS]
# (SHARDS: both sides run that many shards; every core by default).
# Starts only what it stops: a narad node and a ceiling server on free ports.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-5}"
shards="${2:-$(nproc)}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

target/release/narad serve --data-dir "$work/narad" --listen 127.0.0.1:0 --shards "$shards" >"$work/narad.out" 2>"$work/narad.err" &
pids+=($!)
node=$(address_of narad)
curl -s -X PUT "http://$node/v1/topics/bench" -d '{"partitions": 16}' >/dev/null
echo "== narad $node ($shards shards), topic bench x16, 1 KiB messages"
target/release/narad-bench produce --server "http://$node" --topic bench --seconds "$seconds"
target/release/narad-bench produce --server "http://$node" --topic bench --seconds "$seconds" --connections 64 --batch 100
curl -s -X PUT "http://$node/v1/topics/latency" -d '{"partitions": 4}' >/dev/null
target/release/narad-bench latency --server "http://$node" --topic latency --rate 100 --messages 500
curl -s -X PUT "http://$node/v1/topics/drain" -d '{"partitions": 16}' >/dev/null
target/release/narad-bench drain --server "http://$node" --topic drain --messages 20000 --consumers 4
kill "${pids[0]}"; wait "${pids[0]}" 2>/dev/null || true

target/release/narad-bench ceiling --listen 127.0.0.1:0 --dir "$work/ceiling" --shards "$shards" >"$work/ceiling.out" 2>"$work/ceiling.err" &
pids+=($!)
ceiling=$(address_of ceiling)
echo "== ceiling $ceiling ($shards shards: hyper on glommio, 202 after WAL group commit)"
target/release/narad-bench produce --server "http://$ceiling" --topic bench --seconds "$seconds" --connections 1,16,64,256
