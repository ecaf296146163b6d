#!/usr/bin/env bash
# Narad beside the peer brokers on the same machine, same run: every workload
# given (default: the 1 KiB ones at max rate, 5,000 and 20,000 msg/s) on a
# fresh single node and on each peer, taking turns.
# Usage: [ROUNDS=N] bench/run-compare.sh [SECONDS_PER_RUN] [OUT_DIR] [WORKLOAD.yaml...]
# (ROUNDS: each system runs each workload N times, taking turns; the table
# keeps each system's median round.)
# Needs the peers installed once (bench/peers.sh install). Starts only what it
# stops: a narad node on a free port, and the peers that were not running yet.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
out="${2:-docs/compare}"
shift $(($# < 2 ? $# : 2))
workloads=("$@")
if ((${#workloads[@]} == 0)); then
    workloads=(bench/workloads/1-topic-16-partitions-1kb-max.yaml
        bench/workloads/1-topic-16-partitions-1kb-5k.yaml
        bench/workloads/1-topic-16-partitions-1kb-20k.yaml)
fi
cargo build --release -p narad-broker >/dev/null
cargo build --release -p narad-bench --features peers >/dev/null
work="$(mktemp -d)"
pids=()
started_peers=no
cleanup() {
    stop_all "${pids[@]}"
    if [[ $started_peers == yes ]]; then bench/peers.sh stop; fi
    rm -rf "$work"
}
trap cleanup EXIT

. bench/lib.sh

peer_status=$(bench/peers.sh status)
if [[ $peer_status != *": running"* ]]; then
    started_peers=yes
fi
bench/peers.sh start
target/release/narad serve --data-dir "$work/narad" --listen 127.0.0.1:0 >"$work/narad.out" 2>"$work/narad.err" &
pids+=($!)
node=$(address_of narad)
echo "== narad $node; peers: $(bench/peers.sh status | tr '\n' ' ')"
target/release/narad-bench compare "${workloads[@]}" --server "http://$node" \
    --out "$out" --duration-seconds "$seconds" --warmup-seconds 10 --rounds "${ROUNDS:-1}"
