"""Produces COUNT messages with kafka-python (idempotent by default).
Prints one JSON line: delivered, errors."""
import json
import sys

from kafka import KafkaProducer

addr, topic, prefix, count = sys.argv[1:5]
producer = KafkaProducer(bootstrap_servers=addr, acks="all")
futures = [
    producer.send(topic, key=f"{prefix}-{i}".encode(), value=f"{prefix} value {i}".encode())
    for i in range(int(count))
]
producer.flush(90)
errors = [str(f.exception) for f in futures if f.failed()]
delivered = sum(1 for f in futures if f.succeeded())
producer.close()
print(json.dumps({"delivered": delivered, "errors": errors[:5]}))
