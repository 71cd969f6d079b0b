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
standalone cluster of this machine against local[2], each on a session held for all its rounds
(warm JVMs; each session's first, cold run apart). Each ``--code`` tree is measured in its own
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
import shutil
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


def jvm_thread_role(pid: int, tid: int) -> str:
    """``"jit"`` for a HotSpot JIT compiler thread, ``"gc"`` for a garbage collector's, else ``""``
    (from the thread's name, which Linux cuts to 15 characters: "C2 CompilerThre", "GC Thread#0")."""
    name = read_text(f"/proc/{pid}/task/{tid}/comm")
    if name.startswith(("C1 CompilerThre", "C2 CompilerThre")):
        return "jit"
    if name.startswith(("GC Thread", "G1 ")):
        return "gc"
    return ""


#: Clock ticks per second, the unit of ``/proc/<pid>/stat``'s CPU times.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(path: str) -> tuple[int, float] | None:
    """The parent PID and CPU seconds (user + system) in a ``/proc/<pid>[/task/<tid>]/stat`` file,
    or None if the process or thread has ended."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    # After "pid (comm) ": state, ppid, ... utime and stime are the 12th and 13th fields; comm may
    # hold spaces and parentheses, so it is skipped by its last ")".
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_of(roots: set[int], parents: dict[int, int]) -> list[int]:
    """``roots`` that are alive and all their descendants, given each process's parent."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [pid for pid in roots if pid in parents]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def machine_cpu() -> tuple[float, float]:
    """Core-seconds the whole machine has spent busy and idle (idle + iowait) since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / CLOCK_TICKS, idle / CLOCK_TICKS


def read_text(path: str) -> str:
    """A ``/proc`` file's text without its trailing newline, or "" if the process has ended."""
    try:
        with open(path, errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


class SplitCpu:
    """CPU seconds of Spark's JVMs (local mode: the driver, which is the executor too; on a
    cluster also the workers' executors) and, apart, of their Python processes: the executors'
    workers and the driver's planners (:func:`python_role`); and, inside the JVMs, the JIT compiler
    and garbage collector threads (:func:`jvm_thread_role`). Processes are sampled every 0.1 s, JVM
    threads every 1 s, so those that end are counted up to their last sample.

    Each sample reads ``/proc`` once, whatever the number of roots, and reads only the JIT and GC
    threads' times: the sampler runs on the cores it measures, and a cluster has five JVMs to
    local mode's one, so a sampler whose cost grew with them would slow the cluster side (psutil's
    ``children(recursive=True)`` per root and ``threads()`` per JVM cost 0.4-0.5 µs a published row
    on the cluster side against 0.2 in local mode). Its own CPU is :attr:`sampler_cpu`.

    :param roots: the processes whose trees are counted; by default this process's JVMs.
    """

    def __init__(self, roots: list[int] | None = None) -> None:
        if roots is None:
            roots = [c.pid for c in psutil.Process().children(recursive=True) if c.name() == "java"]
        self._roots = set(roots)
        self._cpu: dict[int, float] = {}
        self._kind: dict[int, str] = {}
        # JVM threads by (pid, tid): CPU seconds of the JIT and GC ones, and every seen thread's role
        # ("jit", "gc" or "" for the rest), read once per thread.
        self._threads: dict[tuple[int, int], float] = {}
        self._thread_role: dict[tuple[int, int], str] = {}
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        #: CPU seconds this sampler's thread spent sampling (it runs on the cores being measured).
        self.sampler_cpu = 0.0

    def _sample(self, threads: bool = True) -> None:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (found := proc_stat(f"/proc/{entry.name}/stat")) is not None:
                parents[int(entry.name)], cpu[int(entry.name)] = found
        for pid in tree_of(self._roots, parents):
            if pid not in self._kind:
                comm = read_text(f"/proc/{pid}/comm")
                cmdline = read_text(f"/proc/{pid}/cmdline").split("\0")
                self._kind[pid] = "jvm" if comm == "java" else python_role(cmdline)
            self._cpu[pid] = cpu[pid]
            if threads and self._kind[pid] == "jvm":
                self._sample_threads(pid)

    def _sample_threads(self, pid: int) -> None:
        try:
            tids = [int(t.name) for t in os.scandir(f"/proc/{pid}/task")]
        except OSError:
            return
        for tid in tids:
            key = (pid, tid)
            if key not in self._thread_role:
                self._thread_role[key] = jvm_thread_role(pid, tid)
            if self._thread_role[key] and (found := proc_stat(f"/proc/{pid}/task/{tid}/stat")) is not None:
                self._threads[key] = found[1]

    def _run(self) -> None:
        # Threads once a second (a JVM has ~100; reading them all 10 times a second would load the
        # machine being measured): a compiler thread HotSpot retires meanwhile loses < 1 s of CPU.
        started = time.thread_time()
        while not self._stop.wait(0.1):
            self._samples += 1
            self._sample(threads=self._samples % 10 == 0)
        self.sampler_cpu = time.thread_time() - started

    def __enter__(self) -> SplitCpu:
        self._sample()
        self._start = dict(self._cpu)
        self._threads_start = dict(self._threads)
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

    def jvm_threads(self) -> dict[str, float]:
        """CPU seconds since the start of the JVMs' JIT compiler threads and garbage collector threads."""
        out = {"jit": 0.0, "gc": 0.0}
        for key, cpu in self._threads.items():
            role = self._thread_role[key]
            if role:
                out[role] += cpu - self._threads_start.get(key, 0.0)
        return out

    def fields(self) -> dict[str, float]:
        """:meth:`by_kind` and :meth:`jvm_threads` under the names the per-core results use."""
        kinds, threads = self.by_kind(), self.jvm_threads()
        return {
            "jvm_cpu": kinds["jvm"],
            "python_cpu": kinds["worker"],
            "planner_cpu": kinds["planner"],
            "jit_cpu": threads["jit"],
            "gc_cpu": threads["gc"],
            "sampler_cpu": self.sampler_cpu,
        }


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


#: The two sides of the ``cluster`` case: 2 executors of 1 core on a standalone cluster of this
#: machine, and local[2].
HELD_SIDES = ("cluster", "local")


def held_session_child(address: str, nats_url: str, rows: int, window: int, partitions: int, side: str) -> None:
    """One side of the issue's last row (``publish_dataframe`` of the same rows), on one session
    held for all of its runs: ``cluster`` (a master and 2 one-core workers started from the installed
    pyspark, 2 executors of 1 core on the Airflow-free archive) or ``local`` (local[2]). Counts the
    rows once, prints ``READY``, then publishes them to a fresh stream each time ``run`` is read from
    stdin, or runs :func:`encode_in_python` on them for ``control``, and prints ``RESULT <json>``
    (rows, seconds, CPU of Spark's JVMs and Python processes, of the machine), until ``stop`` or
    the end of stdin. Errors go to stderr and end the process.

    The session is held because a session on a standalone cluster is an application with executor
    JVMs of its own: a session per run would measure the cluster's executors cold (class loading,
    JIT compilation) against local[2]'s driver JVM, which is also its executor and stays warm across
    sessions in one process. The parent alternates the two sides' runs; each side's first run is
    its cold one."""
    import airflow_provider_liftbridge

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo: tests/spark_cluster.py
    from airflow_provider_liftbridge.spark.executor_env import build_executor_env, driver_directory_path, spark_config
    from tests.spark_cluster import StandaloneCluster

    settings = ConnectionSettings(brokers=address, nats_servers=nats_url, timeout=60.0)
    code = os.path.dirname(os.path.dirname(airflow_provider_liftbridge.__file__))
    with tempfile.TemporaryDirectory() as tmp:
        cluster: StandaloneCluster | None = None
        config = {"spark.ui.enabled": "false"}
        if side == "cluster":
            archive = build_executor_env(Path(tmp) / "liftbridge-executor.tar.gz", compresslevel=1)
            cluster = StandaloneCluster(Path(tmp) / "cluster", workers=2, cores=1, memory="1g").start()
            master = cluster.master_url
            config |= {
                **spark_config(archive),
                "spark.cores.max": "2",
                "spark.executor.cores": "1",
                "spark.executor.memory": "768m",
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
            }
        else:
            master = "local[2]"
            config["spark.pyspark.python"] = sys.executable
        try:
            spark = build_spark_session(master, app_name=f"liftbridge-held-{side}", config=config)
            spark.sparkContext.setLogLevel("ERROR")
            df = spark.range(rows, numPartitions=4).selectExpr(
                "concat('customer-', cast(id % 1000 as string)) as customer",
                "id as order_id",
                "cast(id % 97 as double) * 1.25 as amount",
            )
            # Not cached: cached rows make each task wait (spark.locality.wait, 3 s) for the executor
            # holding its block, and the count below had put 3 of the 4 blocks on one executor, so
            # one executor published 3/4 of the rows. Generated in the publish stage, on both sides
            # (a few JVM µs per row), the tasks go to whichever executor is free.
            df.count()  # the executors are up, and the generation compiled, before any run
            roots = [driver_jvm(), *(cluster.worker_pids if cluster else [])]
            print(f"READY {json.dumps(executor_tasks(spark))}", flush=True)
            for line in sys.stdin:
                command = line.strip()
                if command not in ("run", "control"):
                    break
                name = f"bench-{uuid.uuid4().hex[:8]}" if command == "run" else None
                if name is not None:
                    with LiftbridgeClient.from_settings(settings) as client:
                        client.create_stream(name, name, partitions=partitions)
                tasks = executor_tasks(spark)
                busy, idle = machine_cpu()
                with SplitCpu(roots) as cpu:
                    started = time.monotonic()
                    if name is not None:
                        options = PublishOptions(window=window)
                        count = publish_dataframe(
                            df, name, settings=settings, key_field="customer", options=options
                        ).count
                    else:
                        count = encode_in_python(df)
                    seconds = time.monotonic() - started
                busy_after, idle_after = machine_cpu()
                done = executor_tasks(spark)
                result = {"code": code, "rows": count, "seconds": seconds, **cpu.fields()}
                result |= {"machine_cpu": busy_after - busy, "machine_idle": idle_after - idle}
                result["tasks"] = {e: [n - tasks.get(e, [0, 0])[0], blocks] for e, (n, blocks) in done.items()}
                print("RESULT " + json.dumps(result), flush=True)
            spark.stop()
        finally:
            if cluster is not None:
                cluster.stop()
                # The driver's unpacked copy of the archive (~200 MB, kept by build_spark_session).
                shutil.rmtree(driver_directory_path(archive), ignore_errors=True)


def encode_in_python(df: Any) -> int:
    """The control job of the ``cluster`` case: the same rows through ``mapInArrow`` into the
    executors' Python workers, each row JSON-encoded there and nothing published. It is Spark's
    own cost of a Python-heavy job on each side, without the provider: how a standalone cluster
    of this machine compares with local[2] for any such job. Returns the rows seen."""

    # Nested, so that cloudpickle ships it by value (the executors cannot import this script).
    def encode(batches: Any) -> Any:
        import json

        import pyarrow as pa

        seen = 0
        for batch in batches:
            for row in batch.to_pylist():
                json.dumps(row, separators=(",", ":"))
            seen += batch.num_rows
        yield pa.RecordBatch.from_pydict({"rows": [seen]})

    return sum(row["rows"] for row in df.mapInArrow(encode, "rows long").collect())


def executor_tasks(spark: Any) -> dict[str, list[int]]:
    """Per executor (``driver`` in local mode), from Spark's status store: tasks completed so far
    and cached blocks held (how a run's tasks were shared out)."""
    executors = spark.sparkContext._jsc.sc().statusStore().executorList(True)
    out = {}
    for i in range(executors.size()):
        e = executors.apply(i)
        out[e.id()] = [e.completedTasks(), e.rddBlocks()]
    return out


class HeldSession:
    """A :func:`held_session_child` of one side, started in a code tree and driven over its stdin.

    :param side: ``cluster`` or ``local``.
    :param tree: the code tree the child (and its JVMs and Python workers) runs in.
    :param args: the child's arguments after its flag.
    :param log: where its stderr goes.
    """

    def __init__(self, side: str, tree: Path, args: list[str], log: Path) -> None:
        self.side = side
        self._log = log
        with log.open("w") as err:
            self._process = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--held-session-child", *args, side],
                env=dict(os.environ, PYTHONPATH=str(tree)),
                cwd=tree,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._answer("READY")

    def _answer(self, marker: str) -> str:
        """The rest of the child's next stdout line that starts with ``marker``.

        :raises RuntimeError: the child exited first (with the tail of its stderr).
        """
        assert self._process.stdout is not None
        for line in self._process.stdout:
            if line.startswith(marker):
                return line[len(marker) :].strip()
        code = self._process.wait()
        tail = self._log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the {self.side} side exited {code} before {marker}:\n{tail}")

    def run(self, command: str = "run") -> dict[str, Any]:
        """One publish of the rows to a fresh stream (``run``), or the control job
        (``control``, :func:`encode_in_python`): its result."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"{command}\n")
        self._process.stdin.flush()
        found: dict[str, Any] = json.loads(self._answer("RESULT"))
        return found

    def stop(self) -> None:
        """Ask the child to stop, and wait for it (killed after 120 s)."""
        try:
            assert self._process.stdin is not None
            self._process.stdin.write("stop\n")
            self._process.stdin.close()
        except OSError:
            pass  # it exited already
        try:
            self._process.wait(120)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def held_rounds(code: str, args: list[str], rounds: int) -> dict[str, Any]:
    """The ``cluster`` case for one code tree: both sides' sessions started one after the other
    (each waits for the other to be ready), then ``rounds + 1`` rounds: a publish on each side in
    turn, then the control job (:func:`encode_in_python`) on each, kept as ``<side>_control``. The
    first round of each (cold JVMs on its path) is kept apart as ``<side>_first`` and
    ``<side>_control_first``.

    :raises RuntimeError: a side failed (its stderr's tail in the message).
    """
    tree = Path(code).resolve()
    out: dict[str, Any] = {"code": str(tree), **{side + job: [] for side in HELD_SIDES for job in ("", "_control")}}
    with tempfile.TemporaryDirectory() as logs:
        sides: list[HeldSession] = []
        try:
            for side in HELD_SIDES:
                sides.append(HeldSession(side, tree, args, Path(logs) / f"{side}.err"))
            for n in range(rounds + 1):
                for command, suffix in (("run", ""), ("control", "_control")):
                    for held in sides:
                        result = held.run(command)
                        keys = ("python_cpu", "jvm_cpu", "jit_cpu", "gc_cpu", "sampler_cpu", "machine_cpu")
                        per_row = {k: 1e6 * result[k] / result["rows"] for k in keys}
                        print(
                            f"  {held.side} {command} {n}: {result['rows'] / result['seconds']:,.0f} rows/s, µs/row "
                            + ", ".join(f"{k} {v:.1f}" for k, v in per_row.items())
                            + f"; tasks, cached blocks by executor {result['tasks']}",
                            file=sys.stderr,
                        )
                        if n:
                            out[held.side + suffix].append(result)
                        else:
                            out[f"{held.side}{suffix}_first"] = result
        finally:
            for held in sides:
                held.stop()
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
    """Run :func:`per_core_child` (and :func:`held_rounds` for the ``cluster`` case) for
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
                try:
                    found |= held_rounds(code, [address, nats_url, str(rows), str(window), str(partitions)], rounds)
                except RuntimeError as exc:
                    failures.append(f"{label} (cluster): {exc}")
                load.append(os.getloadavg()[0])
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
            "Each side on one session held for all its runs (warm JVMs); the first run of each session apart "
            "(cold: the executors' JIT and class loading on the publish path). JIT / GC: the JVMs' compiler "
            "and garbage collector threads, part of the JVM column. Machine: every process's CPU (the server's, "
            "the sampler's too); idle: core-seconds the machine's cores were idle during a run."
        )
        print(
            "| code | publish_dataframe, standalone cluster, 2 executors of 1 core: rows/s | local[2] rows/s | "
            "cluster / local[2] | µs/row Python worker cluster / local | µs/row JVM cluster / local | "
            "µs/row JIT cluster / local | µs/row GC cluster / local | µs/row machine cluster / local | "
            "idle core-s per run cluster / local | by round cluster / local | first run: rows/s cluster / local, "
            "µs/row JVM cluster / local |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
        for label, r in rows_of("cluster", "local"):
            c, lo = med(r["cluster"], rate), med(r["local"], rate)
            cells = [f"{c:,.0f}", f"{lo:,.0f}", f"{c / lo:.2f}×"]
            keys = ("python_cpu", "jvm_cpu", "jit_cpu", "gc_cpu", "machine_cpu")
            cells += [both(r["cluster"], r["local"], key) for key in keys]
            idle = [med(r[side], lambda x: x.get("machine_idle", 0.0)) for side in ("cluster", "local")]
            cells.append(f"{idle[0]:.2f} / {idle[1]:.2f}")
            cells.append(", ".join(f"{rate(a) / rate(b):.2f}" for a, b in zip(r["cluster"], r["local"], strict=True)))
            first = [r.get("cluster_first"), r.get("local_first")]
            if all(first):
                runs = [[f] for f in first]
                cells.append(f"{rate(first[0]):,.0f} / {rate(first[1]):,.0f}, {both(*runs, 'jvm_cpu')}")
            else:
                cells.append("")
            print(f"| {label} ({r['code']}) | {' | '.join(cells)} |")
        print()
        print(
            "The control: the same rows through mapInArrow into the executors' Python workers, JSON-encoded "
            "there, nothing published (encode_in_python): Spark's own cluster / local[2] for such a job, "
            "on the same sessions, alternating with the runs above."
        )
        print(
            "| code | control, standalone cluster: rows/s | local[2] rows/s | cluster / local[2] | by round "
            "cluster / local | µs/row Python worker cluster / local | µs/row JVM cluster / local | "
            "µs/row machine cluster / local |"
        )
        print("|---|---:|---:|---:|---|---:|---:|---:|")
        for label, r in rows_of("cluster_control", "local_control"):
            runs = r["cluster_control"], r["local_control"]
            c, lo = med(runs[0], rate), med(runs[1], rate)
            cells = [f"{c:,.0f}", f"{lo:,.0f}", f"{c / lo:.2f}×"]
            cells.append(", ".join(f"{rate(a) / rate(b):.2f}" for a, b in zip(*runs, strict=True)))
            cells += [both(*runs, key) for key in ("python_cpu", "jvm_cpu", "machine_cpu")]
            print(f"| {label} ({r['code']}) | {' | '.join(cells)} |")
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
    elif sys.argv[1:2] == ["--held-session-child"]:
        address, nats_url, n, window, partitions, side = sys.argv[2:8]
        held_session_child(address, nats_url, int(n), int(window), int(partitions), side)
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
