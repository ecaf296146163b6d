"""A librdkafka share consumer (confluent-kafka ShareConsumer, KIP-932)
for the Kafka listener's tests. Consumes TOPIC in GROUP until it has seen
--count records in all, or nothing came for --idle seconds, or --seconds
passed. Each record is accepted, or released (--release-every N: every
Nth record seen on its first delivery), or rejected (--reject-every N);
--mode implicit leaves acknowledging to the client (each poll accepts the
last). --vanish-after N: exits without closing (os._exit) once it holds N
records unacknowledged. Prints one JSON line: the records seen, each
[key, value, delivery_count, what was done]."""
import argparse
import json
import os
import time

from confluent_kafka import AcknowledgeType, ShareConsumer

parser = argparse.ArgumentParser()
parser.add_argument("addr")
parser.add_argument("topic")
parser.add_argument("group")
parser.add_argument("--count", type=int, default=0)
parser.add_argument("--idle", type=float, default=5.0)
parser.add_argument("--seconds", type=float, default=60.0)
parser.add_argument("--mode", default="explicit")
parser.add_argument("--release-every", type=int, default=0)
parser.add_argument("--reject-every", type=int, default=0)
parser.add_argument("--vanish-after", type=int, default=0)
args = parser.parse_args()

consumer = ShareConsumer({
    "bootstrap.servers": args.addr,
    "group.id": args.group,
    "share.acknowledgement.mode": args.mode,
})
consumer.subscribe([args.topic])
seen = []
first_seen = 0
start = time.monotonic()
last_record = start
while time.monotonic() - start < args.seconds:
    if args.count and len(seen) >= args.count:
        break
    if time.monotonic() - last_record > args.idle:
        break
    messages = consumer.poll(0.5)
    for message in messages:
        if message.error():
            continue
        last_record = time.monotonic()
        key = message.key().decode() if message.key() is not None else None
        value = message.value().decode()
        count = message.delivery_count()
        if args.vanish_after:
            seen.append([key, value, count, "held"])
            if len(seen) >= args.vanish_after:
                print(json.dumps(seen), flush=True)
                os._exit(0)
            continue
        action = "accept"
        if args.mode == "explicit":
            if count == 1:
                first_seen += 1
            if count == 1 and args.release_every and first_seen % args.release_every == 0:
                action = "release"
                consumer.acknowledge(message, AcknowledgeType.RELEASE)
            elif count == 1 and args.reject_every and first_seen % args.reject_every == 0:
                action = "reject"
                consumer.acknowledge(message, AcknowledgeType.REJECT)
            else:
                consumer.acknowledge(message, AcknowledgeType.ACCEPT)
        seen.append([key, value, count, action])
    if messages and args.mode == "explicit":
        consumer.commit_sync(10)
if args.mode == "implicit":
    # Implicit mode accepts the last poll's records with the next poll
    # (librdkafka's close gives them back instead).
    consumer.poll(0.5)
consumer.close()
print(json.dumps(seen))
