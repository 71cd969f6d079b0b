"""Structured Streaming in and out of Liftbridge on the standalone test cluster: the source's
offsets, rate limit, start positions, restart from a checkpoint, clear errors; the sink's
exactly-once and at-least-once guarantees across a replayed micro-batch."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.spark import ConnectionSettings, to_options
from airflow_provider_liftbridge.spark.streaming import cap_offsets
from tests.spark.streaming_support import (
    Row3,
    assert_each_message_once,
    forget_last_commit,
    publish,
    read_all,
    run_available_now,
    source,
)

pytestmark = pytest.mark.spark


def test_cap_offsets_limits_each_partition_and_the_total_fairly() -> None:
    start = {"0": 10, "1": 0, "2": 5}
    latest = {"0": 110, "1": 3, "2": 5}
    assert cap_offsets(start, latest, None, None) == latest
    assert cap_offsets(start, latest, 20, None) == {"0": 30, "1": 3, "2": 5}
    # 10 rows across two partitions with data: partition 1 has only 3, partition 0 takes the rest.
    assert cap_offsets(start, latest, None, 10) == {"0": 17, "1": 3, "2": 5}
    assert cap_offsets(latest, latest, 5, 5) == latest  # nothing new: the start comes back


def test_source_rate_limit_and_restart_from_the_checkpoint(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
) -> None:
    stream = make_stream(2)
    publish(lb_address, stream, range(250), 2)
    checkpoint = tmp_path / "checkpoint"
    df = source(spark, lb_settings, stream, startingOffsets="earliest", maxMessagesPerPartition="50")

    first = run_available_now(df, checkpoint)

    # 125 messages per partition, 50 per trigger: 3 micro-batches.
    assert sorted(first) == [0, 1, 2]
    for rows in first.values():
        per_partition = Counter(p for p, _, _ in rows)
        assert max(per_partition.values()) <= 50
    assert_each_message_once(first, 250, partitions=2)

    # New messages, and the last batch lost its commit (a crash after the sink wrote it).
    publish(lb_address, stream, range(250, 300), 2)
    replayed = forget_last_commit(checkpoint)
    second = run_available_now(df, checkpoint)

    # The replayed batch reads the very same offsets (from the offset log), then the query goes on.
    assert min(second) == replayed and second[replayed] == first[replayed]
    assert_each_message_once({**first, **second}, 300, partitions=2)


def test_start_positions(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
) -> None:
    stream = make_stream(1)
    publish(lb_address, stream, range(10), 1)
    time.sleep(0.05)
    middle = time.time()
    time.sleep(0.05)
    publish(lb_address, stream, range(10, 20), 1)

    def values(batches: dict[int, list[Row3]]) -> list[int]:
        return sorted(int(v) for rows in batches.values() for _, _, v in rows)

    by_time = source(spark, lb_settings, stream, startingTimestamp=str(int(middle * 1000)))
    assert values(run_available_now(by_time, tmp_path / "t")) == list(range(10, 20))
    by_offset = source(spark, lb_settings, stream, startingOffsets='{"0": 15}')
    assert values(run_available_now(by_offset, tmp_path / "o")) == list(range(15, 20))
    latest = source(spark, lb_settings, stream)  # the default: only what comes after the start
    assert values(run_available_now(latest, tmp_path / "l")) == []
    publish(lb_address, stream, range(20, 23), 1)
    assert values(run_available_now(latest, tmp_path / "l")) == [20, 21, 22]


def test_deleted_and_paused_streams_are_clear_errors(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
) -> None:
    stream = make_stream(2)
    publish(lb_address, stream, range(10), 2)
    df = source(spark, lb_settings, stream, startingOffsets="earliest")
    assert len(run_available_now(df, tmp_path / "c")) == 1

    with LiftbridgeClient(lb_address) as client:
        client.pause_stream(stream, partitions=[1])
    with pytest.raises(StreamingQueryException, match=f"partition 1 of stream '{stream}' is paused"):
        run_available_now(df, tmp_path / "c")

    with LiftbridgeClient(lb_address) as client:
        client.delete_stream(stream)
    with pytest.raises(StreamingQueryException, match=f"stream '{stream}' does not exist \\(or was deleted\\)"):
        run_available_now(df, tmp_path / "c")


@pytest.mark.parametrize("guarantee", ["exactlyOnce", "atLeastOnce"])
def test_sink_replayed_batch(
    guarantee: str,
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    tmp_path: Path,
    stream_name: str,
) -> None:
    source_stream, target = f"{stream_name}-in", f"{stream_name}-out"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(source_stream, source_stream, partitions=2)
        client.create_stream(target, target, partitions=2)
    publish(lb_address, source_stream, range(200), 2)
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        transformed = source(
            spark, lb_settings, source_stream, startingOffsets="earliest", maxMessagesPerPartition="40"
        ).select(F.concat(F.lit("x"), F.col("value").cast("string")).alias("v"))
        query = (
            transformed.writeStream.format("liftbridge")
            .options(**to_options(lb_settings))
            .option("stream", target)
            .option("valueColumn", "v")
            .option("deliveryGuarantee", guarantee)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(240)
        assert query.exception() is None

    run()
    assert sorted(read_all(lb_address, target, 2)) == sorted(f"x{i}".encode() for i in range(200))

    forget_last_commit(checkpoint)  # as if the query died after publishing its last batch
    run()

    published: Counter[bytes] = Counter(read_all(lb_address, target, 2))
    assert set(published) == {f"x{i}".encode() for i in range(200)}
    if guarantee == "exactlyOnce":
        assert set(published.values()) == {1}  # the replayed batch skipped what was stored
    else:
        # 100 per partition, 40 per trigger: batches of 40, 40, 20; the last one went out again.
        assert sum(published.values()) == 200 + 2 * 20


def _die_on_first_attempt(at: int) -> Callable[[str], str]:
    """A UDF passing values through that ends its Python worker (as a lost executor would) on the
    first attempt of a task, at the value ``at``."""

    def udf(value: str) -> str:
        import os

        from pyspark import TaskContext

        context = TaskContext.get()
        if value == str(at) and context is not None and context.attemptNumber() == 0:
            os._exit(1)
        return "x" + value

    return udf


def test_exactly_once_sink_task_killed_mid_batch(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, tmp_path: Path, stream_name: str
) -> None:
    # Two tasks side by side write the same target partitions; one task's first attempt dies after
    # its first group of rows (65,536) was handed to the publisher. Spark runs the task again, the
    # retry resumes that producer, and the commit reads what no task was acknowledged for.
    source_stream, target = f"{stream_name}-in", f"{stream_name}-out"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(source_stream, source_stream, partitions=2)
        client.create_stream(target, target, partitions=2)
    total = 180_000
    publish(lb_address, source_stream, range(total), 2)
    passing = F.udf(_die_on_first_attempt(at=total - 2))  # partition 0's last value
    query = (
        source(spark, lb_settings, source_stream, startingOffsets="earliest")
        .select(passing(F.col("value").cast("string")).alias("v"))
        .writeStream.format("liftbridge")
        .options(**to_options(lb_settings))
        .option("stream", target)
        .option("valueColumn", "v")
        .option("partitioner", "round_robin")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    assert query.exception() is None

    published: Counter[bytes] = Counter(read_all(lb_address, target, 2))
    assert set(published) == {f"x{i}".encode() for i in range(total)}
    assert set(published.values()) == {1}


def test_sink_refuses_a_bad_guarantee(
    spark: SparkSession, lb_settings: ConnectionSettings, make_stream: Callable[[int], str], tmp_path: Path
) -> None:
    stream = make_stream(1)
    df = source(spark, lb_settings, stream).select(F.col("value").alias("v"))
    writer = (
        df.writeStream.format("liftbridge")
        .options(**to_options(lb_settings))
        .option("stream", stream)
        .option("valueColumn", "v")
        .option("deliveryGuarantee", "maybe")
        .option("checkpointLocation", str(tmp_path / "c"))
    )
    with pytest.raises(Exception, match="'deliveryGuarantee' must be 'exactlyOnce' or 'atLeastOnce', got 'maybe'"):
        writer.trigger(availableNow=True).start().awaitTermination(120)
