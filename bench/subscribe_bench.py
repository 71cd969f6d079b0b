"""Client CPU per message of a subscription: ours (sync, asyncio with each subscription reader)
beside raw generated stubs and gufo-liftbridge.

    .venv/bin/python bench/subscribe_bench.py [--messages 100000] [--rounds 3] [--only ours-sync,raw-sync]
        [--compare-tree DIR]   # also run the client of another checkout (e.g. `git archive` of a
                               # commit) as old-sync / old-async, against the same server
    variants: gufo, raw-sync, raw-sync-1t, ours-sync, raw-aio, ours-async (the default thread
    reader), ours-async-aio (subscription_reader="aio", as the triggers use)
        [--server-tree DIR]    # run the dev server of another checkout (a fixed server for comparisons)
    .venv/bin/python bench/subscribe_bench.py --layers   # no server: our layers alone

The dev server runs in its own process (``DevServerProcess``); the figure is the client's CPU
time per message (``time.process_time`` of the reading process, all threads, over the run).
It does not depend on the server's speed, but it does on how the server frames its messages
(how many arrive per read), so compare variants of one run, against one server. Variants run
interleaved, ``--rounds`` times; each one's lowest CPU per message is kept (the run least
disturbed by other work on a shared machine), with the median beside it. Values are 100 bytes,
with the two headers the server adds.

``--layers`` feeds prebuilt protobuf messages to the clients' subscribe path through a fake call
(no gRPC, no server): what our layers (operation, transport loop, ``Message`` conversion) cost
per message beyond iterating the responses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc  # noqa: E402
import grpc.experimental  # noqa: E402
from _measure import machine  # noqa: E402
from baselines import raw_subscribe  # noqa: E402
from run import in_child, raw_subscribe_aio  # noqa: E402  (the main table's baselines)

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc  # noqa: E402
from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient  # noqa: E402
from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402

VALUE = b"x" * 100


def raw_subscribe_single_threaded(address: str, stream: str, n: int) -> int:
    """The raw stub on a channel with gRPC's single-threaded server-streaming option (as ours uses)."""
    options = [(grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
    with grpc.insecure_channel(address, options=options) as channel:
        req = api_pb2.SubscribeRequest(
            stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_OFFSET, stopOffset=n - 1
        )
        got = 0
        try:
            for msg in api_pb2_grpc.APIStub(channel).Subscribe(req):
                got += msg.ByteSize() > 0
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        return got


def ours_sync(address: str, stream: str, n: int) -> int:
    with LiftbridgeClient(address) as client:
        return sum(1 for _ in client.subscribe(stream, stop_at=n - 1))


async def _ours_async(address: str, stream: str, n: int, reader: str | None = None) -> int:
    got = 0
    # Only name a reader when asked: a --compare-tree client may predate the option.
    options = {} if reader is None else {"subscription_reader": reader}
    async with AsyncLiftbridgeClient(address, **options) as client:  # type: ignore[arg-type]
        async for _ in client.subscribe(stream, stop_at=n - 1):
            got += 1
    return got


def layers(n: int) -> None:
    """Print our layers' CPU per message over a fake call of ``n`` prebuilt messages."""
    from airflow_provider_liftbridge.client import AckPolicy, subscription
    from airflow_provider_liftbridge.client.routing import ClientCore
    from airflow_provider_liftbridge.client.settings import ConnectionSettings
    from airflow_provider_liftbridge.client.transport import aio as async_client
    from airflow_provider_liftbridge.client.transport import sync as sync_client
    from airflow_provider_liftbridge.client.types import BrokerInfo, Metadata, PartitionInfo, StreamInfo

    responses = [api_pb2.Message()] + [
        api_pb2.Message(offset=i, value=VALUE, timestamp=i, subject="s", headers={"subject": b"s", "reply": b""})
        for i in range(n)
    ]

    def core() -> ClientCore:
        core = ClientCore(ConnectionSettings(("b:1",), timeout=5.0, max_retries=3, ack_policy=AckPolicy.LEADER))
        part = PartitionInfo("s", 0, "b1", ("b1",), ("b1",), n - 1, n - 1, False, False, 0, 0)
        core.cache.update(Metadata((BrokerInfo("b1", "b", 1, 1, 1),), {"s": StreamInfo("s", "s", 0, {0: part})}), None)
        return core

    class Call:  # what a sync call and a grpc.aio call offer a subscription
        def __init__(self) -> None:
            self.it = iter(responses)

        def __iter__(self) -> Call:
            return self

        def __next__(self) -> api_pb2.Message:
            return next(self.it)

        def __aiter__(self) -> Call:
            return self

        async def __anext__(self) -> api_pb2.Message:
            try:
                return next(self.it)
            except StopIteration:
                raise StopAsyncIteration from None

        def cancel(self) -> None:
            pass

    class Stub:
        def Subscribe(self, request: object) -> Call:  # noqa: N802  (the generated stub's name)
            return Call()

    class Sync(sync_client.SyncTransport):
        def __init__(self) -> None:
            pass

        def _stub(self, address: str, long_lived: bool = False) -> Stub:
            return Stub()

    class Channel:  # what the generated stub asks of a blocking channel
        def unary_stream(self, method: str, *args: object, **kwargs: object) -> Callable[[object], Call]:
            return lambda request: Call()

        unary_unary = stream_unary = stream_stream = unary_stream

    class Async(async_client.AsyncTransport):
        def __init__(self, reader: str) -> None:
            self.closed = False
            self._reader = reader  # type: ignore[assignment]
            self._streams = set()

        def _stub(self, address: str, long_lived: bool = False) -> Stub:
            return Stub()

        def _sync_channel(self, address: str) -> Channel:  # type: ignore[override]
            return Channel()

    def raw_sync() -> int:
        return sum(1 for m in Call() if m.ByteSize())

    async def raw_async() -> int:
        got = 0
        async for m in Call():
            got += m.ByteSize() > 0
        return got

    def ours_sync() -> int:
        return sum(1 for _ in Sync().drive(subscription.subscribe(core(), "s", stop_at=n - 1)))

    async def ours_async(reader: str) -> int:
        got = 0
        async for _ in Async(reader).drive(subscription.subscribe(core(), "s", stop_at=n - 1)):
            got += 1
        return got

    cases: dict[str, Callable[[], int]] = {
        "fake call alone (sync)": raw_sync,
        "ours-sync": ours_sync,
        "fake call alone (async for)": lambda: asyncio.run(raw_async()),
        "ours-async (thread reader)": lambda: asyncio.run(ours_async("thread")),
        "ours-async (aio reader)": lambda: asyncio.run(ours_async("aio")),
    }
    print(f"our layers over a fake call, {n:,} messages with 2 headers, best of 3")
    print("| variant | CPU µs/msg |")
    print("|---|---:|")
    for name, fn in cases.items():
        best = float("inf")
        for _ in range(3):
            c0 = time.process_time()
            if fn() != n:
                raise SystemExit(f"{name} did not read {n} messages")
            best = min(best, time.process_time() - c0)
        print(f"| {name} | {best / n * 1e6:.2f} |")


def child(variant: str, address: str, stream: str, n: int) -> None:
    """Run one of our variants here and print what it cost (the --compare-tree child)."""
    c0, w0 = time.process_time(), time.perf_counter()
    got = ours_sync(address, stream, n) if variant == "sync" else asyncio.run(_ours_async(address, stream, n))
    print(json.dumps({"got": got, "cpu": time.process_time() - c0, "wall": time.perf_counter() - w0}))


def in_tree(tree: Path, variant: str, address: str, stream: str, n: int) -> Callable[[], int]:
    """A variant run in a child process that imports the client from ``tree``; its CPU is its own."""

    def run() -> int:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run(
            [sys.executable, __file__, "--child", variant, address, stream, str(n)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        result = json.loads(out.splitlines()[-1])
        CHILD.append((result["cpu"], result["wall"]))
        return int(result["got"])

    return run


#: CPU and wall seconds of the last child run (its own, without the interpreter's start-up).
CHILD: list[tuple[float, float]] = []


def variants(address: str, stream: str, n: int, tree: Path | None) -> dict[str, Callable[[], int]]:
    old = {}
    if tree is not None:
        old = {
            "old-sync": in_tree(tree, "sync", address, stream, n),
            "old-async": in_tree(tree, "async", address, stream, n),
        }

    def gufo() -> int:  # in its own process (see bench/_gufo_worker.py)
        run = in_child("subscribe", address, stream, n, None)
        CHILD.append((run.client_cpu, run.wall))
        return run.count

    return old | {
        "gufo": gufo,
        "raw-sync": lambda: raw_subscribe(address, stream, n),
        "raw-sync-1t": lambda: raw_subscribe_single_threaded(address, stream, n),
        "ours-sync": lambda: ours_sync(address, stream, n),
        "raw-aio": lambda: asyncio.run(raw_subscribe_aio(address, stream, n)),
        "ours-async": lambda: asyncio.run(_ours_async(address, stream, n)),
        "ours-async-aio": lambda: asyncio.run(_ours_async(address, stream, n, "aio")),
    }


@contextlib.contextmanager
def server(data: str, tree: Path | None) -> Iterator[DevServerProcess]:
    """The dev server process, importing the package from ``tree`` when given."""
    saved, cwd = os.environ.get("PYTHONPATH"), os.getcwd()
    if tree is not None:
        os.environ["PYTHONPATH"] = str(tree)
        os.chdir(data)  # `python -m` puts the working directory first on the path
    try:
        srv = DevServerProcess(data_dir=data).start()
    finally:
        os.chdir(cwd)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        yield srv
    finally:
        srv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--quiet", action="store_true", help="only the table")
    parser.add_argument("--compare-tree", type=Path, help="a checkout whose client runs as old-sync / old-async")
    parser.add_argument("--server-tree", type=Path, help="a checkout whose dev server to run")
    parser.add_argument("--layers", action="store_true", help="our layers over a fake call, no server")
    parser.add_argument("--child", nargs=4, metavar=("VARIANT", "ADDRESS", "STREAM", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        variant, address, stream, count = args.child
        child(variant, address, stream, int(count))
        return
    if args.layers:
        layers(args.messages)
        return
    n = args.messages
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as data, server(data, args.server_tree) as srv:
        stream = "subscribe-bench"
        with LiftbridgeClient(srv.address, nats_servers=[srv.nats_url]) as client:
            client.create_stream(stream, stream)
            client.publish_many(stream, [VALUE] * n, window=1024)
            assert client.fetch_partition_metadata(stream).high_watermark == n - 1
        cases = variants(srv.address, stream, n, args.compare_tree)
        if args.only:
            cases = {k: v for k, v in cases.items() if k in args.only.split(",")}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        rate: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(args.rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for name in order:
                CHILD.clear()
                c0, w0 = time.process_time(), time.perf_counter()
                got = cases[name]()
                c1, w1 = time.process_time(), time.perf_counter()
                if got != n:
                    raise SystemExit(f"{name} read {got} messages, expected {n}")
                spent, wall = CHILD[0] if CHILD else (c1 - c0, w1 - w0)
                cpu[name].append(spent / n * 1e6)
                rate[name].append(n / wall)
                if not args.quiet:
                    print(f"  {name:10} {cpu[name][-1]:6.1f} µs/msg  {rate[name][-1]:8,.0f} msgs/s", file=sys.stderr)
    load1 = os.getloadavg()
    print(f"{machine()}; load average {load0[0]:.1f} → {load1[0]:.1f}; {n:,} messages × {args.rounds} rounds")
    print("| variant | client CPU µs/msg (best) | median | msgs/s (best) |")
    print("|---|---:|---:|---:|")
    for name in cases:
        print(f"| {name} | {min(cpu[name]):.1f} | {statistics.median(cpu[name]):.1f} | {max(rate[name]):,.0f} |")


if __name__ == "__main__":
    main()
