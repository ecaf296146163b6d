"""An idempotent librdkafka producer (acks=all, message.timeout.ms=2000)
through a paused node, in three phases that the test paces over stdin and
stdout: BEFORE records, flushed ("paused?" is printed: the test pauses the
node); DURING records sent into the pause and left to time out on the
client, which then bumps its epoch locally and starts its sequences at 0
again ("resumed?" once all have a report: the test resumes the node and
answers a line); AFTER records. Keys PREFIX-i. Prints one JSON line: the
keys reported stored, the errors of each phase, and librdkafka's log lines
about the epoch."""
import json
import sys

from confluent_kafka import Producer

addr, topic, prefix, before, during, after = sys.argv[1:7]
logs = []


class Log:
    def log(self, level, message, *args):
        text = message % args if args else str(message)
        if "poch" in text:
            logs.append(text)

    # logging.Logger's other calls, should librdkafka make them.
    def __getattr__(self, name):
        return lambda *a, **k: None


producer = Producer({
    "bootstrap.servers": addr,
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "message.timeout.ms": 2000,
    "debug": "eos",
}, logger=Log())
stored = []
errors = {"before": 0, "during": 0, "after": 0}
phase = "before"


def on_delivery(error, message):
    if error is not None:
        errors[phase] += 1
    else:
        stored.append(message.key().decode())


def send(start, count):
    for i in range(start, start + count):
        while True:
            try:
                producer.produce(topic, key=f"{prefix}-{i}", value=f"{prefix} value {i}",
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)


def say(line):
    print(line, flush=True)


before, during, after = int(before), int(during), int(after)
send(0, before)
producer.flush(60)
say("paused?")
sys.stdin.readline()
phase = "during"
send(before, during)
# Every record of the pause gets its report (a timeout) before the node
# comes back.
producer.flush(30)
say("resumed?")
sys.stdin.readline()
phase = "after"
send(before + during, after)
left = producer.flush(60)
print(json.dumps({"stored": stored, "errors": errors, "undelivered": left,
                  "epoch_logs": logs[-5:]}))
