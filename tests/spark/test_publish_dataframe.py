"""publish_dataframe on local[2] against the dev server: real executors, real gRPC and NATS."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, Message, PublishOptions, partition_for_key
from airflow_provider_liftbridge.spark import (
    ConnectionSettings,
    SparkOptionError,
    SparkPublishError,
    SparkStreamError,
    publish_dataframe,
)

pytestmark = pytest.mark.spark


def read_partition(lb_address: str, stream: str, partition: int) -> list[Message]:
    with LiftbridgeClient(lb_address) as client:
        high = client.fetch_partition_metadata(stream, partition).high_watermark
        if high < 0:
            return []
        return list(client.subscribe(stream, partition=partition, start_at=0, stop_at=high))


def test_every_keyed_row_arrives_once_on_its_key_partition(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(3)
    rows = 6000
    df = spark.range(rows, numPartitions=4).select(
        F.concat(F.lit("order-"), F.col("id").cast("string")).alias("order_id"),
        (F.col("id") * 3).alias("amount"),
    )

    summary = publish_dataframe(
        df, stream, settings=lb_settings, key_field="order_id", options=PublishOptions(window=128)
    )

    assert (summary.count, summary.acknowledged, summary.extra["spark_partitions"]) == (rows, rows, 4)
    seen: Counter[str] = Counter()
    for partition in range(3):
        messages = read_partition(lb_address, stream, partition)
        for message in messages:
            body = json.loads(message.value)
            assert message.key == body["order_id"].encode()
            assert message.partition == partition_for_key(message.key, 3)
            assert body["amount"] == int(body["order_id"].split("-")[1]) * 3
            seen[body["order_id"]] += 1
        span = summary.partitions[partition]
        assert (span.first_offset, span.last_offset, span.count) == (0, len(messages) - 1, len(messages))
    assert len(seen) == rows and set(seen.values()) == {1}
    assert summary.to_dict()["partitions"]["0"]["count"] == summary.partitions[0].count


def test_raw_values_headers_and_round_robin(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(2)
    df = spark.range(1000, numPartitions=2).select(
        F.col("id").cast("string").cast("binary").alias("payload"),
        F.when(F.col("id") % 2 == 0, "even").otherwise("odd").alias("parity"),
    )

    summary = publish_dataframe(df, stream, settings=lb_settings, value_col="payload", header_cols=["parity"])

    messages = read_partition(lb_address, stream, 0) + read_partition(lb_address, stream, 1)
    assert sorted(int(m.value) for m in messages) == list(range(1000))
    assert all(m.headers["parity"] == (b"even" if int(m.value) % 2 == 0 else b"odd") for m in messages)
    assert [summary.partitions[p].count for p in sorted(summary.partitions)] == [500, 500]
    assert summary.bytes == sum(len(m.value) + len(m.headers["parity"]) for m in messages)


def test_missing_stream_is_refused_before_publishing(
    spark: SparkSession, lb_settings: ConnectionSettings, stream_name: str
) -> None:
    with pytest.raises(SparkStreamError, match=f"stream '{stream_name}' does not exist"):
        publish_dataframe(spark.range(3), stream_name, settings=lb_settings)


def test_missing_column_is_refused_before_publishing(
    spark: SparkSession, lb_settings: ConnectionSettings, stream_name: str
) -> None:
    with pytest.raises(SparkOptionError, match="key column 'customer' is not in the DataFrame"):
        publish_dataframe(spark.range(3), stream_name, settings=lb_settings, key_field="customer")


def test_readonly_partition_fails_naming_the_partition(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(2)
    with LiftbridgeClient(lb_address) as client:
        client.set_stream_readonly(stream, partitions=[1])
    df = spark.range(100, numPartitions=1).select(F.col("id").cast("string").alias("v"))

    with pytest.raises(SparkPublishError) as caught:
        # NATS path: the broker drops messages to a read-only partition without an ack, so the
        # failure shows after the ack timeout; keep it short.
        publish_dataframe(df, stream, settings=lb_settings, value_col="v", options=PublishOptions(timeout=2.0))

    error = caught.value
    assert error.stream == stream and len(error.failures) == 1
    assert "stream partition 1" in str(error)
    assert f"partition 1 of stream '{stream}' is read-only" in str(error)
    # What partition 0 acknowledged is really there, and no more than that.
    assert len(read_partition(lb_address, stream, 0)) == error.acked_rows


def test_without_nats_servers_rows_go_over_grpc(
    spark: SparkSession, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(1)
    settings = ConnectionSettings(brokers=lb_address)  # no NATS: pipelined gRPC PublishAsync
    df = spark.range(300, numPartitions=2).select(F.col("id").cast("string").alias("v"))

    all_acks = PublishOptions(ack_policy=AckPolicy.ALL)
    summary = publish_dataframe(df, stream, settings=settings, value_col="v", options=all_acks)

    assert (summary.count, summary.partitions[0].last_offset) == (300, 299)
    assert sorted(int(m.value) for m in read_partition(lb_address, stream, 0)) == list(range(300))


def test_an_executor_publish_imports_no_pandas(lb_address: str, nats_url: str, stream_name: str) -> None:
    """What one Spark partition of a publish runs, in a new interpreter: pyarrow's group_by and
    pa.array of Python values would import pandas (about 170 ms in a fresh Python worker)."""
    import subprocess
    import sys

    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
    code = f"""
import json, sys
import pyarrow as pa
from airflow_provider_liftbridge.spark.arrow_arrays import bytes_array, int_array
from airflow_provider_liftbridge.spark.plan import plan_from_options
from airflow_provider_liftbridge.spark.publish import publish_partition, resolve_plan
from airflow_provider_liftbridge.spark.settings import from_options
options = {{"stream": {stream_name!r}, "brokers": {lb_address!r}, "natsServers": {nats_url!r}, "keyColumn": "k"}}
settings = from_options(options)
plan = resolve_plan(plan_from_options(options), settings)
keys = bytes_array([b"c%d" % (i % 10) for i in range(100)], pa.string())
batch = pa.RecordBatch.from_arrays([keys, int_array(list(range(100)))], names=["k", "v"])
summary = publish_partition(iter([batch]), plan, settings, 0)
assert summary["error"] is None and summary["rows"] == 100, summary
print(json.dumps({{"partitions": summary["partitions"], "pandas": "pandas" in sys.modules}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["pandas"] is False
    # partition -> [first, last, count]
    assert sum(n for _, _, n in out["partitions"].values()) == 100 and set(out["partitions"]) <= {"0", "1"}
