"""Spark publishing benchmark: rows/s from 1 and 2 executor cores, read-back rows/s, driver memory.

    python bench/spark_bench.py [--rows 1000000] [--partitions 2] [--driver-memory 512m]
    python bench/spark_bench.py --per-core [--code before=/path/to/main --code after=.] [--rows 200000]

``--per-core`` (``--cases publish,read,sink,cluster``, all by default; ``--brokers``/``--nats``
for any running cluster instead of a dev server): interleaved rounds, with CPU per row of the
executors' Python workers, the JVM and the client, and apart the CPU per run of the driver's
Python planner processes (a fixed cost per query): on local[1] (``--master``), Spark's
``publish_dataframe`` against the client's ``publish_many`` of the same rows (and
``publish_dataframe(exactly_once=True)`` beside it); ``spark.read.format("liftbridge")...count()``
against the client's sync ``subscribe`` of the same stream; the Structured Streaming sink
exactly-once against at-least-once; and (``cluster``) ``publish_dataframe`` with 2 executors on a
standalone cluster of this machine against local[2]. Each ``--code`` tree is measured in its own
child processes, run in that tree (one run compares two commits); a child or case that fails is
named below the tables and the rest is printed.

Starts an out-of-process dev server (so the server does not share this process's GIL), then:
1. publishes ``--small-rows`` rows on local[2] (warm-up, and the driver-memory baseline),
2. publishes ``--rows`` rows on local[1], then on local[2] (each run to a fresh stream),
3. reads the last stream back with ``spark.read.format("liftbridge")`` and counts it.

The driver runs with ``spark.driver.memory`` = ``--driver-memory`` (512m by default): the run
succeeding, and the driver's peak RSS being about the same for the small and the large publish,
shows that rows never travel to the driver. Prints a markdown table and the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from _measure import cpu_model

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServerProcess
from airflow_provider_liftbridge.spark import (
    ConnectionSettings,
    LiftbridgeDataSource,
    PublishOptions,
    build_spark_session,
    from_options,
    publish_dataframe,
    to_options,
)


class PeakRss:
    """Samples the resident memory of this process (the PySpark driver) and of the driver JVM."""

    def __init__(self) -> None:
        self.python = 0
        self.jvm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            self.python = max(self.python, me.memory_info().rss)
            for child in me.children(recursive=True):
                try:
                    if child.name() == "java":
                        self.jvm = max(self.jvm, child.memory_info().rss)
                except psutil.NoSuchProcess:
                    pass
            self._stop.wait(0.2)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Row:
    what: str
    cores: int
    rows: int
    seconds: float
    python_mb: float
    jvm_mb: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def measure(what: str, cores: int, run: Callable[[], int]) -> Row:
    with PeakRss() as peak:
        started = time.monotonic()
        rows = run()
        seconds = time.monotonic() - started
    row = Row(what, cores, rows, seconds, peak.python / 2**20, peak.jvm / 2**20)
    print(f"  {what} on local[{cores}]: {rows} rows in {seconds:.1f} s ({row.rate:,.0f} rows/s)", file=sys.stderr)
    return row


def machine() -> str:
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    import pyspark

    return (
        f"{cpu_model()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM, "
        f"Python {platform.python_version()}, PySpark {pyspark.__version__}, {java}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small-rows", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=2, help="stream partitions")
    parser.add_argument("--driver-memory", default="512m")
    parser.add_argument("--window", type=int, default=512)
    args = parser.parse_args()

    results: list[Row] = []
    with tempfile.TemporaryDirectory() as data_dir, DevServerProcess(data_dir=data_dir, brokers=1) as server:
        settings = ConnectionSettings(brokers=server.address, nats_servers=[server.nats_url], timeout=30.0)

        def new_stream() -> str:
            name = f"bench-{uuid.uuid4().hex[:8]}"
            with LiftbridgeClient(server.address) as client:
                client.create_stream(name, name, partitions=args.partitions)
            return name

        def publish(spark: Any, rows: int, cores: int) -> tuple[str, Callable[[], int]]:
            stream = new_stream()
            df = spark.range(rows, numPartitions=cores * 2).selectExpr(
                "concat('customer-', cast(id % 1000 as string)) as customer",
                "id as order_id",
                "cast(id % 97 as double) * 1.25 as amount",
            )

            def run() -> int:
                summary = publish_dataframe(
                    df, stream, settings=settings, key_field="customer", options=PublishOptions(window=args.window)
                )
                return summary.count

            return stream, run

        last_stream = ""
        for cores, rows, label in (
            (2, args.small_rows, "publish (baseline)"),
            (1, args.rows, "publish"),
            (2, args.rows, "publish"),
        ):
            spark = build_spark_session(
                f"local[{cores}]",
                app_name="liftbridge-bench",
                config={"spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false"},
            )
            spark.sparkContext.setLogLevel("ERROR")
            last_stream, run = publish(spark, rows, cores)
            results.append(measure(label, cores, run))
            if cores == 2 and rows == args.rows:
                reader = spark.read.format("liftbridge").options(**to_options(settings)).option("stream", last_stream)
                results.append(measure("read back (count)", cores, reader.load().count))
            spark.stop()

    print(f"machine: {machine()}")
    print(
        f"stream partitions: {args.partitions}; spark.driver.memory={args.driver_memory}; window {args.window}; "
        "JSON rows keyed by customer, NATS publish path, dev server out of process"
    )
    print()
    print("| run | executor cores | rows | seconds | rows/s | driver Python peak RSS (MB) | driver JVM peak RSS (MB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        cells = [r.what, r.cores, f"{r.rows:,}", f"{r.seconds:.1f}", f"{r.rate:,.0f}", f"{r.python_mb:.0f}"]
        print("| " + " | ".join(str(c) for c in [*cells, f"{r.jvm_mb:.0f}"]) + " |")


def cluster_cases_in_child(
    address: str, nats_url: str, server_pid: int, rows: int, stream_rows: int, window: int
) -> list[ClusterRun]:
    """:func:`cluster_cases` in a fresh interpreter: its driver JVM must start in the directory
    where the executor archive is unpacked (``build_spark_session``), which a process that already
    ran a SparkSession cannot do."""
    args = [address, nats_url, str(server_pid), str(rows), str(stream_rows), str(window)]
    done = subprocess.run(
        [sys.executable, __file__, "--cluster-child", *args], stdout=subprocess.PIPE, text=True, check=True
    )
    return [ClusterRun(**run) for run in json.loads(done.stdout.strip().splitlines()[-1])]


# ---------------------------------------------------------------------------------------------
# The standalone cluster and Structured Streaming (called by bench/run.py)
# ---------------------------------------------------------------------------------------------


class ProcessCpu:
    """CPU seconds of a set of process trees (the Spark workers' executors and Python workers),
    sampled so that processes that come and go are counted up to their last sample."""

    def __init__(self, roots: list[int]) -> None:
        self._roots = [psutil.Process(pid) for pid in roots]
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for root in self._roots:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                try:
                    times = proc.cpu_times()
                    self._seen[proc.pid] = times.user + times.system
                except psutil.NoSuchProcess:
                    pass

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            self._sample()

    def __enter__(self) -> ProcessCpu:
        self._sample()
        self._start = dict(self._seen)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    @property
    def seconds(self) -> float:
        return sum(cpu - self._start.get(pid, 0.0) for pid, cpu in self._seen.items())


@dataclass
class ClusterRun:
    """One measured run on the standalone cluster: rows, wall seconds, CPU seconds per component."""

    what: str
    executors: int
    rows: int
    seconds: float
    server_cpu: float
    nats_cpu: float
    spark_cpu: float

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    def cpu_note(self) -> str:
        """CPU in % of one core over the wall time, and the component that bounds the run."""
        pct = {
            "dev server": 100 * self.server_cpu / self.seconds,
            "nats-server": 100 * self.nats_cpu / self.seconds,
            "Spark executors": 100 * self.spark_cpu / self.seconds,
        }
        cells = ", ".join(f"{name} {value:.0f} %" for name, value in pct.items())
        # A component is the bound when it uses about all of the cores it can use: one for the
        # single-process dev server / nats-server, one per executor for Spark.
        limits = {"dev server": 100.0, "nats-server": 100.0, "Spark executors": 100.0 * self.executors}
        bound = [name for name, value in pct.items() if value >= 0.85 * limits[name]]
        return f"CPU {cells} → bound: {', '.join(bound) if bound else 'none alone (2 shared cores)'}"


def cluster_cases(
    address: str, nats_url: str, server_pid: int, rows: int, stream_rows: int, window: int
) -> list[ClusterRun]:
    """Publish on a standalone cluster (master + 2 one-core workers, executors on the Airflow-free
    archive) with 1 and 2 executors; read a stream with Structured Streaming; stream from one
    stream to another exactly-once and at-least-once. Prints progress to stderr."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: tests/spark_cluster.py
    from airflow_provider_liftbridge.spark.executor_env import build_executor_env, spark_config
    from tests.spark_cluster import StandaloneCluster

    settings = ConnectionSettings(brokers=address, nats_servers=[nats_url], timeout=60.0)
    options = to_options(settings)
    server = psutil.Process(server_pid)
    nats = [p for p in server.children(recursive=True) if "nats" in p.name()]
    results: list[ClusterRun] = []

    def new_stream(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        with LiftbridgeClient(address) as client:
            client.create_stream(name, name, partitions=2)
        return name

    def measure_run(what: str, executors: int, workers: list[int], fn: Callable[[], int]) -> ClusterRun:
        s0, n0 = server.cpu_times(), [p.cpu_times() for p in nats]
        with ProcessCpu(workers) as spark_cpu:
            started = time.monotonic()
            count = fn()
            seconds = time.monotonic() - started
        s1, n1 = server.cpu_times(), [p.cpu_times() for p in nats]
        run = ClusterRun(
            what,
            executors,
            count,
            seconds,
            (s1.user + s1.system) - (s0.user + s0.system),
            sum((b.user + b.system) - (a.user + a.system) for a, b in zip(n0, n1, strict=True)),
            spark_cpu.seconds,
        )
        print(
            f"  {what}, {executors} executor(s): {count} rows in {seconds:.1f} s ({run.rate:,.0f}/s)", file=sys.stderr
        )
        return run

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        archive = build_executor_env(root / "liftbridge-executor.tar.gz", compresslevel=1)
        cluster = StandaloneCluster(root / "cluster", workers=2, cores=1, memory="1g").start()
        try:
            workers = cluster.worker_pids
            for executors in (1, 2):
                spark = build_spark_session(
                    cluster.master_url,
                    app_name=f"liftbridge-bench-{executors}",
                    config={
                        **spark_config(archive),
                        "spark.cores.max": str(executors),
                        "spark.executor.cores": "1",
                        "spark.executor.memory": "768m",
                        "spark.driver.host": "127.0.0.1",
                        "spark.driver.bindAddress": "127.0.0.1",
                        "spark.ui.enabled": "false",
                    },
                )
                spark.sparkContext.setLogLevel("ERROR")
                try:
                    df = spark.range(rows, numPartitions=executors * 2).selectExpr(
                        "concat('customer-', cast(id % 1000 as string)) as customer", "id as order_id"
                    )
                    df.cache().count()  # the rows exist before the clock starts (and executors are up)
                    stream = new_stream("cluster")

                    def publish(df: Any = df, stream: str = stream) -> int:
                        return publish_dataframe(
                            df, stream, settings=settings, key_field="customer", options=PublishOptions(window=window)
                        ).count

                    results.append(measure_run("publish", executors, workers, publish))
                    if executors == 2:
                        results += streaming_cases(spark, options, new_stream, measure_run, workers, stream_rows, root)
                finally:
                    spark.stop()
        finally:
            cluster.stop()
    return results


def streaming_cases(
    spark: Any,
    options: dict[str, str],
    new_stream: Callable[[str], str],
    measure_run: Callable[[str, int, list[int], Callable[[], int]], ClusterRun],
    workers: list[int],
    rows: int,
    root: Path,
) -> list[ClusterRun]:
    """Structured Streaming on the 2-executor session: read (noop sink), and stream to stream
    exactly-once and at-least-once; availableNow, so each run ends when the source is drained."""
    source = new_stream("stream-src")
    seed = spark.range(rows, numPartitions=4).selectExpr("cast(id as string) as v")
    publish_dataframe(seed, source, settings=from_options(options), value_col="v")

    def query(sink: Callable[[Any], Any], checkpoint: str) -> int:
        df = spark.readStream.format("liftbridge").options(**options).option("stream", source)
        df = df.option("startingOffsets", "earliest").load()
        q = sink(df).option("checkpointLocation", str(root / checkpoint)).trigger(availableNow=True).start()
        q.awaitTermination()
        return sum(p.numInputRows for p in q.recentProgress)

    def read() -> int:
        return query(lambda df: df.writeStream.format("noop"), "read")

    def copy(guarantee: str) -> Callable[[], int]:
        target = new_stream(f"stream-{guarantee}")

        def run() -> int:
            return query(
                lambda df: (
                    df.selectExpr("value as v")
                    .writeStream.format("liftbridge")
                    .options(**options)
                    .option("stream", target)
                    .option("valueColumn", "v")
                    .option("deliveryGuarantee", guarantee)
                ),
                target,  # a checkpoint per target: each run reads the whole source
            )

        return run

    def batch_read() -> int:
        return spark.read.format("liftbridge").options(**options).option("stream", source).load().count()

    results = [
        measure_run("batch read (count)", 2, workers, batch_read),
        measure_run("streaming read (availableNow, noop sink)", 2, workers, read),
    ]
    # The two sinks interleaved (A B B A), each to a fresh target; the faster run of each is kept.
    best: dict[str, ClusterRun] = {}
    for guarantee in ("atLeastOnce", "exactlyOnce", "exactlyOnce", "atLeastOnce"):
        run = measure_run(f"streaming sink {guarantee}", 2, workers, copy(guarantee))
        if guarantee not in best or run.rate > best[guarantee].rate:
            best[guarantee] = run
    return [*results, *best.values()]


# --- Spark against the client alone, per core (issue 57) ---------------------------------------


#: The worker modules of the Python processes Spark starts on the driver to plan, commit or run a
#: streaming source or sink (``python -m pyspark.daemon <module>`` and its forks): a fixed cost per
#: query or micro-batch, not per row. Every other Python process under a JVM is an executor's
#: worker (``pyspark.worker``: the data source's read and write, ``mapInArrow``).
PLANNER_MODULES = ("pyspark.sql.worker.", "pyspark.sql.streaming.")


def python_role(cmdline: list[str]) -> str:
    """``"planner"`` or ``"worker"`` for a Python process under a Spark JVM, from its command line."""
    return "planner" if any(arg.startswith(PLANNER_MODULES) for arg in cmdline) else "worker"


class SplitCpu:
    """CPU seconds of Spark's JVMs (local mode: the driver, which is the executor too; on a
    cluster also the workers' executors) and, apart, of their Python processes: the executors'
    workers and the driver's planners (:func:`python_role`). Sampled every 0.1 s, so processes
    that end are counted up to their last sample.

    :param roots: the processes whose trees are counted; by default this process's JVMs.
    """

    def __init__(self, roots: list[int] | None = None) -> None:
        me = psutil.Process()
        if roots is None:
            self._roots = [c for c in me.children(recursive=True) if c.name() == "java"]
        else:
            self._roots = [psutil.Process(pid) for pid in roots]
        self._cpu: dict[int, float] = {}
        self._kind: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for root in self._roots:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                try:
                    if proc.pid not in self._kind:
                        name = proc.name()
                        self._kind[proc.pid] = "jvm" if name == "java" else python_role(proc.cmdline())
                    t = proc.cpu_times()
                    self._cpu[proc.pid] = t.user + t.system
                except psutil.Error:
                    pass

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def __enter__(self) -> SplitCpu:
        self._sample()
        self._start = dict(self._cpu)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def by_kind(self) -> dict[str, float]:
        """CPU seconds since the start: ``jvm``, ``worker`` (executors' Python) and ``planner``."""
        out = {"jvm": 0.0, "worker": 0.0, "planner": 0.0}
        for pid, cpu in self._cpu.items():
            out[self._kind.get(pid, "worker")] += cpu - self._start.get(pid, 0.0)
        return out

    def fields(self) -> dict[str, float]:
        """:meth:`by_kind` under the names the per-core results use."""
        kinds = self.by_kind()
        return {"jvm_cpu": kinds["jvm"], "python_cpu": kinds["worker"], "planner_cpu": kinds["planner"]}


def per_core_child(
    address: str,
    nats_url: str,
    rows: int,
    rounds: int,
    window: int,
    partitions: int,
    cases: set[str],
    master: str = "local[1]",
) -> dict[str, Any]:
    """On ``master`` (local[1]: one core), ``rounds`` interleaved rounds of each case asked for,
    each run to a fresh stream:

    - ``publish``: Spark's ``publish_dataframe`` (also exactly-once) and the client's ``publish_many``
      of the same rows (the same JSON values, keys and partitions, built beforehand);
    - ``read``: ``spark.read.format("liftbridge")...count()`` and the client's sync ``subscribe`` of
      the same stream (those rows, published once by the client);
    - ``sink``: Structured Streaming from that stream to a fresh one, at-least-once and exactly-once.

    Runs with whatever ``airflow_provider_liftbridge`` is first on PYTHONPATH (so two code trees
    compare in one run)."""
    import airflow_provider_liftbridge
    from airflow_provider_liftbridge.client import Record, partition_for_key

    settings = ConnectionSettings(brokers=address, nats_servers=nats_url, timeout=30.0)
    spark = build_spark_session(
        master, app_name="liftbridge-per-core", config={"spark.ui.enabled": "false", "spark.driver.memory": "1g"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(rows, numPartitions=1).selectExpr(
        "concat('customer-', cast(id % 1000 as string)) as customer",
        "id as order_id",
        "cast(id % 97 as double) * 1.25 as amount",
    )
    df = df.cache()
    df.count()
    records = []
    for r in df.collect():
        body = {"customer": r.customer, "order_id": r.order_id, "amount": r.amount}
        key = r.customer.encode()
        value = json.dumps(body, separators=(",", ":")).encode()
        records.append(Record(value, key=key, partition=partition_for_key(key, partitions)))

    def new_stream() -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        with LiftbridgeClient.from_settings(settings) as client:
            client.create_stream(name, name, partitions=partitions)
        return name

    def spark_run(data: Any, exactly_once: bool = False) -> dict[str, float]:
        stream = new_stream()
        once = {"exactly_once": True, "producer_id": f"bench/{stream}"} if exactly_once else {}
        with SplitCpu() as cpu:
            started = time.monotonic()
            count = publish_dataframe(
                data, stream, settings=settings, key_field="customer", options=PublishOptions(window=window), **once
            ).count
            seconds = time.monotonic() - started
        return {"rows": count, "seconds": seconds, **cpu.fields()}

    def client_run(batch: list[Any]) -> dict[str, float]:
        stream = new_stream()
        with LiftbridgeClient.from_settings(settings) as client:
            client.fetch_metadata([stream])
            cpu0, started = time.process_time(), time.monotonic()
            count = len(client.publish_many(stream, batch, window=window))
            seconds, cpu = time.monotonic() - started, time.process_time() - cpu0
        return {"rows": count, "seconds": seconds, "cpu": cpu}

    def read_run(stream: str) -> dict[str, float]:
        reader = spark.read.format("liftbridge").options(**to_options(settings)).option("stream", stream)
        with SplitCpu() as cpu:
            started = time.monotonic()
            count = reader.load().count()
            seconds = time.monotonic() - started
        return {"rows": count, "seconds": seconds, **cpu.fields()}

    def subscribe_run(stream: str) -> dict[str, float]:
        """The client alone reading the same rows: a sync subscription per partition to its high watermark."""
        with LiftbridgeClient.from_settings(settings) as client:
            stops = [client.fetch_partition_metadata(stream, p).high_watermark for p in range(partitions)]
            cpu0, started = time.process_time(), time.monotonic()
            count = 0
            for p, stop in enumerate(stops):
                for _ in client.subscribe(stream, partition=p, stop_at=stop):
                    count += 1
            seconds, cpu = time.monotonic() - started, time.process_time() - cpu0
        return {"rows": count, "seconds": seconds, "cpu": cpu}

    def read_function_run(stream: str) -> dict[str, float]:
        """The Spark reader's read function called directly in this process (no Spark): what the
        Python worker does per split, without PySpark's hand-over to the JVM."""
        reader = LiftbridgeDataSource(to_options(settings) | {"stream": stream}).reader(None)  # type: ignore[arg-type]
        splits = reader.partitions()
        cpu0, started = time.process_time(), time.monotonic()
        count = sum(batch.num_rows for split in splits for batch in reader.read(split))
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu0
        return {"rows": count, "seconds": seconds, "cpu": cpu}

    def sink_run(source: str, guarantee: str, checkpoints: str) -> dict[str, float]:
        """Structured Streaming from ``source`` to a fresh stream (availableNow: one micro-batch)."""
        target = new_stream()
        options = to_options(settings)
        df = spark.readStream.format("liftbridge").options(**options).option("stream", source)
        df = df.option("startingOffsets", "earliest").load().selectExpr("key as k", "value as v")
        writer = (
            df.writeStream.format("liftbridge")
            .options(**options)
            .option("stream", target)
            .option("keyColumn", "k")
            .option("valueColumn", "v")
            .option("deliveryGuarantee", guarantee)
            .option("checkpointLocation", os.path.join(checkpoints, target))
            .trigger(availableNow=True)
        )
        with SplitCpu() as cpu:
            started = time.monotonic()
            query = writer.start()
            query.awaitTermination()
            seconds = time.monotonic() - started
        count = sum(p.numInputRows for p in query.recentProgress)
        return {"rows": count, "seconds": seconds, **cpu.fields()}

    out: dict[str, Any] = {"code": os.path.dirname(os.path.dirname(airflow_provider_liftbridge.__file__))}
    names = ("spark", "client", "exactly_once", "read", "subscribe", "read_function")
    for name in (*names, "at_least_once_sink", "exactly_once_sink"):
        out[name] = []
    out["errors"] = {}

    def case(name: str, run: Callable[[], None]) -> None:
        """Run one case; a failure is recorded under its name and the other cases still run."""
        try:
            run()
        except Exception as exc:  # noqa: BLE001 -- reported by the parent, beside the other cases' rows
            out["errors"][name] = f"{type(exc).__name__}: {str(exc)[:1500]}"
            print(f"case {name} failed: {exc!r}", file=sys.stderr)

    def publish_case() -> None:
        spark_run(df.limit(max(rows // 10, 1)))  # warm-up: JIT, Python workers, connections
        client_run(records[: max(rows // 10, 1)])
        for _ in range(rounds):
            out["spark"].append(spark_run(df))
            out["client"].append(client_run(records))
            out["exactly_once"].append(spark_run(df, exactly_once=True))

    source = ""

    def source_case() -> None:
        nonlocal source
        source = new_stream()
        with LiftbridgeClient.from_settings(settings) as client:
            client.fetch_metadata([source])
            client.publish_many(source, records, window=window)
        read_run(source)  # warm-up
        subscribe_run(source)
        read_function_run(source)

    def read_case() -> None:
        for _ in range(rounds):
            out["read"].append(read_run(source))
            out["subscribe"].append(subscribe_run(source))
            out["read_function"].append(read_function_run(source))

    def sink_case() -> None:
        with tempfile.TemporaryDirectory() as checkpoints:
            sink_run(source, "atLeastOnce", checkpoints)  # warm-up
            for _ in range(rounds):  # A B B A ...: the two interleaved
                out["at_least_once_sink"].append(sink_run(source, "atLeastOnce", checkpoints))
                out["exactly_once_sink"].append(sink_run(source, "exactlyOnce", checkpoints))

    if "publish" in cases:
        case("publish", publish_case)
    if "read" in cases or "sink" in cases:
        case("read" if "read" in cases else "sink", source_case)
    if source and "read" in cases:
        case("read", read_case)
    if source and "sink" in cases:
        case("sink", sink_case)
    spark.stop()
    return out


def driver_jvm() -> int:
    """The PID of this process's Spark driver JVM (started by PySpark through ``SparkSubmit``)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() == "java" and "org.apache.spark.deploy.SparkSubmit" in proc.cmdline():
                return proc.pid
        except psutil.Error:
            pass
    raise RuntimeError("no Spark driver JVM under this process")


def cluster_per_core_child(
    address: str, nats_url: str, rows: int, rounds: int, window: int, partitions: int
) -> dict[str, Any]:
    """The issue's last row: ``publish_dataframe`` of the same rows with 2 executors of 1 core on a
    standalone cluster of this machine (a master and 2 workers started from the installed pyspark,
    executors on the Airflow-free archive) against local[2]; ``rounds`` runs of each, alternating,
    a fresh session per run (one JVM: the driver JVM must start in the archive's directory, so
    this runs in a fresh interpreter). CPU of Spark's JVMs and Python processes per run."""
    import airflow_provider_liftbridge

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: tests/spark_cluster.py
    from airflow_provider_liftbridge.spark.executor_env import build_executor_env, spark_config
    from tests.spark_cluster import StandaloneCluster

    settings = ConnectionSettings(brokers=address, nats_servers=nats_url, timeout=60.0)
    out: dict[str, Any] = {"code": os.path.dirname(os.path.dirname(airflow_provider_liftbridge.__file__))}
    out.update(cluster=[], local=[], errors={})

    def new_stream() -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        with LiftbridgeClient.from_settings(settings) as client:
            client.create_stream(name, name, partitions=partitions)
        return name

    def run(master: str, config: dict[str, str], cluster: StandaloneCluster | None) -> dict[str, float]:
        spark = build_spark_session(master, app_name="liftbridge-cluster-per-core", config=config)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            df = spark.range(rows, numPartitions=4).selectExpr(
                "concat('customer-', cast(id % 1000 as string)) as customer",
                "id as order_id",
                "cast(id % 97 as double) * 1.25 as amount",
            )
            df = df.cache()
            df.count()  # the rows exist (and the executors are up) before the clock starts
            stream = new_stream()
            roots = [driver_jvm(), *(cluster.worker_pids if cluster else [])]
            with SplitCpu(roots) as cpu:
                started = time.monotonic()
                count = publish_dataframe(
                    df, stream, settings=settings, key_field="customer", options=PublishOptions(window=window)
                ).count
                seconds = time.monotonic() - started
            return {"rows": count, "seconds": seconds, **cpu.fields()}
        finally:
            spark.stop()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        archive = build_executor_env(root / "liftbridge-executor.tar.gz", compresslevel=1)
        cluster = StandaloneCluster(root / "cluster", workers=2, cores=1, memory="1g").start()
        on_cluster = {
            **spark_config(archive),
            "spark.cores.max": "2",
            "spark.executor.cores": "1",
            "spark.executor.memory": "768m",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
        }
        local = {"spark.pyspark.python": sys.executable, "spark.ui.enabled": "false"}
        try:
            for n in range(rounds + 1):  # the first of each is a warm-up
                for name, master, config in (
                    ("cluster", cluster.master_url, on_cluster),
                    ("local", "local[2]", local),
                ):
                    try:
                        result = run(master, config, cluster if name == "cluster" else None)
                    except Exception as exc:  # noqa: BLE001 -- reported by the parent
                        out["errors"][name] = f"{type(exc).__name__}: {str(exc)[:1500]}"
                        print(f"{name} failed: {exc!r}", file=sys.stderr)
                        continue
                    if n:
                        out[name].append(result)
        finally:
            cluster.stop()
    return out


def per_core(
    codes: list[tuple[str, str]],
    rows: int,
    rounds: int,
    window: int,
    partitions: int,
    cases: set[str],
    master: str = "local[1]",
    brokers: str = "",
    nats: str = "",
) -> int:
    """Run :func:`per_core_child` (and :func:`cluster_per_core_child` for the ``cluster`` case) for
    each ``(label, code tree)`` in turn against one dev server out of process (or the server at
    ``brokers`` / ``nats``), and print markdown tables: medians of the rounds. A child that fails,
    or a case that fails in it, is named below the tables; the others' rows are printed.

    :returns: the exit status: 1 if anything failed, else 0.
    """
    import statistics

    here = Path(__file__).resolve()
    results: list[tuple[str, dict[str, Any]]] = []
    failures: list[str] = []
    load = [os.getloadavg()[0]]

    def child(label: str, code: str, args: list[str]) -> dict[str, Any]:
        # The child, and so its driver JVM and every Python worker, runs in the code tree: PySpark's
        # workers put their working directory first on sys.path, ahead of PYTHONPATH.
        tree = Path(code).resolve()
        env = dict(os.environ, PYTHONPATH=str(tree))
        done = subprocess.run([sys.executable, str(here), *args], env=env, cwd=tree, capture_output=True, text=True)
        load.append(os.getloadavg()[0])
        lines = done.stdout.strip().splitlines()
        if done.returncode or not lines:
            failures.append(f"{label} ({args[0]}): the child exited {done.returncode}:\n{done.stderr[-3000:]}")
            return {}
        found: dict[str, Any] = json.loads(lines[-1])
        failures.extend(f"{label}: case {case} failed: {error}" for case, error in found.pop("errors", {}).items())
        return found

    def run_children(address: str, nats_url: str) -> None:
        common = [address, nats_url, str(rows), str(rounds), str(window), str(partitions)]
        spark_cases = cases - {"cluster"}
        for label, code in codes:
            found: dict[str, Any] = {}
            if spark_cases:
                found |= child(label, code, ["--per-core-child", *common, ",".join(sorted(spark_cases)), master])
            if "cluster" in cases:
                found |= child(label, code, ["--cluster-per-core-child", *common])
            results.append((label, found))

    if brokers:
        run_children(brokers, nats)
    else:
        with tempfile.TemporaryDirectory() as data_dir, DevServerProcess(data_dir=data_dir, brokers=1) as server:
            run_children(server.address, server.nats_url)

    def med(runs: list[dict[str, float]], f: Callable[[dict[str, float]], float]) -> float:
        return statistics.median(f(r) for r in runs)

    print(f"machine: {machine()}; load1 {' → '.join(f'{x:.1f}' for x in load)}")
    print(
        f"{rows:,} JSON rows keyed by customer, {partitions} stream partitions, window {window}, {master}, "
        f"{rounds} interleaved rounds (medians), "
        f"{'server at ' + brokers if brokers else 'dev server out of process'}, NATS path"
    )
    print(
        "µs/row Python worker: the executors' Python workers only; planner s/run: CPU seconds per run of "
        "the driver's Python planner processes (plan, commit, streaming source/sink), a fixed cost per query"
    )
    print()

    def rate(x: dict[str, float]) -> float:
        return x["rows"] / x["seconds"]

    def per_row(key: str) -> Callable[[dict[str, float]], float]:
        return lambda x: 1e6 * x[key] / x["rows"]

    def both(a: list[dict[str, float]], b: list[dict[str, float]], key: str) -> str:
        """The median µs/row of ``key`` for runs ``a`` and ``b``, as "a / b"."""
        return f"{med(a, per_row(key)):.1f} / {med(b, per_row(key)):.1f}"

    def planner(x: dict[str, float]) -> float:
        return x.get("planner_cpu", 0.0)

    def rows_of(*keys: str) -> list[tuple[str, dict[str, Any]]]:
        return [(label, r) for label, r in results if all(r.get(k) for k in keys)]

    if "publish" in cases:
        print(
            "| code | Spark rows/s | client publish_many msgs/s | per core | µs/row Python worker | µs/row JVM "
            "| µs/row client | planner s/run | Spark exactly-once rows/s | exactly-once / at-least-once |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, r in rows_of("spark", "client", "exactly_once"):
            sp, cl, eo = med(r["spark"], rate), med(r["client"], rate), med(r["exactly_once"], rate)
            py, jvm = med(r["spark"], per_row("python_cpu")), med(r["spark"], per_row("jvm_cpu"))
            cpu = med(r["client"], per_row("cpu"))
            cells = f"{sp:,.0f} | {cl:,.0f} | {sp / cl:.2f}× | {py:.1f} | {jvm:.1f} | {cpu:.1f}"
            cells += f" | {med(r['spark'], planner):.2f} | {eo:,.0f} | {eo / sp:.2f}×"
            print(f"| {label} ({r['code']}) | {cells} |")
        print()
    if "read" in cases:
        print(
            "| code | Spark read (count) rows/s | client sync subscribe msgs/s | per core | µs/row Python worker "
            "| µs/row JVM | µs/row client | planner s/run | read function alone, no Spark: rows/s, µs/row |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, r in rows_of("read", "subscribe", "read_function"):
            sp, cl = med(r["read"], rate), med(r["subscribe"], rate)
            py, jvm = med(r["read"], per_row("python_cpu")), med(r["read"], per_row("jvm_cpu"))
            cpu = med(r["subscribe"], per_row("cpu"))
            alone = f"{med(r['read_function'], rate):,.0f}, {med(r['read_function'], per_row('cpu')):.1f}"
            cells = f"{sp:,.0f} | {cl:,.0f} | {sp / cl:.2f}× | {py:.1f} | {jvm:.1f} | {cpu:.1f}"
            print(f"| {label} ({r['code']}) | {cells} | {med(r['read'], planner):.2f} | {alone} |")
        print()
    if "sink" in cases:
        print(
            "| code | streaming sink at-least-once rows/s | exactly-once rows/s | exactly / at-least | "
            "µs/row Python at-least / exactly | µs/row JVM at-least / exactly | planner s/run at-least / exactly |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, r in rows_of("at_least_once_sink", "exactly_once_sink"):
            alo, eo = r["at_least_once_sink"], r["exactly_once_sink"]
            a, e = med(alo, rate), med(eo, rate)
            py = both(alo, eo, "python_cpu")
            jvm = both(alo, eo, "jvm_cpu")
            plan = f"{med(alo, planner):.2f} / {med(eo, planner):.2f}"
            print(f"| {label} ({r['code']}) | {a:,.0f} | {e:,.0f} | {e / a:.2f}× | {py} | {jvm} | {plan} |")
        print()
    if "cluster" in cases:
        print(
            "| code | publish_dataframe, standalone cluster, 2 executors of 1 core: rows/s | local[2] rows/s | "
            "cluster / local[2] | µs/row Python worker cluster / local | µs/row JVM cluster / local |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for label, r in rows_of("cluster", "local"):
            c, lo = med(r["cluster"], rate), med(r["local"], rate)
            py = both(r["cluster"], r["local"], "python_cpu")
            jvm = both(r["cluster"], r["local"], "jvm_cpu")
            print(f"| {label} ({r['code']}) | {c:,.0f} | {lo:,.0f} | {c / lo:.2f}× | {py} | {jvm} |")
        print()
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--per-core-child"]:
        address, nats_url, n, rounds, window, partitions, cases, master = sys.argv[2:10]
        child = per_core_child(
            address, nats_url, int(n), int(rounds), int(window), int(partitions), set(cases.split(",")), master
        )
        print(json.dumps(child))
    elif sys.argv[1:2] == ["--cluster-per-core-child"]:
        address, nats_url, n, rounds, window, partitions = sys.argv[2:8]
        child = cluster_per_core_child(address, nats_url, int(n), int(rounds), int(window), int(partitions))
        print(json.dumps(child))
    elif sys.argv[1:2] == ["--per-core"]:
        per_core_parser = argparse.ArgumentParser(prog="spark_bench.py --per-core")
        per_core_parser.add_argument("--code", action="append", default=[], help="LABEL=DIR: a code tree to measure")
        per_core_parser.add_argument("--rows", type=int, default=200_000)
        per_core_parser.add_argument("--rounds", type=int, default=3)
        per_core_parser.add_argument("--window", type=int, default=4096)
        per_core_parser.add_argument("--partitions", type=int, default=2)
        per_core_parser.add_argument(
            "--cases",
            default="publish,read,sink,cluster",
            help="comma-separated: publish, read, sink, cluster (default: all)",
        )
        per_core_parser.add_argument(
            "--master", default="local[1]", help="e.g. local[2]: tasks side by side (the sink's tasks then interleave)"
        )
        per_core_parser.add_argument("--brokers", default="", help="host:port of a running server (no dev server)")
        per_core_parser.add_argument("--nats", default="", help="its NATS URL (with --brokers)")
        a = per_core_parser.parse_args(sys.argv[2:])
        trees = [tuple(c.split("=", 1)) for c in a.code] or [("this", str(Path(__file__).resolve().parents[1]))]
        for tree in trees:
            if len(tree) != 2 or not (Path(tree[1]) / "airflow_provider_liftbridge").is_dir():
                sys.exit(f"--code takes LABEL=DIR, DIR holding airflow_provider_liftbridge/; got {'='.join(tree)!r}")
        chosen = {c.strip() for c in a.cases.split(",") if c.strip()}
        if not chosen or chosen - {"publish", "read", "sink", "cluster"}:
            sys.exit(f"--cases takes publish, read, sink and cluster, comma-separated; got {a.cases!r}")
        if bool(a.brokers) != bool(a.nats):
            sys.exit("--brokers and --nats go together")
        sys.exit(per_core(trees, a.rows, a.rounds, a.window, a.partitions, chosen, a.master, a.brokers, a.nats))  # type: ignore[arg-type]
    elif sys.argv[1:2] == ["--cluster-child"]:
        address, nats_url, pid, n, stream_n, window = sys.argv[2:8]
        runs = cluster_cases(address, nats_url, int(pid), int(n), int(stream_n), int(window))
        print(json.dumps([dataclasses.asdict(run) for run in runs]))
    else:
        main()
