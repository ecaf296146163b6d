#!/usr/bin/env bash
# What a node costs as its work grows (docs/benchmarks.md, "Cost as work
# grows"): a large backlog, many partitions, and the restarts of both.
# Usage: bench/run-backlog.sh [BACKLOG_GB] [TOPICS] [PARTITIONS_PER_TOPIC] [SHARDS]
#
# 1. Fill one topic of 16 partitions with BACKLOG_GB of 1 KiB messages
#    (batch produce, 100 per request, 64 connections); stop the node and
#    time its restart (start to ready) with that much in its segments.
# 2. Kill it with SIGKILL under full produce (the WAL ring holds what it
#    accepted and had not committed) and time that restart too.
# 3. Drop the page cache; the disk's sequential read rate (dd, O_DIRECT,
#    over the first segments of the backlog); then consume + ack the whole
#    backlog from disk (`narad-bench drain --no-fill`, 8 consumers).
# 4. TOPICS topics of PARTITIONS_PER_TOPIC partitions on a fresh node,
#    written for 10 s; disk and anonymous memory after it, after a restart
#    (no partition open), and after one consume reached every partition.
# Needs root for /proc/sys/vm/drop_caches (the page cache is left alone
# otherwise, and the figure says so).
set -euo pipefail
cd "$(dirname "$0")/.."
backlog_gb="${1:-10}"
topics="${2:-10}"
per_topic="${3:-1000}"
shards="${4:-$(nproc)}"
# NARAD and NARAD_BENCH name prebuilt binaries; by default they are built.
narad="${NARAD:-target/release/narad}"
narad_bench="${NARAD_BENCH:-target/release/narad-bench}"
if [[ -z ${NARAD:-} ]]; then cargo build --release -p narad-broker >/dev/null; fi
if [[ -z ${NARAD_BENCH:-} ]]; then cargo build --release -p narad-bench >/dev/null; fi
work="$(mktemp -d -p "${BENCH_DIR:-/tmp}")"
pids=()
cleanup() {
  for f in "$work"/*.pid; do [[ -e $f ]] && pids+=("$(cat "$f")"); done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

. bench/lib.sh

start_node() { # name folder: starts a node on folder, prints its address
  : >"$work/$1.out"
  "$narad" serve --data-dir "$2" --listen 127.0.0.1:0 --shards "$shards" \
    >"$work/$1.out" 2>"$work/$1.err" &
  echo $! >"$work/$1.pid"
  address_of "$1"
}
ready_seconds() { # name folder: starts a node, prints seconds until /readyz answers 200
  local begin address
  begin=$(date +%s.%N)
  address=$(start_node "$1" "$2")
  while ! curl -sf "http://$address/readyz" >/dev/null; do sleep 0.05; done
  echo "$address $(echo "$(date +%s.%N) - $begin" | bc)"
}
stop_node() { # name [signal]
  local pid
  pid=$(cat "$work/$1.pid")
  kill "-${2:-TERM}" "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  rm -f "$work/$1.pid"
}
rss_mb() { awk '/RssAnon/ {printf "%.0f", $2 / 1024}' "/proc/$(cat "$work/$1.pid")/status"; }
mb() { du -sm "$1" | cut -f1; }
drop_cache() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null && echo dropped || echo "NOT dropped (not root)"; }

data="$work/backlog"
echo "== 1. fill ${backlog_gb} GB into 16 partitions"
node=$(start_node fill "$data")
curl -sf -X PUT "http://$node/v1/topics/backlog" -d '{"partitions": 16}' >/dev/null
while (($(mb "$data") < backlog_gb * 1024)); do
  "$narad_bench" produce --server "http://$node" --topic backlog \
    --connections 64 --batch 100 --seconds 10 | tail -1
done
messages=$(held "$node" backlog)
echo "held: $messages messages, $(mb "$data") MB on disk, node anonymous memory $(rss_mb fill) MB"
stop_node fill
read -r node took < <(ready_seconds graceful "$data")
echo "restart after a graceful stop: ready in $took s, anonymous memory $(rss_mb graceful) MB"

echo "== 2. SIGKILL under full produce"
"$narad_bench" produce --server "http://$node" --topic backlog \
  --connections 64 --batch 100 --seconds 6 >/dev/null &
load=$!
sleep 4
stop_node graceful KILL
wait "$load" || true
read -r node took < <(ready_seconds crashed "$data")
grep 'committing again' "$work/crashed.out" "$work/crashed.err" | grep -o 'shard=[0-9]* records=[0-9]*' || echo 'WAL: nothing above its checkpoint'
echo "restart after SIGKILL: ready in $took s, anonymous memory $(rss_mb crashed) MB"
messages=$(held "$node" backlog)
stop_node crashed

echo "== 3. consume the backlog from disk ($messages messages)"
echo "page cache: $(drop_cache)"
mapfile -t segments < <(find "$data" -name "*.seg" -size +1M)
read_mb=0
begin=$(date +%s.%N)
for s in "${segments[@]:0:20}"; do
  dd if="$s" of=/dev/null bs=1M iflag=direct status=none
  read_mb=$((read_mb + $(du -m "$s" | cut -f1)))
done
secs=$(echo "$(date +%s.%N) - $begin" | bc)
echo "disk sequential read (dd bs=1M O_DIRECT, $read_mb MB): $(echo "$read_mb / $secs" | bc) MB/s"
echo "page cache: $(drop_cache)"
read -r node took < <(ready_seconds drain "$data")
"$narad_bench" drain --server "http://$node" --topic backlog \
  --messages "$messages" --consumers 8 --no-fill
echo "anonymous memory after the drain: $(rss_mb drain) MB"
stop_node drain
rm -rf "$data"

echo "== 4. $topics topics of $per_topic partitions"
many="$work/many"
node=$(start_node many "$many")
rss_empty=$(rss_mb many)
for t in $(seq 1 "$topics"); do
  curl -sf -X PUT "http://$node/v1/topics/many-$t" -d "{\"partitions\": $per_topic}" >/dev/null
done
loads=()
for t in $(seq 1 "$topics"); do
  "$narad_bench" produce --server "http://$node" --topic "many-$t" \
    --connections $((64 / topics + 1)) --seconds 10 >"$work/many-$t.txt" &
  loads+=($!)
done
wait "${loads[@]}"
total=$(cat "$work"/many-*.txt | grep -o '[0-9]* msg/s' | awk '{s+=$1} END {print s}')
echo "produce into $((topics * per_topic)) partitions: $total msg/s across $topics producers"
echo "disk: $(mb "$many") MB; anonymous memory: $rss_empty MB empty, $(rss_mb many) MB after the run"
stop_node many
read -r node took < <(ready_seconds many2 "$many")
rss_closed=$(rss_mb many2)
echo "restart: ready in $took s, anonymous memory $rss_closed MB (no partition open)"
python3 - "$node" "$topics" "$per_topic" <<'EOF'
import http.client, json, sys
host, topics, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
c = http.client.HTTPConnection(host)
for t in range(1, topics + 1):
    for p in range(per):
        body = json.dumps({"partition": p, "wait_ms": 0, "max_messages": 1, "visibility_timeout_ms": 1000})
        c.request("POST", f"/v1/topics/many-{t}/consume", body, {"Content-Type": "application/json"})
        r = c.getresponse(); r.read()
        if r.status != 200:
            sys.exit(f"consume many-{t}/{p}: {r.status}")
EOF
rss_open=$(rss_mb many2)
echo "after one consume on every partition: $rss_open MB," \
  "$(( (rss_open - rss_closed) * 1024 / (topics * per_topic) )) KiB per open partition"
stop_node many2
