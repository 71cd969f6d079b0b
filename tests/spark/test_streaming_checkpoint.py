"""A Structured Streaming checkpoint that no longer matches its stream fails the query with a clear
error (Spark's Kafka source does the same), unless ``failOnDataLoss=false``, which logs and goes on
from the earliest available offsets. On the standalone test cluster, against the dev server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.spark import ConnectionSettings
from tests.exact_retention import ONE_MESSAGE_SEGMENTS, publish_each, wait_for_earliest
from tests.spark.streaming_support import publish, rewrite_last_offsets, run_available_now, source, values_read

pytestmark = pytest.mark.spark


def test_recreated_stream_fails_the_query_and_the_opt_out_reads_the_new_stream(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
) -> None:
    stream = make_stream(2)
    publish(lb_address, stream, range(120), 2)
    checkpoint = tmp_path / "checkpoint"
    assert values_read(
        run_available_now(source(spark, lb_settings, stream, startingOffsets="earliest"), checkpoint)
    ) == list(range(120))

    # The case the issue saw: deleted and created again (here with one more partition), same checkpoint.
    with LiftbridgeClient(lb_address) as client:
        client.delete_stream(stream)
        client.create_stream(stream, stream, partitions=3)
    publish(lb_address, stream, range(9), 3)
    with pytest.raises(
        StreamingQueryException,
        match=rf"stream '{stream}'.*deleted and created again.*with 2 partition\(s\).*with 3 partition\(s\).*"
        r"new checkpointLocation.*failOnDataLoss=false",
    ):
        run_available_now(source(spark, lb_settings, stream), checkpoint)

    opted_out = source(spark, lb_settings, stream, failOnDataLoss="false")
    assert values_read(run_available_now(opted_out, checkpoint)) == list(range(9))


def test_offsets_removed_by_retention_fail_the_query_and_the_opt_out_skips_to_the_earliest(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    stream_name: str,
    tmp_path: Path,
) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, retention_max_messages=10, **ONE_MESSAGE_SEGMENTS)
        publish_each(client, stream_name, [b"%d" % i for i in range(10)])
    checkpoint = tmp_path / "checkpoint"
    df = source(spark, lb_settings, stream_name, startingOffsets="earliest")
    assert values_read(run_available_now(df, checkpoint)) == list(range(10))

    with LiftbridgeClient(lb_address) as client:
        publish_each(client, stream_name, [b"%d" % i for i in range(10, 30)])
        wait_for_earliest(client, stream_name, 20)  # retention keeps 20..29: 10..19 went unread
    with pytest.raises(
        StreamingQueryException, match=r"offsets 10\.\.19 were removed \(retention\).*earliest available offset is 20"
    ):
        run_available_now(df, checkpoint)

    opted_out = source(spark, lb_settings, stream_name, failOnDataLoss="false")
    assert values_read(run_available_now(opted_out, checkpoint)) == list(range(20, 30))


def test_old_checkpoint_without_identity_goes_on_and_an_offset_beyond_the_newest_fails(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
) -> None:
    stream = make_stream(2)
    publish(lb_address, stream, range(20), 2)
    checkpoint = tmp_path / "checkpoint"
    df = source(spark, lb_settings, stream, startingOffsets="earliest")
    assert len(values_read(run_available_now(df, checkpoint))) == 20

    # The bare offsets an earlier version of the source wrote: read on from them.
    rewrite_last_offsets(checkpoint, json.dumps({"0": 10, "1": 10}))
    publish(lb_address, stream, range(20, 24), 2)
    assert values_read(run_available_now(df, checkpoint)) == [20, 21, 22, 23]

    # Partition 0 holds offsets 0..11: a checkpoint at 60 is beyond it (no identity to blame).
    rewrite_last_offsets(checkpoint, json.dumps({"0": 60, "1": 12}))
    # (failOnDataLoss=false then reads partition 0 from its earliest offset: the same reset as in
    # the two tests above, left out here to save a query run.)
    with pytest.raises(StreamingQueryException, match=r"partition 0: the checkpoint's next offset 60 is beyond"):
        run_available_now(df, checkpoint)


def test_a_partition_added_to_the_query_is_read_from_its_earliest_offset(
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
) -> None:
    stream = make_stream(2)
    publish(lb_address, stream, range(10), 2)
    checkpoint = tmp_path / "checkpoint"
    first = source(spark, lb_settings, stream, startingOffsets="earliest", partitions="0")
    assert values_read(run_available_now(first, checkpoint)) == [0, 2, 4, 6, 8]

    # As Spark's Kafka source does with new partitions: the checkpoint does not know partition 1,
    # so it starts at its earliest offset; partition 0 goes on where it was.
    publish(lb_address, stream, range(10, 12), 2)
    widened = source(spark, lb_settings, stream, partitions="0,1")
    assert values_read(run_available_now(widened, checkpoint)) == [1, 3, 5, 7, 9, 10, 11]
