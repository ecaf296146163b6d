#!/usr/bin/env bash
# A remote child between two three-node clusters on this machine (all six
# nodes and the clients share its cores: this shows behaviour, not the
# speed of two real clusters). Usage: bench/run-remote-3x3.sh [SECONDS]
#
# Cluster A's topic `orders` (6 partitions, spread over A's nodes) has a
# remote child shipping to `orders` on cluster B through B's node 1.
# 1. produce: 1 KiB produces at 64 connections for SECONDS against A's node
#    1; how long after the run the child caught up, and what B holds.
# 2. lag: produce on A -> consumable on B at 5,000 msg/s, 3 runs (topic
#    lag, its own remote child).
# 3. a node of B killed during a produce run and started again: the child
#    catches up, and B holds every message A holds (more: resends) (topic
#    faulted, its own remote child).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
work="$(mktemp -d)"
declare -A pid_of
cleanup() { stop_all "${pid_of[@]}"; rm -rf "$work"; }
trap cleanup EXIT

. bench/lib.sh

free_udp_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
free_tcp_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ready() {
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$1/readyz")" = 200 ] && return 0
    sleep 0.1
  done
  echo "$1 never became ready" >&2; return 1
}
lag_of() { curl -sf "http://$1/v1/topics/orders/children" | grep -o '"lag_messages":[0-9]*' | cut -d: -f2; }
caught_up() {
  local started
  started=$(date +%s.%N)
  until [ "$(lag_of "$1")" = 0 ]; do sleep 0.1; done
  awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $started}"
}

declare -A client_of
start_node() { # cluster, index, peers, peer port, client port
  local name="$1$2"
  target/release/narad serve --data-dir "$work/$name" --listen "127.0.0.1:$5" --shards 1 \
    --node-id "$2" --peer-listen "127.0.0.1:$4" --peers "$3" --cluster-secret "bench-$1" \
    --set storage.wal_ring_bytes=134217728 >>"$work/$name.out" 2>>"$work/$name.err" &
  pid_of[$name]=$!
  client_of[$name]="127.0.0.1:$5"
}
for cluster in a b; do
  ports=($(free_udp_port) $(free_udp_port) $(free_udp_port))
  peers="1=127.0.0.1:${ports[0]},2=127.0.0.1:${ports[1]},3=127.0.0.1:${ports[2]}"
  for i in 1 2 3; do
    start_node "$cluster" "$i" "$peers" "${ports[$((i - 1))]}" "$(free_tcp_port)"
    echo "$peers ${ports[$((i - 1))]}" >"$work/$cluster$i.args"
  done
done
for name in a1 a2 a3 b1 b2 b3; do address_of "$name" >/dev/null; done
a=${client_of[a1]}
b=${client_of[b1]}
ready "$a"; ready "$b"
curl -sf -X PUT "http://$a/v1/topics/orders" -d '{"partitions": 6}' >/dev/null
curl -sf -X PUT "http://$b/v1/topics/orders" -d '{"partitions": 6}' >/dev/null
remote_child "$a" orders dr "http://$b" orders

echo "== produce: 1 KiB produces, 64 connections, $seconds s, on A's node 1"
target/release/narad-bench produce --server "http://$a" --topic orders --seconds "$seconds" \
  --connections 64
echo "caught up $(caught_up "$a") s after the run; A holds $(held "$a" orders), B holds $(held "$b" orders)"

echo "== lag: produce on A -> consumable on B at 5000 msg/s, 8 producers, 10000 messages (topic lag)"
curl -sf -X PUT "http://$a/v1/topics/lag" -d '{"partitions": 6}' >/dev/null
curl -sf -X PUT "http://$b/v1/topics/lag" -d '{"partitions": 6}' >/dev/null
remote_child "$a" lag dr "http://$b" lag
for run in 1 2 3; do
  target/release/narad-bench latency --server "http://$a" --topic lag --consume-server "http://$b" \
    --rate 5000 --producers 8 --messages 10000
done

echo "== B's node 2 killed for 5 s during a $seconds s produce run (topic faulted)"
curl -sf -X PUT "http://$a/v1/topics/faulted" -d '{"partitions": 6}' >/dev/null
curl -sf -X PUT "http://$b/v1/topics/faulted" -d '{"partitions": 6}' >/dev/null
remote_child "$a" faulted dr "http://$b" faulted
target/release/narad-bench produce --server "http://$a" --topic faulted --seconds "$seconds" \
  --connections 64 >"$work/produce.txt" &
producer=$!
sleep 2
kill -9 "${pid_of[b2]}"
sleep 5
read -r peers port <"$work/b2.args"
start_node b 2 "$peers" "$port" "${client_of[b2]#127.0.0.1:}"
wait "$producer"
grep -o '[0-9]* msg/s' "$work/produce.txt" | head -1
started=$(date +%s.%N)
until curl -sf "http://$a/v1/topics/faulted/children" | grep -q '"lag_messages":0,'; do sleep 0.1; done
echo "caught up $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $started}") s after the run"
echo "A holds $(held "$a" faulted) messages of faulted, B $(held "$b" faulted) (the difference: resends)"
