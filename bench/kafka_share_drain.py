"""Share-consumer drain for bench/run-kafka-drain.sh: CONSUMERS processes,
each a librdkafka ShareConsumer (confluent-kafka) in one share group,
accept (explicit acknowledgement) every record of TOPIC until COUNT
records were taken in all, or nothing came for 10 s. Prints one line:
records accepted, seconds from the first poll to the last record, and
records per second.

Usage: python3 bench/kafka_share_drain.py ADDR TOPIC COUNT [CONSUMERS]
"""
import multiprocessing as mp
import sys
import time

from confluent_kafka import ShareConsumer

IDLE_SECONDS = 10.0


def drain(addr, topic, count, taken, last_at):
    consumer = ShareConsumer({
        "bootstrap.servers": addr,
        "group.id": "drain",
        "share.acknowledgement.mode": "explicit",
        "log_level": 3,
    })
    consumer.subscribe([topic])
    idle_since = time.monotonic()
    while taken.value < count and time.monotonic() - idle_since < IDLE_SECONDS:
        messages = consumer.poll(0.2)
        got = 0
        for message in messages:
            if message.error():
                continue
            consumer.acknowledge(message)
            got += 1
        if got:
            idle_since = time.monotonic()
            with taken.get_lock():
                taken.value += got
            with last_at.get_lock():
                last_at.value = time.monotonic()
    consumer.close()


def main():
    addr, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    consumers = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    taken = mp.Value("q", 0)
    last_at = mp.Value("d", 0.0)
    start = time.monotonic()
    workers = [mp.Process(target=drain, args=(addr, topic, count, taken, last_at))
               for _ in range(consumers)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = max(last_at.value - start, 1e-9)
    print(f"accepted {taken.value} in {elapsed:.2f} s: {taken.value / elapsed:.0f} msg/s")


if __name__ == "__main__":
    main()
