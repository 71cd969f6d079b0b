"""Spark publishing benchmark: rows/s from 1 and 2 executor cores, read-back rows/s, driver memory.

    python bench/spark_bench.py [--rows 1000000] [--partitions 2] [--driver-memory 512m]

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
from typing import Any

import psutil
from _measure import cpu_model

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServerProcess
from airflow_provider_liftbridge.spark import ConnectionSettings, build_spark_session, publish_dataframe, to_options


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
                summary = publish_dataframe(df, stream, settings=settings, key_col="customer", window=args.window)
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


if __name__ == "__main__":
    main()
