"""Spark publishing with ``compression`` and its write statistics; the data source reads the rows back whole."""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient, PublishOptions, StopPosition
from airflow_provider_liftbridge.client.exactly_once import PRODUCER_HEADER, SEQ_HEADER
from airflow_provider_liftbridge.spark import ConnectionSettings, publish_dataframe
from airflow_provider_liftbridge.spark.plan import PublishPlan
from airflow_provider_liftbridge.spark.publish import publish_partition
from airflow_provider_liftbridge.spark.settings import to_options
from tests.raw_read import stored_messages

pytestmark = pytest.mark.spark


def test_compressed_rows_arrive_whole_with_write_statistics(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(2)
    rows = 2000
    df = spark.range(rows, numPartitions=3).select(
        F.col("id").alias("order_id"), F.concat(F.lit("note for order "), F.col("id").cast("string")).alias("note")
    )
    summary = publish_dataframe(
        df, stream, settings=lb_settings, options=PublishOptions(compression="gzip", window=128)
    )
    stats = summary.to_dict()["write_stats"]
    json.dumps(stats)
    assert stats["acks"] == rows and stats["records_per_second"] > 0
    assert 0 <= stats["to_leader_ms"]["p50"] <= stats["to_leader_ms"]["max"]
    assert stats["to_commit_ms"]["p99"] <= stats["to_commit_ms"]["max"]
    back = spark.read.format("liftbridge").options(**to_options(lb_settings)).option("stream", stream).load()
    values = sorted(json.loads(r["value"])["order_id"] for r in back.select("value").collect())
    assert values == list(range(rows))
    # Stored compressed and marked: a raw gRPC reader (no decompression) sees the header.
    stored = stored_messages(lb_address, stream)
    assert stored[0].headers["content-encoding"] == b"gzip" and not stored[0].value.startswith(b"{")
    with pytest.raises(InvalidArgumentError, match="'gzip', 'zstd' or None"):
        publish_dataframe(df, stream, settings=lb_settings, options=PublishOptions(compression="lz4"))


def test_exactly_once_with_compression_and_its_retry(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    """Exactly-once and compressed: every row stored once, compressed and marked, read back whole;
    a retry of the same producer recognises every stored row by its headers and writes none."""
    stream = make_stream(2)
    rows = 300
    df = spark.range(rows, numPartitions=2).select(
        F.col("id").alias("order_id"), F.concat(F.lit("note for order "), F.col("id").cast("string")).alias("note")
    )
    options = {
        "settings": lb_settings,
        "exactly_once": True,
        "producer_id": "dag/t/run",
        "options": PublishOptions(compression="gzip"),
    }
    first = publish_dataframe(df, stream, partitioner="round_robin", **options)  # type: ignore[arg-type]
    assert (first.count, first.written, first.skipped) == (rows, rows, 0)
    retry = publish_dataframe(df, stream, partitioner="round_robin", **options)  # type: ignore[arg-type]
    assert (retry.count, retry.written, retry.skipped) == (rows, 0, rows)
    stored = [m for p in (0, 1) for m in stored_messages(lb_address, stream, p)]
    assert len(stored) == rows
    assert all(m.headers["content-encoding"] == b"gzip" and not m.value.startswith(b"{") for m in stored)
    assert len({(m.headers[PRODUCER_HEADER], m.headers[SEQ_HEADER]) for m in stored}) == rows  # no duplicates
    back = spark.read.format("liftbridge").options(**to_options(lb_settings)).option("stream", stream).load()
    assert sorted(json.loads(r["value"])["order_id"] for r in back.select("value").collect()) == list(range(rows))


def test_an_executor_resumes_a_dead_try_with_compression(
    lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    """The executor side without a SparkSession: a try that died after one Arrow batch, then the
    retry, both zstd-compressed: the retry skips exactly the stored rows."""
    stream = make_stream(1)
    rows = [b'{"row": %d, "note": "%s"}' % (i, b"fragile " * 20) for i in range(120)]
    batches = [pa.RecordBatch.from_pydict({"value": rows[i : i + 50]}) for i in range(0, len(rows), 50)]
    plan = PublishPlan(stream=stream, value_col="value", partitions=1, options=PublishOptions(compression="zstd"))
    first = publish_partition(batches[:1], plan, lb_settings, spark_partition=0, producer_id="dag/t/run")
    assert (first["rows"], first["skipped"], first["error"]) == (50, 0, None)
    retry = publish_partition(batches, plan, lb_settings, spark_partition=0, producer_id="dag/t/run")
    assert (retry["rows"], retry["skipped"], retry["error"]) == (70, 50, None)
    stored = stored_messages(lb_address, stream)
    assert [int(m.headers[SEQ_HEADER]) for m in stored] == list(range(120))
    assert all(m.headers["content-encoding"] == b"zstd" for m in stored)
    with LiftbridgeClient(lb_address) as client:
        back = list(client.subscribe(stream, start_at=0, stop_at=StopPosition.LATEST))
    assert [m.value for m in back] == rows
