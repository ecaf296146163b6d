#!/usr/bin/env bash
# Kafka produce against HTTP batch produce on the same node, taking turns:
# for each round, a fresh node (release build, a Kafka listener, topic bench
# x16), then HTTP batch produce (`narad-bench produce --batch 100
# --connections 64`) for SECONDS, then a librdkafka producer
# (bench/kafka_produce.py, acks=all) for SECONDS, each on its own fresh node.
# Prints each run's rate and the node's CPU time per message, then the
# medians and the ratio Kafka / HTTP.
#
# Usage: bench/run-kafka-bench.sh [SECONDS] [ROUNDS] [SHARDS] [MESSAGE_BYTES]
# Needs confluent-kafka (ops/install-check-tools.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-15}"
rounds="${2:-3}"
shards="${3:-2}"
size="${4:-1024}"
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
    before=$(ticks "$pid")
    if [[ $side == http ]]; then
      line=$(target/release/narad-bench produce --server "http://$node" --topic bench \
        --seconds "$seconds" --connections 64 --batch 100 --message-bytes "$size")
      rate=$(echo "$line" | awk '{for (i = 1; i <= NF; i++) if ($(i+1) == "msg/s") print $i}')
    else
      line=$(python3 bench/kafka_produce.py "$kafka" bench "$seconds" "$size")
      rate=$(echo "$line" | awk '{print $3}')
    fi
    held_now=$(held "$node" bench)
    after=$(ticks "$pid")
    cpu_us=$(awk -v t=$((after - before)) -v hz="$hz" -v n="$held_now" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "-" }')
    echo "round $round $side: $rate msg/s, CPU $cpu_us us/msg ($line)"
    printf '%s\t%s\t%s\n' "$side" "$rate" "$cpu_us" >>"$results"
    stop_all "$pid"
  done
done
http_rate=$(awk -F'\t' '$1 == "http" {print $2}' "$results" | median)
kafka_rate=$(awk -F'\t' '$1 == "kafka" {print $2}' "$results" | median)
http_cpu=$(awk -F'\t' '$1 == "http" {print $3}' "$results" | median)
kafka_cpu=$(awk -F'\t' '$1 == "kafka" {print $3}' "$results" | median)
echo "medians of $rounds: HTTP batch $http_rate msg/s ($http_cpu us/msg), Kafka $kafka_rate msg/s ($kafka_cpu us/msg), Kafka/HTTP $(awk -v k="$kafka_rate" -v h="$http_rate" 'BEGIN { printf "%.2f", k / h }')x"
