"""Throughput of the dev server: Publish, PublishAsync, Subscribe and NATS enveloped ingest with acks.

The server runs in its own process (``DevServerProcess``) so it does not share the GIL with the
load generator in this one. Values are 100 bytes; one run per path; a markdown table goes to stdout.

    .venv/bin/python bench/devserver_bench.py [--messages 50000] [--publish-messages 3000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator

import grpc
import nats

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message
from airflow_provider_liftbridge.devserver import DevServerProcess

VALUE = b"x" * 100


def _identity(b: bytes) -> bytes:
    return b


def bench_publish(stub: api_pb2_grpc.APIStub, stream: str, n: int) -> float:
    """Sequential Publish calls, each waiting for its LEADER ack."""
    req = pb.PublishRequest(stream=stream, value=VALUE)
    start = time.perf_counter()
    for _ in range(n):
        stub.Publish(req, timeout=10)
    return time.perf_counter() - start


def bench_publish_async(channel: grpc.Channel, stream: str, n: int) -> float:
    """One PublishAsync stream; requests pre-serialized so the client spends little per message."""
    call = channel.stream_stream(
        "/proto.API/PublishAsync", request_serializer=_identity, response_deserializer=_identity
    )
    reqs = [pb.PublishRequest(stream=stream, value=VALUE, correlationId=str(i)).SerializeToString() for i in range(n)]

    def gen() -> Iterator[bytes]:
        yield from reqs

    start = time.perf_counter()
    count = sum(1 for _ in call(gen(), timeout=600))
    elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"PublishAsync returned {count} responses for {n} requests")
    return elapsed


def bench_subscribe(channel: grpc.Channel, stream: str, n: int) -> float:
    """Read ``n`` stored messages from EARLIEST (raw bytes, not parsed)."""
    call = channel.unary_stream("/proto.API/Subscribe", request_serializer=_identity, response_deserializer=_identity)
    req = pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_OFFSET, stopOffset=n - 1)
    start = time.perf_counter()
    count = -1  # the handshake
    try:
        for _ in call(req.SerializeToString(), timeout=600):
            count += 1
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
    elapsed = time.perf_counter() - start
    if count != n:
        raise RuntimeError(f"Subscribe delivered {count} messages, expected {n}")
    return elapsed


async def bench_nats(nats_url: str, subject: str, n: int) -> float:
    """Enveloped publishes straight to the stream's NATS subject; time until every ack is back."""
    nc = await nats.connect(nats_url, pending_size=64 * 1024 * 1024)
    inbox = nc.new_inbox()
    done = asyncio.Event()
    acks = 0

    async def on_ack(_msg: object) -> None:
        nonlocal acks
        acks += 1
        if acks == n:
            done.set()

    await nc.subscribe(inbox, cb=on_ack, pending_msgs_limit=n + 10)
    payloads = [new_message(VALUE, ack_inbox=inbox, correlation_id=str(i)) for i in range(n)]
    window = 5000
    start = time.perf_counter()
    for i, payload in enumerate(payloads):
        await nc.publish(subject, payload)
        if i % 500 == 499:
            while i + 1 - acks > window:  # bounded in-flight, like a real publisher
                await asyncio.sleep(0.0005)
    await asyncio.wait_for(done.wait(), 600)
    elapsed = time.perf_counter() - start
    await nc.close()
    return elapsed


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {sys.version.split()[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000, help="messages for PublishAsync, Subscribe, NATS")
    parser.add_argument("--publish-messages", type=int, default=3_000, help="messages for sequential Publish")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data) as server:
        channel = grpc.insecure_channel(server.address)
        stub = api_pb2_grpc.APIStub(channel)
        for name in ("pub", "async", "nats"):
            stub.CreateStream(pb.CreateStreamRequest(subject=f"bench.{name}", name=name), timeout=10)
        n, p = args.messages, args.publish_messages
        rows.append(("Publish (sequential, LEADER ack)", p, bench_publish(stub, "pub", p)))
        rows.append(("PublishAsync (one stream, LEADER acks)", n, bench_publish_async(channel, "async", n)))
        rows.append(("Subscribe (EARLIEST, stored messages)", n, bench_subscribe(channel, "async", n)))
        rows.append(
            ("NATS enveloped publish + acks on inbox", n, asyncio.run(bench_nats(server.nats_url, "bench.nats", n)))
        )
        channel.close()
    print(f"Dev server throughput, 100-byte values, one run. Machine: {machine()}.\n")
    print("| path | messages | seconds | msgs/s |")
    print("|---|---:|---:|---:|")
    for name, count, secs in rows:
        print(f"| {name} | {count:,} | {secs:.2f} | {count / secs:,.0f} |")


if __name__ == "__main__":
    main()
