"""Kafka produce load for bench/run-kafka-bench.sh: one librdkafka producer
(confluent-kafka) sending MESSAGE_BYTES-byte values to TOPIC for SECONDS
seconds, acks=all, as fast as the node takes them (librdkafka batches per
partition and keeps up to 5 requests in flight per connection). Prints one
line: messages delivered per second, and errors.

Usage: python3 bench/kafka_produce.py ADDR TOPIC SECONDS [MESSAGE_BYTES] [IDEMPOTENT]
"""
import sys
import time

from confluent_kafka import Producer

addr, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
size = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
idempotent = len(sys.argv) > 5 and sys.argv[5] == "idempotent"
producer = Producer({
    "bootstrap.servers": addr,
    "acks": "all",
    "enable.idempotence": idempotent,
    "linger.ms": 5,
    "batch.size": 1000000,
    "queue.buffering.max.messages": 200000,
    "partitioner": "murmur2_random",
})
value = b"x" * size
delivered = 0
errors = 0


def on_delivery(error, _message):
    global delivered, errors
    if error is None:
        delivered += 1
    else:
        errors += 1


start = time.monotonic()
end = start + seconds
while time.monotonic() < end:
    for _ in range(1000):
        try:
            producer.produce(topic, value, on_delivery=on_delivery)
        except BufferError:
            producer.poll(0.001)
            break
    producer.poll(0)
producer.flush(60)
elapsed = time.monotonic() - start
print(f"kafka produce: {delivered / elapsed:.0f} msg/s  delivered {delivered}  errors {errors}")
