"""Creates a topic with librdkafka's admin client (confluent-kafka).
Prints one JSON line: created, error."""
import json
import sys

from confluent_kafka.admin import AdminClient, NewTopic

addr, topic, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3])
admin = AdminClient({"bootstrap.servers": addr})
futures = admin.create_topics([NewTopic(topic, partitions, 1, config={"retention.ms": "-1"})])
try:
    futures[topic].result(30)
    print(json.dumps({"created": True, "error": None}))
except Exception as error:  # the test prints what went wrong
    print(json.dumps({"created": False, "error": str(error)}))
