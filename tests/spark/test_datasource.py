"""The ``liftbridge`` data source on local[2] against the dev server: write, read back, bounds, errors."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge.client import partition_for_key
from airflow_provider_liftbridge.spark import ConnectionSettings, to_options

pytestmark = pytest.mark.spark


def test_read_returns_what_was_written(
    spark: SparkSession, lb_settings: ConnectionSettings, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(3)
    written = spark.range(3000, numPartitions=3).select(
        F.concat(F.lit("k"), (F.col("id") % 50).cast("string")).alias("k"),
        F.col("id").cast("string").cast("binary").alias("v"),
        F.lit("spark").alias("origin"),
    )
    (
        written.write.format("liftbridge")
        .mode("append")
        .options(**to_options(lb_settings))
        .option("stream", stream)
        .option("keyColumn", "k")
        .option("valueColumn", "v")
        .option("headerColumns", "origin")
        .save()
    )

    df = spark.read.format("liftbridge").options(**to_options(lb_settings)).option("stream", stream).load()

    assert df.rdd.getNumPartitions() == 3  # one Spark partition per stream partition
    rows = df.collect()
    assert sorted(int(r.value) for r in rows) == list(range(3000))
    for row in rows:
        assert row.stream == stream
        assert row.key == f"k{int(row.value) % 50}".encode()
        assert row.partition == partition_for_key(bytes(row.key), 3)
        assert row.headers["origin"] == b"spark"
        assert row.timestamp is not None
    per_partition = {p: sorted(r.offset for r in rows if r.partition == p) for p in range(3)}
    assert all(offsets == list(range(len(offsets))) for offsets in per_partition.values())


def test_offset_bounds_and_splits(
    spark: SparkSession, lb_settings: ConnectionSettings, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(1)
    values = spark.range(100, numPartitions=1).select(F.col("id").cast("string").alias("v"))
    values.write.format("liftbridge").mode("append").options(**to_options(lb_settings)).option("stream", stream).option(
        "valueColumn", "v"
    ).save()

    df = (
        spark.read.format("liftbridge")
        .options(**to_options(lb_settings))
        .option("stream", stream)
        .option("startingOffset", "10")
        .option("endingOffset", "59")
        .option("maxRecordsPerSplit", "20")
        .load()
    )

    assert df.rdd.getNumPartitions() == 3
    assert [r.offset for r in df.orderBy("offset").select("offset").collect()] == list(range(10, 60))
    assert {bytes(r.value) for r in df.select("value").collect()} == {str(i).encode() for i in range(10, 60)}


def test_missing_stream_is_a_clear_error(
    spark: SparkSession, lb_settings: ConnectionSettings, stream_name: str
) -> None:
    reader = spark.read.format("liftbridge").options(**to_options(lb_settings)).option("stream", stream_name)
    with pytest.raises(Exception, match=f"stream '{stream_name}' does not exist"):
        reader.load().collect()
    writer = spark.range(3).write.format("liftbridge").mode("append").options(**to_options(lb_settings))
    with pytest.raises(Exception, match=f"stream '{stream_name}' does not exist"):
        writer.option("stream", stream_name).save()


def test_overwrite_is_refused(spark: SparkSession, lb_settings: ConnectionSettings, stream_name: str) -> None:
    writer = spark.range(3).write.format("liftbridge").mode("overwrite").options(**to_options(lb_settings))
    with pytest.raises(Exception, match="append-only"):
        writer.option("stream", stream_name).save()
