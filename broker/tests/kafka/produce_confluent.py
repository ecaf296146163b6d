"""Produces COUNT messages with librdkafka (confluent-kafka): an idempotent
producer, acks=all, in the codec asked for, at most PER_SECOND a second if
given. Keys PREFIX-i, values "PREFIX value i". Prints one JSON line:
delivered (a count), errors, keys (those the node said it stored), and
longest_gap_s: the longest wait between two successful reports of one
partition while the producer was sending."""
import json
import sys
import time

from confluent_kafka import Producer

addr, topic, prefix, count, codec = sys.argv[1:6]
per_second = float(sys.argv[6]) if len(sys.argv) > 6 else 0
producer = Producer({
    "bootstrap.servers": addr,
    "enable.idempotence": True,
    "acks": "all",
    "compression.type": codec,
    "linger.ms": 5,
    "message.timeout.ms": 60000,
})
delivered = 0
errors = []
keys = []
last_report = {}
longest_gap = 0.0


def on_delivery(error, message):
    global delivered, longest_gap
    if error is not None:
        errors.append(str(error))
    else:
        delivered += 1
        keys.append(message.key().decode())
        now = time.monotonic()
        before = last_report.get(message.partition())
        if before is not None:
            longest_gap = max(longest_gap, now - before)
        last_report[message.partition()] = now


start = time.monotonic()
for i in range(int(count)):
    if per_second:
        ahead = i / per_second - (time.monotonic() - start)
        if ahead > 0:
            producer.poll(ahead)
    while True:
        try:
            producer.produce(topic, key=f"{prefix}-{i}", value=f"{prefix} value {i}",
                             on_delivery=on_delivery)
            break
        except BufferError:
            producer.poll(0.1)
    producer.poll(0)
left = producer.flush(90)
print(json.dumps({"delivered": delivered, "errors": errors[:5], "undelivered": left,
                  "keys": keys, "longest_gap_s": round(longest_gap, 2)}))
