"""One command, one table: every publish/subscribe/codec/trigger/Spark case beside its baseline.

    .venv/bin/python bench/run.py [--skip-spark] [--rounds 2] [--messages 30000] [--out FILE]
    .venv/bin/python bench/run.py --brokers host:port[,host:port] --nats nats://host:4222 [--server-pid PID]

The server is a ``DevServerProcess`` (its own process, so it never shares a GIL with the load),
or, with ``--brokers`` and ``--nats``, an external Liftbridge the bench does not start (its CPU
is measured when ``--server-pid`` names its process; its NATS server is not measured).
Each case runs its variants interleaved (ours, baseline, ours, baseline, ...) ``--rounds`` times
and keeps each variant's best run. For every run the table gives the client's CPU (this
process's ``process_time`` over wall time, all threads) and the server's (the dev server process
and, separately, its nats-server child, via psutil), and says which side was CPU-bound. The
ratio is always "ours / baseline" in speed terms: above 1 means ours is faster (for µs/op and
latencies it is baseline time / our time). Values are 100 bytes.

Peers come from the ``bench`` extra (gufo-liftbridge, psutil). The trigger cases run in a child
process (a fresh interpreter with Airflow loaded), so its RSS and gRPC channel count are the
triggers' own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import grpc
import grpc.aio
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling benchmarks, imported for reuse
# As scripts/test.sh sets them: without a local IP the JVM may fail to start here
# (JAVA_GATEWAY_EXITED), and executors must run this interpreter.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import baselines  # noqa: E402  (the raw stub / nats-py baselines)
import codec_bench  # noqa: E402  (codec fixtures and the timing helper)
from _measure import cpu_seconds, machine  # noqa: E402  (other processes' CPU, the machine line)

from airflow_provider_liftbridge import codec  # noqa: E402
from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc  # noqa: E402
from airflow_provider_liftbridge.client import (  # noqa: E402
    AsyncLiftbridgeClient,
    LiftbridgeClient,
)
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher  # noqa: E402
from airflow_provider_liftbridge.client.publishing.options import NATS_WINDOW, PublishOptions  # noqa: E402
from airflow_provider_liftbridge.client.publishing.publisher import DEFAULT_BATCH  # noqa: E402
from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402
from airflow_provider_liftbridge.nats_security import redact_url  # noqa: E402

VALUE = baselines.VALUE
BULK_WINDOW = NATS_WINDOW  # the NATS path's default window
GRPC_WINDOW = 256


# ---------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    """One measured run: ``count`` items in ``wall`` seconds, and who spent CPU meanwhile."""

    count: int
    wall: float
    client_cpu: float
    server_cpu: float
    nats_cpu: float
    load1: float

    @property
    def rate(self) -> float:
        return self.count / self.wall if self.wall > 0 else 0.0

    def pct(self, cpu: float) -> float:
        return 100.0 * cpu / self.wall if self.wall > 0 else 0.0

    @property
    def bound(self) -> str:
        """Which side was CPU-bound: one at or above 85 % of a core (each Python side holds a GIL).
        Below that on every side, the run waited (round trips) or shared the cores with others."""
        shares = {"client": self.pct(self.client_cpu), "server": self.pct(self.server_cpu)}
        sides = [name for name, pct in shares.items() if pct >= 85]
        return "+".join(sides) if sides else "none"


@dataclass(frozen=True)
class ExternalServer:
    """A Liftbridge the bench did not start (``--brokers``, ``--nats``, ``--server-pid``): the
    same ``address`` / ``nats_url`` / ``pid`` the cases read from a ``DevServerProcess``."""

    brokers: str
    nats_url: str
    pid: int | None = None

    @property
    def address(self) -> str:
        """The first broker (the gufo peer takes one address; our client learns the others)."""
        return self.brokers.split(",")[0].strip()


#: What the cases run against: the dev server the bench starts, or an external Liftbridge.
Server = DevServerProcess | ExternalServer


class Meter:
    """Measures runs against the dev server process (and its nats-server child)."""

    def __init__(self, server_pid: int | None) -> None:
        self.server = psutil.Process(server_pid) if server_pid else None
        self.nats = [p for p in self.server.children(recursive=True) if "nats" in p.name()] if self.server else []

    def measure(self, fn: Callable[[], int | Run]) -> Run:
        """Run ``fn`` (it returns how many items it handled) and measure it; a ``fn`` that measured
        itself in another process returns its :class:`Run` instead."""
        servers = [self.server] if self.server else []
        s0, n0, c0, w0 = cpu_seconds(servers), cpu_seconds(self.nats), time.process_time(), time.perf_counter()
        count = fn()
        if isinstance(count, Run):
            return count
        wall = time.perf_counter() - w0
        c1, s1, n1 = time.process_time(), cpu_seconds(servers), cpu_seconds(self.nats)
        return Run(count, wall, c1 - c0, s1 - s0, n1 - n0, os.getloadavg()[0])


def interleaved(variants: dict[str, Callable[[], int | Run]], meter: Meter, rounds: int) -> dict[str, Run]:
    """Run every variant once per round, in turn; keep each variant's fastest run."""
    best: dict[str, Run] = {}
    for r in range(rounds):
        order = list(variants.items())
        if r % 2:
            order.reverse()  # neither side always goes first
        for name, fn in order:
            run = meter.measure(fn)
            print(f"  {name}: {run.count} in {run.wall:.2f} s = {run.rate:,.0f}/s", file=sys.stderr)
            if name not in best or run.rate > best[name].rate:
                best[name] = run
    return best


@dataclass
class Row:
    case: str
    ours: str
    baseline: str
    base: str
    ratio: float | None
    target: str
    met: bool | None
    run: Run | None = None
    base_run: Run | None = None
    note: str = ""


def rate_row(case: str, ours: Run, baseline: str, base: Run, target: float | None, note: str = "") -> Row:
    ratio = ours.rate / base.rate if base.rate else None
    return Row(
        case,
        f"{ours.rate:,.0f} msgs/s",
        baseline,
        f"{base.rate:,.0f} msgs/s",
        ratio,
        f"≥ {target:g}×" if target is not None else "",
        None if target is None or ratio is None else ratio >= target,
        ours,
        base,
        note,
    )


# ---------------------------------------------------------------------------------------------
# Cases: publishing
# ---------------------------------------------------------------------------------------------


def fresh(client: LiftbridgeClient, prefix: str, partitions: int = 1) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    client.create_stream(name, name, partitions=partitions)
    return name


def in_child(mode: str, address: str, stream: str, n: int, server_pid: int | None) -> Run:
    """Run a gufo-liftbridge baseline in a child process (see ``_gufo_worker.py`` for why) and
    return the child's own measurement."""
    worker = Path(__file__).with_name("_gufo_worker.py")
    cmd = [sys.executable, str(worker), mode, address, stream, str(n), str(server_pid or 0)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"gufo worker {mode} failed:\n{proc.stderr[-3000:]}")
    return Run(**json.loads(proc.stdout.strip().splitlines()[-1]))


def publishing_cases(srv: Server, meter: Meter, args: argparse.Namespace) -> tuple[list[Row], str]:
    rows: list[Row] = []
    address, url = srv.address, srv.nats_url
    with LiftbridgeClient(address, nats_servers=[url], timeout=60.0) as c:
        print("unary publish", file=sys.stderr)
        s_ours, s_raw = fresh(c, "unary"), fresh(c, "unary-raw")
        n = args.unary
        best = interleaved(
            {
                "ours": lambda: sum(1 for _ in range(n) if c.publish(s_ours, VALUE)),
                "raw": lambda: baselines.raw_unary(address, s_raw, n),
            },
            meter,
            args.rounds,
        )
        rows.append(rate_row("unary publish (wait for ack)", best["ours"], "raw stub Publish", best["raw"], None))

        print("pipelined gRPC publish", file=sys.stderr)
        n = args.grpc_messages
        s_ours, s_raw = fresh(c, "grpc"), fresh(c, "grpc-raw")
        best = interleaved(
            {
                "ours": lambda: len(c.publish_many(s_ours, [VALUE] * n, window=GRPC_WINDOW, path="grpc")),
                "raw": lambda: baselines.raw_publish_async(address, s_raw, n, GRPC_WINDOW),
            },
            meter,
            args.rounds,
        )
        rows.append(
            rate_row(
                f"pipelined gRPC publish_many (window {GRPC_WINDOW})",
                best["ours"],
                f"raw stubs PublishAsync (window {GRPC_WINDOW})",
                best["raw"],
                1.0,
            )
        )

        print("bulk NATS publish", file=sys.stderr)
        n, g = args.messages, args.grpc_messages
        s_ours, s_raw, s_gufo = fresh(c, "bulk"), fresh(c, "bulk-raw"), fresh(c, "bulk-gufo")
        best = interleaved(
            {
                "ours": lambda: len(c.publish_many(s_ours, [VALUE] * n, window=BULK_WINDOW, path="nats")),
                "raw": lambda: asyncio.run(baselines.raw_nats_envelopes(url, s_raw, n, BULK_WINDOW)),
                "gufo": lambda: in_child("publish", address, s_gufo, g, srv.pid),
            },
            meter,
            args.rounds,
        )
        case = f"bulk publish_many over NATS (window {BULK_WINDOW})"
        at_least_once = best["ours"]
        rows.append(rate_row(case, best["ours"], "raw nats-py envelopes + ack inbox", best["raw"], 0.9))
        rows.append(rate_row(case, best["ours"], "gufo-liftbridge publish_bulk", best["gufo"], 10.0))
        ingest = best["raw"]
        rows.append(
            Row(
                "dev server ingest, enveloped with acks",
                f"{ingest.rate:,.0f} msgs/s",
                "target",
                "30,000 msgs/s",
                ingest.rate / 30_000,
                "≥ 1×",
                ingest.rate >= 30_000,
                ingest,
                None,
                f"the raw nats-py run above; the dev server spent {ingest.server_cpu / ingest.count * 1e6:.0f} µs CPU "
                f"per message, ≈ {ingest.count / ingest.server_cpu:,.0f} msgs/s if it had a core to itself",
            )
        )

        print("exactly-once publish", file=sys.stderr)
        s_eo, s_alo = fresh(c, "eo"), fresh(c, "eo-alo")
        producers = itertools.count()
        best = interleaved(
            {
                "exactly-once": lambda: exactly_once_publish(c, s_eo, f"bench-{next(producers)}", [VALUE] * n),
                "at-least-once": lambda: len(c.publish_many(s_alo, [VALUE] * n, path="nats")),
                "exactly-once, read lazily": lambda: exactly_once_publish(
                    c, s_eo, f"bench-{next(producers)}", (VALUE for _ in range(n))
                ),
                "at-least-once, read lazily": lambda: at_least_once_publish(c, s_alo, (VALUE for _ in range(n))),
            },
            meter,
            args.rounds,
        )
        rows.append(
            rate_row(
                "exactly-once publish over NATS, a list (fresh producer: cursor, then the records)",
                best["exactly-once"],
                "at-least-once publish_many over NATS, same client and path (the list as one batch)",
                best["at-least-once"],
                0.8,
                f"bulk row above: {at_least_once.rate:,.0f} msgs/s",
            )
        )
        rows.append(
            rate_row(
                "exactly-once publish over NATS, read lazily (as the operators and Spark feed it)",
                best["exactly-once, read lazily"],
                "at-least-once batch publisher over NATS, read lazily (the publishing operators' path)",
                best["at-least-once, read lazily"],
                0.8,
                f"both in batches of {DEFAULT_BATCH:,}",
            )
        )
    return rows, s_ours


def exactly_once_publish(client: LiftbridgeClient, stream: str, producer_id: str, values: Iterable[bytes]) -> int:
    """Publish ``values`` exactly once as a new producer, over the client's NATS path."""
    result = ExactlyOncePublisher(client, stream, producer_id).publish(values)
    assert result.skipped == 0, result
    return result.written


def at_least_once_publish(client: LiftbridgeClient, stream: str, values: Iterable[bytes]) -> int:
    """Publish ``values`` at least once with the client's batch publisher (the operators' path)."""
    with client.batch_publisher(stream, PublishOptions(path="nats")) as publisher:
        return publisher.send_all(values).count


# ---------------------------------------------------------------------------------------------
# Cases: subscribing
# ---------------------------------------------------------------------------------------------


async def raw_subscribe_aio(address: str, stream: str, n: int) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        req = api_pb2.SubscribeRequest(
            stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_OFFSET, stopOffset=n - 1
        )
        got = 0
        try:
            async for msg in stub.Subscribe(req):
                got += msg.ByteSize() > 0
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        return got


async def ours_subscribe_async(address: str, stream: str, n: int) -> int:
    async with AsyncLiftbridgeClient(address) as ac:
        return len([m async for m in ac.subscribe(stream, stop_at=n - 1)])


def subscribing_cases(srv: Server, meter: Meter, args: argparse.Namespace, stream: str) -> list[Row]:
    address = srv.address
    n = args.subscribe_messages
    rows: list[Row] = []
    with LiftbridgeClient(address) as c:
        have = c.fetch_partition_metadata(stream).high_watermark + 1
        if have < n:
            c.publish_many(stream, [VALUE] * (n - have), window=BULK_WINDOW)
        print("subscribe (sync)", file=sys.stderr)
        best = interleaved(
            {
                "ours": lambda: sum(1 for _ in c.subscribe(stream, stop_at=n - 1)),
                "raw": lambda: baselines.raw_subscribe(address, stream, n),
                "gufo": lambda: in_child("subscribe", address, stream, n, srv.pid),
            },
            meter,
            args.rounds,
        )
    rows.append(rate_row("subscribe, sync client", best["ours"], "raw sync stub Subscribe", best["raw"], None))
    rows.append(rate_row("subscribe, sync client", best["ours"], "gufo-liftbridge subscribe", best["gufo"], 1.3))
    print("subscribe (asyncio)", file=sys.stderr)
    best = interleaved(
        {
            "ours": lambda: asyncio.run(ours_subscribe_async(address, stream, n)),
            "raw": lambda: asyncio.run(raw_subscribe_aio(address, stream, n)),
            "gufo": lambda: in_child("subscribe", address, stream, n, srv.pid),
        },
        meter,
        args.rounds,
    )
    rows.append(rate_row("subscribe, asyncio client", best["ours"], "raw grpc.aio stub Subscribe", best["raw"], None))
    rows.append(rate_row("subscribe, asyncio client", best["ours"], "gufo-liftbridge subscribe", best["gufo"], 1.3))
    return rows


# ---------------------------------------------------------------------------------------------
# Cases: codec
# ---------------------------------------------------------------------------------------------


def codec_cases() -> list[Row]:
    print("codec", file=sys.stderr)
    payload, ack = codec_bench.PAYLOAD, codec_bench.ACK
    frame_us = codec_bench.per_op_us(lambda: codec.encode(payload))
    crc_us = codec_bench.per_op_us(lambda: google_crc32c.value(payload))
    ack_us = codec_bench.per_op_us(lambda: codec.unmarshal_ack(codec.encode_ack(ack, crc=True)))
    pb_us = codec_bench.per_op_us(lambda: api_pb2.Ack.FromString(ack.SerializeToString()))
    return [
        Row(
            "envelope framing + CRC-32C (encode, 100-byte value)",
            f"{frame_us:.2f} µs/op",
            "CRC-32C alone",
            f"{crc_us:.2f} µs/op",
            crc_us / frame_us,
            "≤ 1 µs",
            frame_us <= 1.0,
        ),
        Row(
            "Ack envelope encode + decode with CRC",
            f"{ack_us:.2f} µs/op",
            "Ack protobuf serialize + parse alone",
            f"{pb_us:.2f} µs/op",
            pb_us / ack_us,
            "",
            None,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Cases: triggers (in a child process, see trigger_worker)
# ---------------------------------------------------------------------------------------------


def trigger_worker(address: str, samples: int, waiters: int) -> dict[str, Any]:
    """Runs in a fresh interpreter: wake latency of LiftbridgeOffsetTrigger (commit timestamp to
    TriggerEvent) next to a raw grpc.aio subscription, then ``waiters`` triggers waiting in one
    loop (RSS, shared channels, idle CPU, time for all to fire after one commit)."""
    home = tempfile.mkdtemp(prefix="airflow-bench-")
    os.environ.update(
        {
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
            "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": address}),
        }
    )
    from airflow_provider_liftbridge.client.transport.channels import ASYNC_REGISTRY
    from airflow_provider_liftbridge.triggers.offset import LiftbridgeOffsetTrigger

    me = psutil.Process()

    async def raw_wait(stream: str, offset: int, ready: asyncio.Event) -> int:
        async with grpc.aio.insecure_channel(address) as channel:
            call = api_pb2_grpc.APIStub(channel).Subscribe(
                api_pb2.SubscribeRequest(stream=stream, startPosition=api_pb2.OFFSET, startOffset=offset)
            )
            await call.read()  # the handshake: subscribed
            ready.set()
            msg = await call.read()
            now = time.time_ns()
            call.cancel()
            if msg is grpc.aio.EOF:
                raise RuntimeError("the raw subscription ended before the message")
            return now

    async def main() -> dict[str, Any]:
        async with AsyncLiftbridgeClient(address) as pub:
            wake, wait = f"wake-{uuid.uuid4().hex[:6]}", f"wait-{uuid.uuid4().hex[:6]}"
            await pub.create_stream(wake, wake)
            await pub.create_stream(wait, wait)
            ours: list[float] = []
            raw: list[float] = []
            for k in range(samples):
                trigger = LiftbridgeOffsetTrigger(stream=wake, target_offset=k)
                fired = asyncio.ensure_future(trigger.run().__anext__())
                ready = asyncio.Event()
                raw_task = asyncio.ensure_future(raw_wait(wake, k, ready))
                await ready.wait()
                await asyncio.sleep(0.1)  # the trigger has subscribed too
                ack = await pub.publish(wake, VALUE)
                assert ack is not None
                event = await fired
                t_event = time.time_ns()
                assert event.payload["status"] == "success", event.payload
                t_raw = await raw_task
                ours.append((t_event - ack.commit_timestamp) / 1e6)
                raw.append((t_raw - ack.commit_timestamp) / 1e6)

            rss0 = me.memory_info().rss
            started = time.perf_counter()
            tasks = [
                asyncio.ensure_future(LiftbridgeOffsetTrigger(stream=wait, target_offset=0).run().__anext__())
                for _ in range(waiters)
            ]
            # Settled when a whole second passes with under 5 % CPU.
            settle = 0.0
            while time.perf_counter() - started < 60:
                c0 = time.process_time()
                await asyncio.sleep(1.0)
                if time.process_time() - c0 < 0.05:
                    break
            settle = time.perf_counter() - started
            c0, w0 = time.process_time(), time.perf_counter()
            await asyncio.sleep(5.0)
            idle = (time.process_time() - c0) / (time.perf_counter() - w0)
            rss = me.memory_info().rss
            channels = ASYNC_REGISTRY.open_channels()
            ack = await pub.publish(wait, VALUE)
            assert ack is not None
            events = await asyncio.gather(*tasks)
            all_fired = (time.time_ns() - ack.commit_timestamp) / 1e6
            ok = sum(1 for e in events if e.payload["status"] == "success")
            return {
                "wake_ours": ours,
                "wake_raw": raw,
                "waiters": waiters,
                "fired": ok,
                "rss_mb": rss / 2**20,
                "rss_before_mb": rss0 / 2**20,
                "channels": channels,
                "idle_cpu_pct": idle * 100,
                "settle_s": settle,
                "all_fired_ms": all_fired,
            }

    return asyncio.run(main())


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def trigger_cases(srv: Server, args: argparse.Namespace) -> list[Row]:
    print("triggers (child process)", file=sys.stderr)
    cmd = [sys.executable, __file__, "--trigger-worker", srv.address, str(args.wake_samples), str(args.waiters)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        raise RuntimeError(f"trigger worker failed:\n{proc.stderr[-3000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    p50, p99 = pct(r["wake_ours"], 0.5), pct(r["wake_ours"], 0.99)
    r50, r99 = pct(r["wake_raw"], 0.5), pct(r["wake_raw"], 0.99)
    n = r["waiters"]
    return [
        Row(
            f"trigger wake, commit → TriggerEvent ({len(r['wake_ours'])} samples)",
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
            "raw grpc.aio Subscribe, commit → message",
            f"p50 {r50:.1f} ms, p99 {r99:.1f} ms",
            r50 / p50 if p50 else None,
            "p50 ≤ 50 ms",
            p50 <= 50,
        ),
        Row(
            f"{n:,} offset triggers waiting in one event loop",
            f"{r['rss_mb']:.0f} MB RSS, {r['channels']} gRPC channel(s), idle CPU {r['idle_cpu_pct']:.1f} %",
            "same process before the triggers",
            f"{r['rss_before_mb']:.0f} MB RSS",
            None,
            "≤ 200 MB, 1 channel/broker",
            r["rss_mb"] <= 200 and r["channels"] <= 1,
            note=(
                f"{r['fired']}/{n} fired {r['all_fired_ms']:.0f} ms after one commit; "
                f"settled in {r['settle_s']:.1f} s; 1 broker"
            ),
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Cases: Spark
# ---------------------------------------------------------------------------------------------


def spark_cases(srv: Server, args: argparse.Namespace) -> list[Row]:
    print("spark", file=sys.stderr)
    import spark_bench  # noqa: E402  (its measure(): wall time and the driver's peak RSS)

    from airflow_provider_liftbridge.spark import (
        ConnectionSettings,
        PublishOptions,
        build_spark_session,
        publish_dataframe,
    )

    nats_settings = ConnectionSettings(brokers=srv.address, nats_servers=[srv.nats_url], timeout=60.0)
    grpc_settings = ConnectionSettings(brokers=srv.address, timeout=60.0)
    rows: list[Row] = []
    local: dict[int, float] = {}  # rows/s over NATS on local[cores]
    for cores in (1, 2):
        spark = build_spark_session(
            f"local[{cores}]",
            app_name="liftbridge-bench",
            config={"spark.ui.enabled": "false", "spark.driver.memory": "512m"},
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            runs = {}
            for label, settings, n in (
                ("nats", nats_settings, args.spark_rows),
                ("grpc", grpc_settings, args.spark_grpc_rows),
            ):
                with LiftbridgeClient(srv.address) as c:
                    stream = fresh(c, f"spark-{label}", partitions=2)
                df = spark.range(n, numPartitions=cores * 2).selectExpr(
                    "concat('customer-', cast(id % 1000 as string)) as customer", "id as order_id"
                )
                df.cache().count()

                def run(df: Any = df, stream: str = stream, settings: Any = settings) -> int:
                    return publish_dataframe(
                        df, stream, settings=settings, key_field="customer", options=PublishOptions(window=BULK_WINDOW)
                    ).count

                runs[label] = spark_bench.measure(f"publish over {label}", cores, run)
            ours, base = runs["nats"], runs["grpc"]
            local[cores] = ours.rate
            rows.append(
                Row(
                    f"Spark publish_dataframe, local[{cores}] (JSON rows, keyed)",
                    f"{ours.rate:,.0f} rows/s",
                    "same over gRPC (no NATS servers)",
                    f"{base.rate:,.0f} rows/s",
                    ours.rate / base.rate if base.rate else None,
                    "",
                    None,
                    note=f"{ours.rows:,} rows via NATS, {base.rows:,} via gRPC",
                )
            )
        finally:
            spark.stop()
    return rows + spark_cluster_rows(srv, args, local)


def spark_cluster_rows(srv: Server, args: argparse.Namespace, local: dict[int, float]) -> list[Row]:
    """The standalone cluster (executors on the Airflow-free archive) beside local[N], and Structured
    Streaming: read, and the sink exactly-once beside at-least-once."""
    import spark_bench

    runs = spark_bench.cluster_cases_in_child(
        srv.address, srv.nats_url, srv.pid, args.spark_rows, args.spark_stream_rows, BULK_WINDOW
    )
    by_name = {(r.what, r.executors): r for r in runs}
    one, two = by_name[("publish", 1)], by_name[("publish", 2)]
    rows = [
        Row(
            f"Spark publish_dataframe, standalone cluster, {r.executors} executor(s) of 1 core",
            f"{r.rate:,.0f} rows/s",
            f"local[{r.executors}]",
            f"{local[r.executors]:,.0f} rows/s",
            r.rate / local[r.executors] if local.get(r.executors) else None,
            "",
            None,
            note=f"{r.rows:,} rows, NATS path; {r.cpu_note()}",
        )
        for r in (one, two)
    ]
    rows.append(
        Row(
            "Spark publish scaling on the cluster: 2 executors vs 1",
            f"{two.rate:,.0f} rows/s",
            "1 executor",
            f"{one.rate:,.0f} rows/s",
            two.rate / one.rate if one.rate else None,
            "",
            None,
        )
    )
    batch, stream = by_name[("batch read (count)", 2)], by_name[("streaming read (availableNow, noop sink)", 2)]
    rows.append(
        Row(
            "Structured Streaming read, availableNow, noop sink, 2 executors",
            f"{stream.rate:,.0f} rows/s",
            "batch read().count()",
            f"{batch.rate:,.0f} rows/s",
            stream.rate / batch.rate if batch.rate else None,
            "",
            None,
            note=f"{stream.rows:,} messages, 2 partitions, incl. query start; {stream.cpu_note()}",
        )
    )
    exactly, at_least = by_name[("streaming sink exactlyOnce", 2)], by_name[("streaming sink atLeastOnce", 2)]
    rows.append(
        Row(
            "Structured Streaming stream-to-stream, sink exactlyOnce, 2 executors",
            f"{exactly.rate:,.0f} rows/s",
            "sink atLeastOnce",
            f"{at_least.rate:,.0f} rows/s",
            exactly.rate / at_least.rate if at_least.rate else None,
            "",
            None,
            note=f"{exactly.rows:,} messages, incl. query start; exactlyOnce {exactly.cpu_note()}; "
            f"atLeastOnce {at_least.cpu_note()}",
        )
    )
    return rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def cpu_cell(run: Run | None) -> str:
    """``client/server/nats`` CPU in % of one core; client/server CPU µs per item; the CPU-bound side."""
    if run is None:
        return ""
    per = f"{run.client_cpu / run.count * 1e6:.0f}/{run.server_cpu / run.count * 1e6:.0f} µs" if run.count else ""
    return (
        f"{run.pct(run.client_cpu):.0f}/{run.pct(run.server_cpu):.0f}/{run.pct(run.nats_cpu):.0f} %, {per} "
        f"→ {run.bound}"
    )


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    seconds: float = 0.0

    def markdown(self, args: argparse.Namespace) -> str:
        met = {True: "yes", False: "**no**", None: ""}
        server = (
            f"Server: an external Liftbridge at {args.brokers} (NATS {redact_url(args.nats)}"
            + (f", server CPU of pid {args.server_pid}" if args.server_pid else ", server CPU not measured")
            + "); the server columns cover only that process."
            if args.brokers
            else "Server: the project's dev server in its own process (`DevServerProcess`, one broker, nats-server "
            "child); figures against a real Liftbridge server would differ."
        )
        lines = [
            f"Run {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}, {self.seconds:.0f} s. Machine: {machine()}.",
            f"Load average (1/5/15 min) at start {'/'.join(f'{x:.1f}' for x in self.load_start)}, "
            f"at end {'/'.join(f'{x:.1f}' for x in self.load_end)} (the machine is shared).",
            server,
            f"100-byte values; {args.rounds} interleaved round(s) per case, best run kept; ratio > 1 means ours "
            "is faster. CPU columns: client/server/nats-server CPU time in % of one core over the run's wall time "
            "(client = the publishing or reading process, all threads; server = the dev server process; nats = "
            "its nats-server child); client/server CPU µs per message; then the side at ≥ 85 % (CPU-bound), or "
            "none (the run waited on round trips, or shared the two cores with other work).",
            "",
            "| case | ours | baseline | baseline value | ratio | target | met | CPU ours | CPU baseline | load1 |",
            "|---|---|---|---|---:|---|---|---|---|---:|",
        ]
        for r in self.rows:
            ratio = f"{r.ratio:.2f}×" if r.ratio is not None else ""
            load = f"{r.run.load1:.1f}" if r.run else ""
            note = f" ({r.note})" if r.note else ""
            lines.append(
                f"| {r.case}{note} | {r.ours} | {r.baseline} | {r.base} | {ratio} | {r.target} | {met[r.met]} "
                f"| {cpu_cell(r.run)} | {cpu_cell(r.base_run)} | {load} |"
            )
        return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case (best run kept)")
    parser.add_argument("--messages", type=int, default=30_000, help="messages per bulk NATS run")
    parser.add_argument("--grpc-messages", type=int, default=8_000, help="messages per gRPC pipelined run")
    parser.add_argument("--unary", type=int, default=800, help="messages per one-at-a-time publish run")
    parser.add_argument("--subscribe-messages", type=int, default=10_000)
    parser.add_argument("--wake-samples", type=int, default=40)
    parser.add_argument("--waiters", type=int, default=1_000)
    parser.add_argument("--spark-rows", type=int, default=200_000, help="rows per Spark run over NATS")
    parser.add_argument("--spark-grpc-rows", type=int, default=20_000, help="rows per Spark run over gRPC")
    parser.add_argument("--spark-stream-rows", type=int, default=100_000, help="messages per streaming run")
    parser.add_argument("--skip-spark", action="store_true")
    parser.add_argument("--publishing-only", action="store_true", help="only the rows that publish (and Spark)")
    parser.add_argument("--skip-triggers", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--brokers",
        help="run every case against this external Liftbridge (host:port[,host:port...]) instead of starting a"
        " dev server; needs --nats",
    )
    parser.add_argument("--nats", help="NATS URL of the external Liftbridge (nats://host:port)")
    parser.add_argument(
        "--server-pid", type=int, help="pid of the external broker process, to measure its CPU (optional)"
    )
    parser.add_argument("--trigger-worker", nargs=3, metavar=("ADDRESS", "SAMPLES", "WAITERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if bool(args.brokers) != bool(args.nats):
        parser.error("--brokers and --nats go together: the bulk cases publish over NATS")
    if args.server_pid and not args.brokers:
        parser.error("--server-pid measures an external server: give --brokers and --nats too")
    if args.trigger_worker:
        address, samples, waiters = args.trigger_worker
        print(json.dumps(trigger_worker(address, int(samples), int(waiters))))
        return

    report = Report(load_start=os.getloadavg())
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        srv: Server
        if args.brokers:
            srv = ExternalServer(args.brokers, args.nats, args.server_pid)
        else:
            srv = stack.enter_context(DevServerProcess(data_dir=stack.enter_context(tempfile.TemporaryDirectory())))
        meter = Meter(srv.pid)
        rows, bulk_stream = publishing_cases(srv, meter, args)
        report.rows += rows
        if not args.publishing_only:
            report.rows += subscribing_cases(srv, meter, args, bulk_stream)
            report.rows += codec_cases()
        if not args.skip_triggers and not args.publishing_only:
            report.rows += trigger_cases(srv, args)
        if not args.skip_spark:
            report.rows += spark_cases(srv, args)
    report.seconds = time.perf_counter() - started
    report.load_end = os.getloadavg()
    text = report.markdown(args)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(
        f"median load1 over the rows: {statistics.median(r.run.load1 for r in report.rows if r.run):.1f}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
