"""A librdkafka client (confluent-kafka) over SASL_SSL with PLAIN, as USER
with PASSWORD, trusting the CA in CA_FILE, for the Kafka listener's auth
tests. MODE is one of:
  produce TOPIC COUNT   an idempotent producer (acks=all) sends COUNT messages
  create TOPIC          the admin client creates TOPIC with 2 partitions
  share TOPIC COUNT     a share consumer (group "auth") accepts records
                        until it has COUNT, or nothing came for 5 s
Prints one JSON line: delivered (or seen) and the errors the client
reported (delivery errors, and errors raised on the connection)."""
import json
import sys
import time

from confluent_kafka import KafkaException, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, NewTopic

mode, addr, ca_file, user, password, topic = sys.argv[1:7]
count = int(sys.argv[7]) if len(sys.argv) > 7 else 0
errors = []


def on_error(error):
    errors.append(str(error))


common = {
    "bootstrap.servers": addr,
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "PLAIN",
    "sasl.username": user,
    "sasl.password": password,
    "ssl.ca.location": ca_file,
    "error_cb": on_error,
}

if mode == "produce":
    delivered = 0

    def on_delivery(error, message):
        global delivered
        if error is not None:
            errors.append(str(error))
        else:
            delivered += 1

    producer = Producer({**common, "acks": "all", "enable.idempotence": True,
                         "message.timeout.ms": 8000})
    for i in range(count):
        producer.produce(topic, key=f"{user}-{i}", value=f"{user} value {i}",
                         on_delivery=on_delivery)
    producer.flush(30)
    print(json.dumps({"delivered": delivered, "errors": errors[:5]}))
elif mode == "create":
    admin = AdminClient(common)
    created = admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)],
                                  request_timeout=10)
    try:
        created[topic].result(15)
        print(json.dumps({"created": True, "errors": errors[:5]}))
    except KafkaException as error:
        errors.append(str(error.args[0]))
        print(json.dumps({"created": False, "errors": errors[:5]}))
elif mode == "share":
    consumer = ShareConsumer({**common, "group.id": "auth"})
    consumer.subscribe([topic])
    seen = 0
    start = last = time.monotonic()
    while seen < count and time.monotonic() - last < 5 and time.monotonic() - start < 30:
        try:
            messages = consumer.poll(0.5)
        except KafkaException as error:
            errors.append(str(error.args[0]))
            break
        for message in messages:
            if message.error():
                errors.append(str(message.error()))
                continue
            last = time.monotonic()
            seen += 1
    consumer.close()
    print(json.dumps({"seen": seen, "errors": errors[:5]}))
else:
    sys.exit(f"unknown mode {mode}")
