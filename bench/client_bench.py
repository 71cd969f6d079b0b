"""Client throughput and CPU cost against a dev server in its own process.

Prints, in one run: sync publish, pipelined publish (sync and asyncio clients) and subscribe in
messages per second and client CPU seconds per 10,000 messages (``time.process_time`` of this
process; the server runs in a ``DevServerProcess`` so it does not share our GIL), next to a raw
generated-stub baseline (``APIStub.PublishAsync`` with a window of 256, raw ``Subscribe``).
Values are 100 bytes.

    .venv/bin/python bench/client_bench.py [--messages 20000] [--single 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc
from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient, StopPosition
from airflow_provider_liftbridge.devserver import DevServerProcess

VALUE = b"x" * 100


def measure(fn: Callable[[], int]) -> tuple[float, float, int]:
    """Run ``fn`` (returns the message count); wall seconds, CPU seconds, count."""
    wall, cpu = time.perf_counter(), time.process_time()
    n = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, n


def raw_publish_async(address: str, stream: str, n: int, window: int = 256) -> int:
    """The baseline: generated stub, PublishAsync, ``window`` requests in flight."""
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        room = threading.Semaphore(window)
        requests: queue.Queue[api_pb2.PublishRequest | None] = queue.Queue()

        def gen() -> Iterator[api_pb2.PublishRequest]:
            while (req := requests.get()) is not None:
                yield req

        call = stub.PublishAsync(gen())

        def feed() -> None:
            for i in range(n):
                room.acquire()
                requests.put(
                    api_pb2.PublishRequest(stream=stream, value=VALUE, correlationId=str(i), expectedOffset=-1)
                )

        feeder = threading.Thread(target=feed)
        feeder.start()
        got = 0
        for _ in call:
            got += 1
            room.release()
            if got == n:
                break
        requests.put(None)
        call.cancel()
        feeder.join()
        return got


def raw_subscribe(address: str, stream: str, n: int) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        req = api_pb2.SubscribeRequest(stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST)
        got = 0
        try:
            for msg in stub.Subscribe(req):
                got += msg.ByteSize() > 0
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per pipelined/subscribe run")
    parser.add_argument("--single", type=int, default=2_000, help="messages for one-at-a-time publish")
    args = parser.parse_args()
    n, single = args.messages, args.single
    rows: list[tuple[str, float, float, int]] = []

    with tempfile.TemporaryDirectory() as data, DevServerProcess(data_dir=data) as srv:
        address = srv.address
        with LiftbridgeClient(address, timeout=30.0) as c:
            for s in ("raw", "single", "many", "amany"):
                c.create_stream(s, s)

            rows.append(("raw stub PublishAsync (window 256)", *measure(lambda: raw_publish_async(address, "raw", n))))
            rows.append(("client.publish (one at a time)",
                         *measure(lambda: sum(1 for _ in range(single) if c.publish("single", VALUE)))))  # fmt: skip
            rows.append(("client.publish_many (window 256)",
                         *measure(lambda: len(c.publish_many("many", [VALUE] * n, window=256)))))  # fmt: skip

            async def amany() -> int:
                async with AsyncLiftbridgeClient(address, timeout=30.0) as ac:
                    return len(await ac.publish_many("amany", [VALUE] * n, window=256))

            rows.append(("async publish_many (window 256)", *measure(lambda: asyncio.run(amany()))))
            rows.append(("raw stub Subscribe", *measure(lambda: raw_subscribe(address, "many", n))))
            latest = StopPosition.LATEST
            rows.append(("client.subscribe", *measure(lambda: sum(1 for _ in c.subscribe("many", stop_at=latest)))))

            async def asub() -> int:
                async with AsyncLiftbridgeClient(address) as ac:
                    return len([m async for m in ac.subscribe("many", stop_at=StopPosition.LATEST)])

            rows.append(("async subscribe", *measure(lambda: asyncio.run(asub()))))

    print(f"{'path':<38} {'msgs':>7} {'msgs/s':>9} {'CPU s / 10k msgs':>17}")
    for name, wall, cpu, count in rows:
        print(f"{name:<38} {count:>7} {count / wall:>9,.0f} {cpu / count * 10_000:>17.2f}")


if __name__ == "__main__":
    main()
