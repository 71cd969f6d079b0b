"""Throughput of the dev server: Publish, PublishAsync, Subscribe and NATS enveloped ingest with acks.

The server runs in its own process (``DevServerProcess``) so it does not share the GIL with the
load generator in this one. Values are 100 bytes. Each gRPC transport of the dev server (``h2``,
``aio``) gets its own server, run interleaved; each row shows wall time and the CPU per message of
this client process and of the server process (psutil; its nats-server child not included).
A markdown table goes to stdout.

``--brokers 3`` measures cluster mode instead: every stream has one replica per broker, the load
goes to each partition's leader, and ``--ack-policy all`` makes every ack wait for the whole ISR
(the followers' replication runs in the same server process, so its CPU is in the server column).

``--base REV`` runs every case a second time against the dev server code of git revision REV
(its ``airflow_provider_liftbridge`` tree, exported to a temporary directory and put first on the
server child's ``PYTHONPATH``), interleaved with this tree's, and adds the ratio: the "nothing got
slower" check of a server change, before and after under the same load in one run.

    .venv/bin/python bench/devserver_bench.py [--messages 50000] [--publish-messages 3000]
        [--grpc-transport h2,aio] [--rounds 1] [--brokers 1] [--ack-policy leader|all] [--base REV]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psutil
from _measure import machine

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message
from airflow_provider_liftbridge.devserver import DevServerProcess

VALUE = b"x" * 100


def _identity(b: bytes) -> bytes:
    return b


def bench_publish(stub: api_pb2_grpc.APIStub, stream: str, n: int, policy: int = pb.LEADER) -> float:
    """Sequential Publish calls, each waiting for its ack."""
    req = pb.PublishRequest(stream=stream, value=VALUE, ackPolicy=policy)  # type: ignore[arg-type]
    start = time.perf_counter()
    for _ in range(n):
        stub.Publish(req, timeout=10)
    return time.perf_counter() - start


def bench_publish_async(channel: grpc.Channel, stream: str, n: int, policy: int = pb.LEADER) -> float:
    """One PublishAsync stream; requests pre-serialized so the client spends little per message."""
    call = channel.stream_stream(
        "/proto.API/PublishAsync", request_serializer=_identity, response_deserializer=_identity
    )
    reqs = [
        pb.PublishRequest(stream=stream, value=VALUE, correlationId=str(i), ackPolicy=policy).SerializeToString()  # type: ignore[arg-type]
        for i in range(n)
    ]

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


async def bench_nats(nats_url: str, subject: str, n: int, policy: int = pb.LEADER) -> float:
    """Enveloped publishes straight to the stream's NATS subject; time until every ack is back."""
    nc = await nats_adapter.connect(nats_url, pending_size=64 * 1024 * 1024)
    inbox = nc.new_inbox()
    done = asyncio.Event()
    acks = 0

    async def on_ack(_msg: object) -> None:
        nonlocal acks
        acks += 1
        if acks == n:
            done.set()

    await nc.subscribe(inbox, cb=on_ack, pending_msgs_limit=n + 10)
    payloads = [new_message(VALUE, ack_inbox=inbox, correlation_id=str(i), ack_policy=policy) for i in range(n)]
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


Row = tuple[str, str, int, float, float, float]  # path, transport, messages, seconds, client CPU s, server CPU s


def _measured(server_pid: int, fn: Callable[[], float]) -> tuple[float, float, float]:
    """Run ``fn``; return its wall time, this process's CPU time and the server process's CPU time."""
    server = psutil.Process(server_pid)
    s0, c0 = server.cpu_times(), time.process_time()
    secs = fn()
    s1, c1 = server.cpu_times(), time.process_time()
    return secs, c1 - c0, (s1.user - s0.user) + (s1.system - s0.system)


def run_transport(transport: str, args: argparse.Namespace, tag: str) -> list[Row]:
    """Every path against a fresh server on ``transport``."""
    rows: list[Row] = []
    n, p, brokers = args.messages, args.publish_messages, args.brokers
    policy, label = (pb.ALL, "ALL") if args.ack_policy == "all" else (pb.LEADER, "LEADER")
    with (
        tempfile.TemporaryDirectory() as data,
        DevServerProcess(data, grpc_transport=transport, brokers=brokers) as server,
    ):
        assert server.pid is not None
        admin = grpc.insecure_channel(server.address)
        for name in ("pub", "async", "nats"):
            req = pb.CreateStreamRequest(subject=f"bench.{name}.{tag}", name=name, replicationFactor=brokers)
            api_pb2_grpc.APIStub(admin).CreateStream(req, timeout=10)
        # Each stream's load goes to its partition's leader (broker 0 when there is one broker).
        meta = api_pb2_grpc.APIStub(admin).FetchMetadata(pb.FetchMetadataRequest(), timeout=10)
        hosts = {b.id: f"{b.host}:{b.port}" for b in meta.brokers}
        streams = [sm for sm in meta.streamMetadata if not sm.name.startswith("__")]  # not __cursors
        leaders = {sm.name: hosts[sm.partitions[0].leader] for sm in streams}
        channels = {name: grpc.insecure_channel(address) for name, address in leaders.items()}
        pub_stub = api_pb2_grpc.APIStub(channels["pub"])
        cases: list[tuple[str, int, Callable[[], float]]] = [
            (f"Publish (sequential, {label} ack)", p, lambda: bench_publish(pub_stub, "pub", p, policy)),
            (
                f"PublishAsync (one stream, {label} acks)",
                n,
                lambda: bench_publish_async(channels["async"], "async", n, policy),
            ),
            ("Subscribe (EARLIEST, stored messages)", n, lambda: bench_subscribe(channels["async"], "async", n)),
            (
                f"NATS enveloped publish + {label} acks on inbox",
                n,
                lambda: asyncio.run(bench_nats(server.nats_url, f"bench.nats.{tag}", n, policy)),
            ),
        ]
        for name, count, fn in cases:
            rows.append((name, transport, count, *_measured(server.pid, fn)))
        for channel in (admin, *channels.values()):
            channel.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000, help="messages for PublishAsync, Subscribe, NATS")
    parser.add_argument("--publish-messages", type=int, default=3_000, help="messages for sequential Publish")
    parser.add_argument(
        "--grpc-transport",
        default="h2,aio",
        help="comma-separated dev-server transports to compare, run interleaved (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="runs per transport; the lowest server CPU is kept")
    parser.add_argument(
        "--brokers", type=int, default=1, help="brokers of the server (> 1: cluster mode, RF = brokers)"
    )
    parser.add_argument(
        "--ack-policy",
        choices=("leader", "all"),
        default="leader",
        help="ack policy of every publish (default: leader)",
    )
    parser.add_argument(
        "--base",
        metavar="REV",
        help="also run every case against the dev server of this git revision, interleaved, with ratios",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as base_dir:
        variants = [(t, t, None) for t in args.grpc_transport.split(",")]
        if args.base:
            _export(args.base, Path(base_dir))
            variants += [(f"{t} @ {args.base}", t, base_dir) for t in args.grpc_transport.split(",")]
        best, order = _run_rounds(args, variants)
    _print_table(args, [label for label, _, _ in variants], best, order)


def _export(rev: str, into: Path) -> None:
    """Write the ``airflow_provider_liftbridge`` tree of git revision ``rev`` into ``into``."""
    top = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(top), "archive", rev, "airflow_provider_liftbridge"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


@contextlib.contextmanager
def _server_code(path: str | None) -> Iterator[None]:
    """Put ``path`` first on the server child's import path (the child inherits this environment)."""
    if path is None:
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = path + (os.pathsep + old if old else "")
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def _run_rounds(
    args: argparse.Namespace, variants: list[tuple[str, str, str | None]]
) -> tuple[dict[tuple[str, str], Row], list[tuple[str, str]]]:
    """Every variant (label, transport, server code path) ``args.rounds`` times; the best row of each case."""
    best: dict[tuple[str, str], Row] = {}
    order: list[tuple[str, str]] = []
    for rnd in range(args.rounds):
        # Interleaved, and reversed every other round, so a busy moment on a shared machine hits both.
        for label, transport, code in variants if rnd % 2 == 0 else variants[::-1]:
            with _server_code(code):
                rows = run_transport(transport, args, f"{rnd}{len(order)}")
            for row in rows:
                key = (row[0], label)
                if key not in best:
                    order.append(key)
                if key not in best or row[5] / row[2] < best[key][5] / best[key][2]:
                    best[key] = (row[0], label, *row[2:])
    return best, order


def _print_table(
    args: argparse.Namespace, labels: list[str], best: dict[tuple[str, str], Row], order: list[tuple[str, str]]
) -> None:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    cluster = f", {args.brokers} brokers (replication factor {args.brokers})" if args.brokers > 1 else ""
    print(f"Dev server throughput, 100-byte values{cluster}, best of {args.rounds} run(s) by server CPU per message.")
    print(f"Machine: {machine()}; load average {load}.\n")
    ratio = " | server CPU this / base |" if args.base else " |"
    print(f"| path | server | messages | seconds | msgs/s | client CPU µs/msg | server CPU µs/msg{ratio}")
    print("|---|---|---:|---:|---:|---:|---:|" + ("---:|" if args.base else ""))
    for path in dict.fromkeys(name for name, _ in order):  # each path's variants side by side
        for label in labels:
            name, _, count, secs, client, srv = best[(path, label)]
            extra = ""
            if args.base:
                base = best.get((path, f"{label} @ {args.base}"))
                extra = f" {srv / count / (base[5] / base[2]):.2f} |" if base and base[5] else " |"
            print(
                f"| {name} | {label} | {count:,} | {secs:.2f} | {count / secs:,.0f} "
                f"| {client / count * 1e6:.1f} | {srv / count * 1e6:.1f} |{extra}"
            )


if __name__ == "__main__":
    main()
