"""Child process of ``bench/run.py``: one gufo-liftbridge baseline, measured like every other run.

gufo-liftbridge ships its own generated ``proto`` package, which cannot share the default protobuf
descriptor pool with this project's stubs ("duplicate symbol 'proto.StartPosition'"), so it runs
in an interpreter that never imports the project's stubs.

    python bench/_gufo_worker.py publish|subscribe ADDRESS STREAM N SERVER_PID

Prints one JSON object: the fields of ``run.Run``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import psutil
from _measure import cpu_seconds
from gufo.liftbridge.client import LiftbridgeClient
from gufo.liftbridge.types import StartPosition

VALUE = b"x" * 100


async def publish_bulk(address: str, stream: str, n: int) -> int:
    """gufo's ``publish_bulk`` (PublishAsync), stopping at the last ack."""
    async with LiftbridgeClient([address]) as gufo:
        requests = (gufo.get_publish_request(VALUE, stream=stream, correlation_id=str(i)) for i in range(n))
        got = 0
        async for _ in gufo.publish_bulk(requests):
            got += 1
            if got == n:
                break
    return got


async def subscribe(address: str, stream: str, n: int) -> int:
    """gufo's ``subscribe`` from the earliest message, stopping after ``n`` (it has no stop position)."""
    async with LiftbridgeClient([address]) as gufo:
        got = 0
        async for _ in gufo.subscribe(stream, partition=0, start_position=StartPosition.EARLIEST):
            got += 1
            if got == n:
                break
    return got


def main() -> None:
    mode, address, stream, n, pid = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    fn = {"publish": publish_bulk, "subscribe": subscribe}[mode]
    server = [psutil.Process(pid)] if pid else []
    nats = [p for p in server[0].children(recursive=True) if "nats" in p.name()] if server else []
    s0, n0, c0, w0 = cpu_seconds(server), cpu_seconds(nats), time.process_time(), time.perf_counter()
    count = asyncio.run(fn(address, stream, n))
    wall = time.perf_counter() - w0
    c1, s1, n1 = time.process_time(), cpu_seconds(server), cpu_seconds(nats)
    print(
        json.dumps(
            {
                "count": count,
                "wall": wall,
                "client_cpu": c1 - c0,
                "server_cpu": s1 - s0,
                "nats_cpu": n1 - n0,
                "load1": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
