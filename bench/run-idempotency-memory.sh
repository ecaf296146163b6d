#!/usr/bin/env bash
# What idempotency keys cost in memory: two fresh single-shard nodes each
# take the same 100,000 messages of 100 bytes in batches of 1,000, one
# without idempotency keys and one with a 36-character key per message;
# the difference of the nodes' resident memory (VmRSS), divided by the
# keys, is the bytes a key costs while its window lasts (the node's table
# and the WAL's index of keys together).
#
# Usage: bench/run-idempotency-memory.sh [BIN] [MESSAGES]
#   BIN: a `narad` binary (default target/release/narad).
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/narad}"
messages="${2:-100000}"
work="$(mktemp -d)"
cleanup() {
  local pids=()
  for f in "$work"/*.pid; do [[ -e $f ]] && pids+=("$(cat "$f")"); done
  stop_all "${pids[@]}"
  rm -rf "$work"
}
trap cleanup EXIT
. bench/lib.sh

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

measure() { # name keyed: prints the node's RSS growth in KiB
  local name=$1 keyed=$2
  "$bin" serve --data-dir "$work/$name" --listen 127.0.0.1:0 --shards 1 \
    >"$work/$name.out" 2>"$work/$name.err" &
  local pid=$!
  echo $pid >"$work/$name.pid"
  local address
  address=$(address_of "$name")
  curl -sf -X PUT "http://$address/v1/topics/t" -d '{"partitions": 4}' >/dev/null
  local before
  before=$(rss_kib "$pid")
  python3 - "$address" "$messages" "$keyed" <<'EOF'
import json, sys, urllib.request, uuid
address, messages, keyed = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
value = "v" * 100
for start in range(0, messages, 1000):
    items = []
    for i in range(start, min(start + 1000, messages)):
        item = {"value": value}
        if keyed:
            item["idempotency_key"] = str(uuid.UUID(int=i))
        items.append(item)
    request = urllib.request.Request(
        f"http://{address}/v1/topics/t/messages/batch",
        data=json.dumps({"messages": items}).encode(), method="POST")
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 202, answer.status
EOF
  local after
  after=$(rss_kib "$pid")
  stop_all "$pid"
  rm -f "$work/$name.pid"
  echo $((after - before))
}

plain=$(measure plain 0)
keyed=$(measure keyed 1)
echo "RSS growth over $messages messages: without keys ${plain} KiB, with keys ${keyed} KiB"
echo "per key: $(((keyed - plain) * 1024 / messages)) bytes"
