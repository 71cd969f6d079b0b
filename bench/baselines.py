"""The raw baselines the benchmarks compare the client against: the generated gRPC stubs and
nats-py with the codec, with no client around them. Values are :data:`VALUE` (100 bytes).

``run.py`` and ``client_bench.py`` both import from here (neither imports the other).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc

from airflow_provider_liftbridge import codec, nats_adapter
from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc

VALUE = b"x" * 100


def raw_unary(address: str, stream: str, n: int) -> int:
    """Baseline: generated stub ``Publish`` with a deadline (so the server waits for the ack)."""
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        for i in range(n):
            stub.Publish(api_pb2.PublishRequest(stream=stream, value=VALUE, correlationId=str(i)), timeout=10)
    return n


async def raw_nats_envelopes(url: str, subject: str, n: int, window: int) -> int:
    """Baseline: nats-py and the codec with no client around them: build each envelope (CRC on),
    publish it, decode every ack on one ack inbox, at most ``window`` unacknowledged."""
    nc = await nats_adapter.connect(url, pending_size=64 * 1024 * 1024)
    inbox = nc.new_inbox()
    acked = 0
    room = asyncio.Event()
    done = asyncio.Event()

    async def on_ack(msg: Any) -> None:
        nonlocal acked
        ack = codec.unmarshal_ack(msg.data)
        if ack.ackError:
            raise RuntimeError(f"ack error {ack.ackError}")
        acked += 1
        room.set()
        if acked == n:
            done.set()

    await nc.subscribe(inbox, cb=on_ack, pending_msgs_limit=1 << 20)
    for i in range(n):
        await nc.publish(subject, codec.new_message(VALUE, ack_inbox=inbox, correlation_id=str(i)))
        while i + 1 - acked >= window:
            room.clear()
            await room.wait()
    await asyncio.wait_for(done.wait(), 120)
    await nc.close()
    return acked


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
    """The baseline: generated stub, Subscribe from the earliest message to offset ``n - 1``."""
    with grpc.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        req = api_pb2.SubscribeRequest(
            stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_OFFSET, stopOffset=n - 1
        )
        got = 0
        try:
            for msg in stub.Subscribe(req):
                got += msg.ByteSize() > 0
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        return got
