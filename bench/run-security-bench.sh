#!/usr/bin/env bash
# What authentication and schemas cost on the produce path, on one machine,
# in turns. Usage: bench/run-security-bench.sh [SECONDS_PER_RUN] [ROUNDS] [SHARDS]
#
# - auth: two nodes, one with auth.enabled (a bearer token; Basic is cached
#   the same way after its first check) and one without; single produces of
#   1 KiB at 64 connections, the two taking turns for ROUNDS rounds.
# - schema: one node, a topic with bench/schemas/order.json and one without;
#   single produces of a 1 KiB JSON order at 64 connections, in turns.
# Prints every run and the median of each side. Starts only what it stops.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
rounds="${2:-3}"
shards="${3:-$(nproc)}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

start() { # name, extra flags...
  local name="$1"; shift
  target/release/narad serve --data-dir "$work/$name" --listen 127.0.0.1:0 --shards "$shards" \
    --set storage.wal_ring_bytes=268435456 "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pids+=($!)
}
msgs() { grep -o '[0-9]* msg/s' | awk '{print $1}'; }
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

start open
start secured --set auth.enabled=true --set auth.admin_password=bench-admin
open=$(address_of open)
secured=$(address_of secured)
admin=(-u admin:bench-admin)
for _ in $(seq 1 100); do
  curl -sf "${admin[@]}" "http://$secured/v1/topics" >/dev/null && break
  sleep 0.1
done
curl -sf -X PUT "http://$open/v1/topics/bench" -d '{"partitions": 16}' >/dev/null
curl -sf "${admin[@]}" -X PUT "http://$secured/v1/topics/bench" -d '{"partitions": 16}' >/dev/null
curl -sf "${admin[@]}" -X PUT "http://$secured/v1/users/producer" -d '{"password": "producer-pw"}' >/dev/null
curl -sf "${admin[@]}" -X PUT "http://$secured/v1/users/producer/grants" \
  -d '{"grants": [{"topic": "bench", "actions": ["produce"]}]}' >/dev/null
token=$(curl -sf "${admin[@]}" -X POST "http://$secured/v1/users/producer/tokens" | sed 's/.*"token":"\([^"]*\)".*/\1/')

echo "== auth: 1 KiB single produces, 64 connections, $seconds s a run, $rounds rounds in turns ($shards shards)"
: >"$work/auth-off"; : >"$work/auth-on"
run_off() { target/release/narad-bench produce --server "http://$open" --topic bench --seconds "$seconds" --connections 64 | msgs; }
run_on() {
  target/release/narad-bench produce --server "http://$secured" --topic bench --seconds "$seconds" --connections 64 \
    --authorization "Bearer $token" | msgs
}
# Turns alternate which side goes first, so neither always runs on a
# machine the other just warmed (or heated).
for round in $(seq 1 "$rounds"); do
  if (( round % 2 )); then off=$(run_off); on=$(run_on); else on=$(run_on); off=$(run_off); fi
  echo "round $round: auth off $off msg/s, auth on $on msg/s"
  echo "$off" >>"$work/auth-off"; echo "$on" >>"$work/auth-on"
done
off=$(median <"$work/auth-off"); on=$(median <"$work/auth-on")
echo "median: auth off $off msg/s, auth on $on msg/s, on/off $(awk "BEGIN {printf \"%.3f\", $on/$off}")"

curl -sf -X PUT "http://$open/v1/schemas/order" --data-binary @bench/schemas/order.json >/dev/null
curl -sf -X PUT "http://$open/v1/topics/typed" -d '{"partitions": 16, "schema": "order"}' >/dev/null
curl -sf -X PUT "http://$open/v1/topics/untyped" -d '{"partitions": 16}' >/dev/null
echo "== schema: 1 KiB JSON orders, single produces, 64 connections, $seconds s a run, $rounds rounds in turns"
: >"$work/plain"; : >"$work/typed"
run_json() { target/release/narad-bench produce --server "http://$open" --topic "$1" --seconds "$seconds" --connections 64 --json | msgs; }
for round in $(seq 1 "$rounds"); do
  if (( round % 2 )); then plain=$(run_json untyped); typed=$(run_json typed); else typed=$(run_json typed); plain=$(run_json untyped); fi
  echo "round $round: without schema $plain msg/s, with schema $typed msg/s"
  echo "$plain" >>"$work/plain"; echo "$typed" >>"$work/typed"
done
plain=$(median <"$work/plain"); typed=$(median <"$work/typed")
echo "median: without schema $plain msg/s, with schema $typed msg/s, with/without $(awk "BEGIN {printf \"%.3f\", $typed/$plain}")"
