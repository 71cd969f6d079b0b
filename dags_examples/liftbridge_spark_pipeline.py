"""A PySpark pipeline that hands its result to other systems through a Liftbridge stream.

1. ``ensure_input``: make sure an input dataset exists (writes a small CSV of orders if not);
2. ``create_stream``: create the ``orders-enriched`` stream (2 partitions) unless it exists;
3. ``transform_and_publish``: read the CSV with Spark, keep paid orders, add a VAT column, and
   publish every row from the executors, keyed by customer (``LiftbridgeSparkPublishOperator``);
   with gzip-compressed values; its XCom summary carries ``write_stats`` (ack latencies, throughput);
4. ``wait_partition_0`` / ``wait_partition_1``: deferrable ``LiftbridgeOffsetSensor`` per
   partition, until the last offset the publish reported is committed;
5. ``read_back``: ``@task.pyspark`` reads this run's offsets back with ``format("liftbridge")``
   and checks the count and the content.

Runs end to end on ``local[2]`` and the dev server::

    liftbridge-devserver --port 9292 --nats-port 4222 --data-dir /tmp/lb &
    export AIRFLOW_CONN_LIFTBRIDGE_DEFAULT='{"conn_type": "liftbridge", "host": "127.0.0.1", "port": 9292,
                                             "extra": {"nats_servers": "nats://127.0.0.1:4222"}}'
    airflow dags test liftbridge_spark_pipeline

``LIFTBRIDGE_SPARK_INPUT`` overrides the input path; ``LIFTBRIDGE_SPARK_CONN`` names a Spark
provider connection to run on (default: ``local[2]``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pendulum
from airflow.sdk import dag, task

from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor

STREAM = "orders-enriched"
PARTITIONS = 2
INPUT_PATH = os.environ.get("LIFTBRIDGE_SPARK_INPUT", "/tmp/liftbridge-spark-demo/orders.csv")
SPARK_CONN = os.environ.get("LIFTBRIDGE_SPARK_CONN") or None
# Executors must run this interpreter (it has the provider installed); bind Spark to loopback.
LOCAL_SPARK = {
    "spark.master": "local[2]",
    "spark.pyspark.python": sys.executable,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}
VAT = 0.2


def transform_orders(spark: Any, input_path: str) -> Any:
    """The Spark transformation (``dataframe_callable`` of the publish task): paid orders with VAT."""
    from pyspark.sql import functions as F

    orders = spark.read.option("header", "true").option("inferSchema", "true").csv(input_path)
    return orders.where(F.col("status") == "paid").select(
        F.col("order_id").cast("string").alias("order_id"),
        F.col("customer"),
        F.col("amount").cast("decimal(12,2)").alias("amount"),
        F.round(F.col("amount") * (1 + VAT), 2).cast("decimal(12,2)").alias("amount_with_vat"),
    )


@dag(
    dag_id="liftbridge_spark_pipeline",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    tags=["liftbridge", "spark", "example"],
)
def liftbridge_spark_pipeline() -> None:
    @task
    def ensure_input(path: str = INPUT_PATH, rows: int = 1000) -> dict[str, Any]:
        """Write a small orders CSV when the input does not exist; return the path and the paid count."""
        import csv

        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", newline="") as out:
                writer = csv.writer(out)
                writer.writerow(["order_id", "customer", "amount", "status"])
                for i in range(rows):
                    status = "cancelled" if i % 5 == 0 else "paid"
                    writer.writerow([f"o-{i}", f"customer-{i % 37}", f"{(i % 90) + 9.99:.2f}", status])
        with open(path) as source:
            paid = sum(1 for line in source if line.rstrip().endswith(",paid"))
        return {"path": path, "paid": paid}

    source = ensure_input()

    create = LiftbridgeCreateStreamOperator(task_id="create_stream", stream=STREAM, partitions=PARTITIONS)

    publish = LiftbridgeSparkPublishOperator(
        task_id="transform_and_publish",
        stream=STREAM,
        # The DAGs folder is on sys.path, so this module is importable by name where the task runs.
        dataframe_callable="liftbridge_spark_pipeline.transform_orders",
        callable_kwargs={"input_path": "{{ ti.xcom_pull(task_ids='ensure_input')['path'] }}"},
        key_col="customer",
        header_cols=["order_id"],
        compression="gzip",  # compressed on the executors; read_back's data source decompresses
        spark_conn_id=SPARK_CONN,
        spark_config={} if SPARK_CONN else LOCAL_SPARK,
    )

    waits = [
        LiftbridgeOffsetSensor(
            task_id=f"wait_partition_{partition}",
            target_offset=publish.output,
            partition=partition,
            deferrable=True,
            poke_interval=1,
            timeout=300,
        )
        for partition in range(PARTITIONS)
    ]

    @task.pyspark(conn_id=SPARK_CONN, config_kwargs={} if SPARK_CONN else LOCAL_SPARK)
    def read_back(summary: dict[str, Any], source: dict[str, Any], spark: Any = None, sc: Any = None) -> int:
        """Read exactly this run's offsets back into Spark and check count and content."""
        import json

        from pyspark.sql import functions as F

        from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
        from airflow_provider_liftbridge.spark import register, to_options

        settings = LiftbridgeHook().settings
        register(spark)
        this_run = F.lit(False)
        for partition, span in summary["partitions"].items():
            this_run = this_run | (
                (F.col("partition") == int(partition))
                & F.col("offset").between(span["first_offset"], span["last_offset"])
            )
        df = (
            spark.read.format("liftbridge")
            .options(**to_options(settings))
            .option("stream", summary["stream"])
            .load()
            .where(this_run)
        )
        count = df.count()
        if count != summary["count"] or count != source["paid"]:
            raise ValueError(f"read {count} messages back, published {summary['count']}, expected {source['paid']}")
        sample = json.loads(df.select("value").first()["value"])
        if set(sample) != {"order_id", "customer", "amount", "amount_with_vat"}:
            raise ValueError(f"unexpected message body {sample}")
        print(f"read back {count} messages from {summary['stream']}, e.g. {sample}")
        return count

    [source, create] >> publish
    waits >> read_back(publish.output, source)


liftbridge_spark_pipeline()
