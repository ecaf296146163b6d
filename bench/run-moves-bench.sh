#!/usr/bin/env bash
# What partition moves cost, on a three-node cluster on this machine (one
# shard a node). Usage: bench/run-moves-bench.sh [FILL_SECONDS] [ROUNDS]
#
# - copy: a partition filled for FILL_SECONDS with 1 KiB produces (64
#   connections) moves to another node at the default copy rate (100 MiB/s);
#   bytes copied over the move's time, against this disk's sequential write
#   and read (dd, O_DIRECT, 256 MiB).
# - latency: produce -> consumable at 2,000 msg/s (8 producers, 20,000
#   messages) on a 6-partition topic, ROUNDS runs with no move, then ROUNDS
#   runs during which every partition of the topic moves once to another
#   node (two at a time); the medians of p50 and p99 and their ratio.
# - freeze: how long each handover of those moves froze its partition
#   (`freeze_ms` in the destinations' logs): p50, p99, max.
set -euo pipefail
cd "$(dirname "$0")/.."
fill="${1:-10}"
rounds="${2:-3}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

free_udp_port() { python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
percentile() { sort -n | awk -v q="$1" '{v[NR]=$1} END {i=int(NR*q+0.999); if (i<1) i=1; print v[i]}'; }

ports=($(free_udp_port) $(free_udp_port) $(free_udp_port))
peers="1=127.0.0.1:${ports[0]},2=127.0.0.1:${ports[1]},3=127.0.0.1:${ports[2]}"
for i in 1 2 3; do
  target/release/narad serve --data-dir "$work/n$i" --listen 127.0.0.1:0 --shards 1 \
    --node-id "$i" --peer-listen "127.0.0.1:${ports[$((i - 1))]}" --peers "$peers" \
    --cluster-secret bench --set storage.wal_ring_bytes=268435456 \
    >"$work/n$i.out" 2>"$work/n$i.err" &
  pids+=($!)
done
addrs=($(address_of n1) $(address_of n2) $(address_of n3))
first=${addrs[0]}
for _ in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$first/readyz")" = 200 ] && break
  sleep 0.1
done

owner_of() { # topic partition
  curl -sf "http://$first/v1/topics/$1" | python3 -c "import json,sys; print(json.load(sys.stdin)['partition_stats'][$2]['owner'])"
}
move() { # topic partition to: prints the move's id ("" when refused)
  curl -s -X POST "http://$first/v1/cluster/moves" -d "{\"topic\": \"$1\", \"partition\": $2, \"to\": $3}" |
    python3 -c "import json,sys; m=json.load(sys.stdin).get('moves') or [{}]; print(m[0].get('id',''))"
}
move_field() { # id field
  curl -sf "http://$first/v1/cluster/moves" |
    python3 -c "import json,sys; print(next((m['$2'] for m in json.load(sys.stdin)['moves'] if m['id']=='$1'), ''))"
}
wait_moves() { # waits until no move is planned or running
  while curl -sf "http://$first/v1/cluster/moves" | grep -qE '"state":"(planned|copying|freezing)"'; do sleep 0.1; done
}

echo "== disk: sequential write and read, 256 MiB, O_DIRECT"
dd if=/dev/zero of="$work/dd" bs=1M count=256 oflag=direct conv=fdatasync 2>&1 | tail -1
dd if="$work/dd" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1
rm -f "$work/dd"

echo "== copy: one partition filled for $fill s, moved at the default copy rate"
curl -sf -X PUT "http://$first/v1/topics/bulk" -d '{"partitions": 1}' >/dev/null
target/release/narad-bench produce --server "http://$first" --topic bulk --seconds "$fill" --connections 64 |
  tail -1
from=$(owner_of bulk 0)
to=$(( from % 3 + 1 ))
id=$(move bulk 0 "$to")
wait_moves
python3 - "$first" "$id" <<'EOF'
import json, sys, urllib.request
moves = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/v1/cluster/moves"))["moves"]
m = next(m for m in moves if m["id"] == sys.argv[2])
took = (m["finished_at_ms"] - m["started_at_ms"]) / 1000
print(f"move {m['id']}: {m['state']}, {m['copied_bytes'] / 2**20:.1f} MiB in {took:.2f} s "
      f"= {m['copied_bytes'] / 2**20 / took:.1f} MiB/s (node {m['from']} -> {m['to']})")
EOF

echo "== latency: produce -> consumable at 2000 msg/s, 8 producers, 20000 messages"
curl -sf -X PUT "http://$first/v1/topics/lat" -d '{"partitions": 6}' >/dev/null
run_latency() { # label
  target/release/narad-bench latency --server "http://$first" --topic lat --rate 2000 \
    --producers 8 --messages 20000 | tee -a "$work/$1"
}
for r in $(seq 1 "$rounds"); do run_latency quiet; done
for r in $(seq 1 "$rounds"); do
  # A rebalance that moves every partition of the topic once (two at a
  # time, cluster.max_concurrent_moves), started a second into the run.
  (sleep 1; for p in 0 1 2 3 4 5; do o=$(owner_of lat "$p"); move lat "$p" $(( o % 3 + 1 )) >/dev/null; done) &
  mover=$!
  run_latency moving
  wait "$mover" # (a bare `wait` would wait for the nodes too)
  wait_moves
done
field() { grep -o "$1 [0-9]* us" "$work/$2" | awk '{print $2}' | median; }
q50=$(field p50 quiet); q99=$(field p99 quiet); m50=$(field p50 moving); m99=$(field p99 moving)
echo "median p50: quiet $q50 us, while moving $m50 us"
echo "median p99: quiet $q99 us, while moving $m99 us ($(awk "BEGIN {printf \"%.2f\", $m99/$q99}")x)"
done_moves=$(grep -h "partition handed over" "$work"/n*.err | grep -c freeze_ms || true)
echo "== freeze: $done_moves handovers"
grep -ho 'freeze_ms=[0-9]*' "$work"/n*.err | cut -d= -f2 >"$work/freeze"
echo "freeze p50 $(percentile 0.5 <"$work/freeze") ms, p99 $(percentile 0.99 <"$work/freeze") ms, max $(sort -n "$work/freeze" | tail -1) ms"
for part in copy_ms install_ms hand_over_ms sync_ms state_ms open_ms; do
  grep -ho " $part=[0-9]*" "$work"/n*.err | cut -d= -f2 >"$work/$part"
  echo "  of which $part: p50 $(percentile 0.5 <"$work/$part") ms, p99 $(percentile 0.99 <"$work/$part") ms"
done
# How long commits waited at each source: the freeze plus the source's
# own apply of the handover.
grep -ho 'frozen_ms=[0-9]*' "$work"/n*.err | cut -d= -f2 >"$work/frozen"
echo "at the sources, commits waited: p50 $(percentile 0.5 <"$work/frozen") ms, p99 $(percentile 0.99 <"$work/frozen") ms, max $(sort -n "$work/frozen" | tail -1) ms"
