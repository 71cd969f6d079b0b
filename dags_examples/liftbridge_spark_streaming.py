"""A bounded Structured Streaming job from one Liftbridge stream into another, run by Airflow.

1. ``create_source`` / ``create_target``: the ``orders`` stream and the ``orders-priced`` stream;
2. ``seed_orders``: publish a few JSON orders to the source (in real life, other systems do);
3. ``price_orders``: a Spark streaming query with ``trigger(availableNow=True)``: read what the
   source holds now (``readStream.format("liftbridge")``, at most 20 messages per partition per
   micro-batch), keep paid orders, add VAT, and publish them to the target
   (``writeStream.format("liftbridge")``, exactly once) — then stop. The checkpoint keeps the
   query's position, so the next run goes on where this one stopped, and a run that failed half
   way re-runs its last micro-batch without duplicating what it had published;
4. ``count_priced``: how many messages the target holds.

Runs end to end on ``local[2]`` and the dev server::

    liftbridge-devserver --port 9292 --nats-port 4222 --data-dir /tmp/lb &
    export AIRFLOW_CONN_LIFTBRIDGE_DEFAULT='{"conn_type": "liftbridge", "host": "127.0.0.1", "port": 9292,
                                             "extra": {"nats_servers": "nats://127.0.0.1:4222"}}'
    airflow dags test liftbridge_spark_streaming

Params: ``source`` / ``target`` stream names, ``checkpoint_root``. ``LIFTBRIDGE_SPARK_CONN`` names
a Spark provider connection to run on (default: ``local[2]``).

**The checkpoint belongs to this DAG and this pair of streams.** The query's checkpoint is
``<checkpoint_root>/<dag id>/<source>-to-<target>``: every run of this DAG with the same streams
goes on from it, and nothing else shares it (a checkpoint left behind by an unrelated demo in a
shared ``/tmp`` folder made a query read nothing). ``checkpoint_root`` empty (the default) means
``<AIRFLOW_HOME>/liftbridge-examples/checkpoints``: local disk, right for ``airflow dags test`` and
deployments on one host. Where runs may land on different workers, or the Spark driver runs on a
cluster, set it to storage every run's driver reaches (``s3a://bucket/checkpoints``,
``hdfs://...``); otherwise a run on another worker starts a new query from ``earliest`` and
publishes every order again. If the streams are deleted and created again, the query fails
and says so, instead of reading nothing: delete the checkpoint folder (or change
``checkpoint_root``) to start over.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pendulum
from airflow.sdk import dag, task

from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator

SPARK_CONN = os.environ.get("LIFTBRIDGE_SPARK_CONN") or None
LOCAL_SPARK = {
    "spark.pyspark.python": sys.executable,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
}
PARTITIONS = 2
ORDERS = [
    {
        "order_id": f"o-{i}",
        "customer": f"customer-{i % 7}",
        "amount": 10.0 + i,
        "status": "cancelled" if i % 4 == 0 else "paid",
    }
    for i in range(60)
]
ORDER_SCHEMA = "order_id string, customer string, amount double, status string"
VAT = 0.2


def checkpoint_location(checkpoint_root: str, dag_id: str, source: str, target: str) -> str:
    """Where the query of ``dag_id`` from ``source`` to ``target`` keeps its checkpoint (see above)."""
    if not checkpoint_root:
        home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
        checkpoint_root = f"{home}/liftbridge-examples/checkpoints"
    return f"{checkpoint_root.rstrip('/')}/{dag_id}/{source}-to-{target}"


def price(orders: Any) -> Any:
    """The transformation: parse the JSON orders, keep the paid ones, add the price with VAT."""
    from pyspark.sql import functions as F

    parsed = orders.select(F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")
    return parsed.where(F.col("status") == "paid").select(
        "order_id",
        "customer",
        "amount",
        F.round(F.col("amount") * (1 + VAT), 2).alias("amount_with_vat"),
    )


@dag(
    dag_id="liftbridge_spark_streaming",
    schedule=None,
    start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
    catchup=False,
    params={"source": "orders", "target": "orders-priced", "checkpoint_root": ""},
    tags=["liftbridge", "spark", "streaming", "example"],
)
def liftbridge_spark_streaming() -> None:
    source = "{{ params.source }}"
    target = "{{ params.target }}"
    create_source = LiftbridgeCreateStreamOperator(task_id="create_source", stream=source, partitions=PARTITIONS)
    create_target = LiftbridgeCreateStreamOperator(task_id="create_target", stream=target, partitions=PARTITIONS)
    seed = LiftbridgePublishOperator(task_id="seed_orders", stream=source, records=ORDERS, key_field="customer")

    @task
    def price_orders(source: str, target: str, checkpoint_root: str, dag: Any = None) -> dict[str, Any]:
        """Run the bounded streaming query; return what it read, how many micro-batches it took and
        where its checkpoint is."""
        from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
        from airflow_provider_liftbridge.operators.spark import spark_settings_from_connection
        from airflow_provider_liftbridge.spark import to_options
        from airflow_provider_liftbridge.spark.session import spark_session_scope

        liftbridge = to_options(LiftbridgeHook().settings)
        checkpoint = checkpoint_location(checkpoint_root, dag.dag_id, source, target)
        master, config = spark_settings_from_connection(SPARK_CONN) if SPARK_CONN else ("local[2]", dict(LOCAL_SPARK))
        with spark_session_scope(master, app_name="liftbridge-streaming", config=config) as spark:
            orders = (
                spark.readStream.format("liftbridge")
                .options(**liftbridge)
                .option("stream", source)
                .option("startingOffsets", "earliest")
                .option("maxMessagesPerPartition", "20")
                .load()
            )
            query = (
                price(orders)
                .writeStream.format("liftbridge")
                .options(**liftbridge)
                .option("stream", target)
                .option("keyColumn", "customer")
                .option("deliveryGuarantee", "exactlyOnce")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            progress = [p for p in query.recentProgress if p.numInputRows]
            return {
                "batches": len(progress),
                "input_rows": sum(p.numInputRows for p in progress),
                "query_id": str(query.id),
                "checkpoint": checkpoint,
            }

    @task
    def count_priced(target: str) -> int:
        """Messages in the target stream (committed, all partitions)."""
        from airflow_provider_liftbridge.hooks.base import LiftbridgeHook

        hook = LiftbridgeHook()
        try:
            return sum(hook.client.fetch_partition_metadata(target, p).high_watermark + 1 for p in range(PARTITIONS))
        finally:
            hook.close()

    job = price_orders(source, target, "{{ params.checkpoint_root }}")
    create_source >> seed >> job
    create_target >> job >> count_priced(target)


liftbridge_spark_streaming()
