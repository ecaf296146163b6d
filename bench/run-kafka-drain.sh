#!/usr/bin/env bash
# Share-consumer drain against HTTP consume + ack on the same node, taking
# turns: for each round and side, a fresh node (release build, a Kafka
# listener, topic bench x16) filled with HTTP batch produce for FILL_SECONDS,
# then drained to empty either by `narad-bench drain --no-fill` (long polls
# of 100, batch acks, CONSUMERS connections) or by CONSUMERS librdkafka share
# consumers in one group (bench/kafka_share_drain.py, explicit ACCEPT of
# every record). Prints each run's rate and the node's CPU time per message,
# then the medians and the ratio Kafka / HTTP.
#
# Usage: bench/run-kafka-drain.sh [FILL_SECONDS] [ROUNDS] [SHARDS] [CONSUMERS]
# Needs confluent-kafka (ops/install-check-tools.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
fill="${1:-5}"
rounds="${2:-3}"
shards="${3:-2}"
consumers="${4:-4}"
cargo build --release -p narad-broker -p narad-bench >/dev/null
. bench/lib.sh
bench_work

hz=$(getconf CLK_TCK)
results="$work/results.tsv"
run=0
for round in $(seq 1 "$rounds"); do
  for side in http kafka; do
    run=$((run + 1))
    name="run$run"
    kafka_node "$name" "$shards"
    target/release/narad-bench produce --server "http://$node" --topic bench \
      --seconds "$fill" --connections 64 --batch 100 --message-bytes 1024 >/dev/null
    filled=$(held "$node" bench)
    before=$(ticks "$pid")
    if [[ $side == http ]]; then
      line=$(target/release/narad-bench drain --server "http://$node" --topic bench \
        --no-fill --messages "$filled" --consumers "$consumers")
      rate=$(echo "$line" | awk '{for (i = 1; i <= NF; i++) if ($(i+1) == "msg/s") print $i}')
    else
      line=$(python3 bench/kafka_share_drain.py "$kafka" bench "$filled" "$consumers")
      rate=$(echo "$line" | awk '{for (i = 1; i <= NF; i++) if ($(i+1) == "msg/s") print $i}')
    fi
    after=$(ticks "$pid")
    cpu_us=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$filled" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "-" }')
    echo "round $round $side: $filled messages, $rate msg/s, CPU $cpu_us us/msg ($line)"
    printf '%s\t%s\t%s\n' "$side" "$rate" "$cpu_us" >>"$results"
    stop_all "$pid"
  done
done
http_rate=$(awk -F'\t' '$1 == "http" {print $2}' "$results" | median)
kafka_rate=$(awk -F'\t' '$1 == "kafka" {print $2}' "$results" | median)
http_cpu=$(awk -F'\t' '$1 == "http" {print $3}' "$results" | median)
kafka_cpu=$(awk -F'\t' '$1 == "kafka" {print $3}' "$results" | median)
echo "medians of $rounds: HTTP consume+ack $http_rate msg/s ($http_cpu us/msg), Kafka share consumers $kafka_rate msg/s ($kafka_cpu us/msg), Kafka/HTTP $(awk -v k="$kafka_rate" -v h="$http_rate" 'BEGIN { printf "%.2f", k / h }')x"
