"""Produces COUNT messages with aiokafka (idempotent, gzip). Prints one
JSON line: delivered, errors."""
import asyncio
import json
import sys

from aiokafka import AIOKafkaProducer


async def main(addr, topic, prefix, count):
    producer = AIOKafkaProducer(bootstrap_servers=addr, enable_idempotence=True,
                                compression_type="gzip")
    await producer.start()
    errors = []
    delivered = 0
    try:
        sent = [
            await producer.send(topic, key=f"{prefix}-{i}".encode(),
                                value=f"{prefix} value {i}".encode())
            for i in range(count)
        ]
        for result in await asyncio.gather(*sent, return_exceptions=True):
            if isinstance(result, Exception):
                errors.append(str(result))
            else:
                delivered += 1
    finally:
        await producer.stop()
    print(json.dumps({"delivered": delivered, "errors": errors[:5]}))


asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
