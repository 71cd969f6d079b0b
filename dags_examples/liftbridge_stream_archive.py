"""Every hour, take what arrived on a stream, transform it, archive it to Parquet exactly once,
and read the archive with Spark.

1. ``create_streams``: the ``shop-orders`` stream (2 partitions) and ``shop-orders-clean`` (2);
2. ``sample_orders``: publishes ``params.sample_orders`` new orders, standing in for the
   producers a real deployment has (set it to 0 there); exactly once per run, so running the
   same DAG run again adds none;
3. ``clean_orders``: ``LiftbridgeConsumeOperator`` reads what arrived on ``shop-orders`` since the
   last run (cursor ``shop-orders-clean``) and hands it, 200 at a time, to :func:`clean_batch`,
   which drops cancelled orders, adds VAT, and publishes the rest to ``shop-orders-clean`` keyed by
   customer; the cursor moves after each batch is published. An order that is not JSON (the
   sample has one in 250, cut short as by a producer's bug) goes to ``shop-orders-dead-letters``
   with the error in its headers, and the run goes on: the Liftbridge view in the Airflow UI
   (docs/ui.md) shows it;
4. ``archive_orders``: ``LiftbridgeStreamToFileOperator`` writes what arrived on
   ``shop-orders-clean`` to Parquet files under ``params.archive_url``, one file per 250 messages
   and partition (small here, to show several files; ~1,000,000 suits production), JSON fields
   as columns; it updates the ``liftbridge_shop_orders_archive`` asset (a downstream DAG can be
   scheduled on it). With ``params.simulate_crash`` (the default) it SIGKILLs its own process
   once per run, after its second file, as a worker dying mid-run: the retry rewrites that file
   under the same name and goes on, so every message is in the archive exactly once;
5. ``spark_report``: ``@task.pyspark`` reads the run's files (the archive task's XCom), checks that
   no (partition, offset) is there twice and none of the run's range is missing, and sums the
   revenue per customer.

**What it assumes about disks:** tasks hand each other only XCom (the archive's file URLs). The
archive is ``params.archive_url``: any URL Airflow's ``ObjectStoragePath`` knows (``s3://bucket/
orders``, with ``storage_conn_id`` on the archive task, and Spark reading it as ``s3a://``), which
the archive task's worker and the Spark job must both reach. The default, ``file://`` under
``$AIRFLOW_HOME/liftbridge-archive``, is right only where they share a disk: one machine,
``local[N]`` Spark (the demo, ``airflow dags test``, a LocalExecutor).

**The simulated crash:** under a scheduler the task process is SIGKILLed and Airflow retries it
(``retries=1``), once per DAG run. ``airflow dags test`` runs tasks in its own process, so the
kill would end the command, and each command is a new run (and a new crash): give it
``-c '{"simulate_crash": false}'``. ``scripts/demo.py`` shows the crash with ``dag.test()``: it
runs one fixed DAG run, and after the kill runs that same run again, as Airflow's retry would.

Runs on the dev server and ``local[2]``::

    liftbridge-devserver --port 9292 --nats-port 4222 --data-dir /tmp/lb &
    export AIRFLOW_CONN_LIFTBRIDGE_DEFAULT='{"conn_type": "liftbridge", "host": "127.0.0.1", "port": 9292}'
    airflow dags test liftbridge_stream_archive -c '{"simulate_crash": false}'

``LIFTBRIDGE_SPARK_CONN`` names a Spark provider connection to run on (default: ``local[2]``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from hashlib import sha1
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import Asset, ObjectStoragePath, dag, task

from airflow_provider_liftbridge.client import KeyPartitioner, Message, Record
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

ORDERS = "shop-orders"
CLEAN = "shop-orders-clean"
DEAD_LETTERS = "shop-orders-dead-letters"
PARTITIONS = 2
VAT = 0.2
DEFAULT_ARCHIVE = (Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "liftbridge-archive").as_uri()
ARCHIVE = Asset("liftbridge_shop_orders_archive", uri=f"{DEFAULT_ARCHIVE}/{CLEAN}")
SPARK_CONN = os.environ.get("LIFTBRIDGE_SPARK_CONN") or None
LOCAL_SPARK = {
    "spark.master": "local[2]",
    "spark.pyspark.python": sys.executable,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}


def sample_orders(count: Any, run_id: str) -> list[Record]:
    """``count`` orders of this run (every 5th one cancelled), keyed by order id; one in 250 (a
    cancelled one) is cut short, as a producer's bug would, and is not JSON."""
    records = []
    for i in range(int(count)):
        order = {
            "order_id": f"{run_id}-{i}",
            "customer": f"customer-{i % 7}",
            "amount": round(10 + (i % 90) * 1.25, 2),
            "status": "cancelled" if i % 5 == 0 else "paid",
        }
        value = json.dumps(order).encode()
        if i % 250 == 0:
            value = value[: len(value) // 2]
        records.append(Record(value=value, key=order["order_id"].encode()))
    return records


def clean_batch(orders: list[Message]) -> None:
    """The transformation (``apply_function_batch`` of ``clean_orders``): paid orders with VAT,
    published to the clean stream keyed by customer, acknowledged before the batch counts as done
    (so the cursor never passes an order that is not in the clean stream)."""
    clean = []
    for message in orders:
        order = message.value  # decoded JSON: value_format="json"
        if order["status"] != "paid":
            continue
        order["amount_with_vat"] = round(order["amount"] * (1 + VAT), 2)
        order["source"] = f"{message.partition}/{message.offset}"
        clean.append(Record(value=json.dumps(order).encode(), key=order["customer"].encode()))
    if clean:
        hook = LiftbridgeHook()
        try:
            hook.client.publish_many(CLEAN, clean, partitioner=KeyPartitioner())
        finally:
            hook.close()


_FILES_SEEN = {"count": 0}


def simulate_crash(entry: dict[str, Any], enabled: Any, run_id: str) -> None:
    """``on_file`` of ``archive_orders``: with ``enabled``, SIGKILL this process once its second
    file is complete (renamed into place, its position not yet committed), as a worker dying
    mid-run would; once per DAG run (a marker beside the files says it happened, so the retry,
    wherever it runs, goes through)."""
    _FILES_SEEN["count"] += 1
    if str(enabled).lower() != "true" or _FILES_SEEN["count"] != 2:
        return
    marker = ObjectStoragePath(entry["path"]).parent / f".simulated-crash-{sha1(run_id.encode()).hexdigest()[:16]}"
    if marker.exists():
        return
    marker.write_text(run_id)
    print(f"simulated crash: SIGKILL after writing {entry['path']}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


@dag(
    dag_id="liftbridge_stream_archive",
    schedule="@hourly",
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={"sample_orders": 1000, "simulate_crash": True, "archive_url": f"{DEFAULT_ARCHIVE}/{CLEAN}"},
    tags=["liftbridge", "spark", "example"],
)
def liftbridge_stream_archive() -> None:
    create = LiftbridgeCreateStreamOperator.partial(task_id="create_streams", partitions=PARTITIONS).expand(
        stream=[ORDERS, CLEAN]
    )

    produce = LiftbridgePublishOperator(
        task_id="sample_orders",
        stream=ORDERS,
        # Imported by name where the task runs: Airflow puts the DAGs folder on sys.path.
        records_callable="liftbridge_stream_archive.sample_orders",
        records_callable_kwargs={"count": "{{ params.sample_orders }}", "run_id": "{{ run_id }}"},
        partitioner="key",
        exactly_once=True,
    )

    clean = LiftbridgeConsumeOperator(
        task_id="clean_orders",
        stream=ORDERS,
        read=SinceLastRun("shop-orders-clean"),
        value_format="json",
        apply_function_batch=clean_batch,
        batch_size=200,
        # What is not JSON goes aside, with why; the rest goes on.
        dead_letters=DeadLetterStream(DEAD_LETTERS, create=True),
    )

    archive = LiftbridgeStreamToFileOperator(
        task_id="archive_orders",
        stream=CLEAN,
        read=SinceLastRun("shop-orders-archive"),
        path="{{ params.archive_url }}",
        format="parquet",
        value_format="json",
        batch_size=250,  # messages per file
        on_file=simulate_crash,
        on_file_kwargs={"enabled": "{{ params.simulate_crash }}", "run_id": "{{ run_id }}"},
        outlets=[ARCHIVE],
        retries=1,
        retry_delay=timedelta(seconds=1),
    )

    @task.pyspark(conn_id=SPARK_CONN, config_kwargs={} if SPARK_CONN else LOCAL_SPARK)
    def spark_report(archived: dict[str, Any], spark: Any = None, sc: Any = None) -> dict[str, Any]:
        """Read this run's archive files with Spark; check each planned offset is there once."""
        from pyspark.sql import functions as F

        files = archived["files"]
        if not files:
            return {"files": 0, "rows": 0, "revenue": {}}
        paths = [f["path"].replace("s3://", "s3a://", 1) for f in files]
        df = spark.read.parquet(*paths)
        rows = df.count()
        distinct = df.select("partition", "offset").distinct().count()
        expected = sum(f["last_offset"] - f["first_offset"] + 1 for f in files)
        if rows != distinct:
            raise ValueError(f"{rows - distinct} message(s) are in the archive more than once")
        if rows != expected:
            raise ValueError(f"the archive holds {rows} of the run's {expected} planned messages")
        revenue = {
            r["customer"]: float(r["revenue"])
            for r in df.groupBy("customer").agg(F.round(F.sum("amount_with_vat"), 2).alias("revenue")).collect()
        }
        print(f"archive: {len(files)} file(s), {rows} messages, each once; revenue {revenue}")
        return {"files": len(files), "rows": rows, "revenue": dict(sorted(revenue.items()))}

    create >> produce >> clean >> archive
    spark_report(archive.output)


liftbridge_stream_archive()
