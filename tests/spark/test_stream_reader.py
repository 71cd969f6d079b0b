"""The streaming source's driver side against the dev server, without a query: the calls Spark makes
(``initialOffset``, ``latestOffset``, ``partitions``) in orders a running query rarely shows, a
micro-batch replayed from the offset log after its stream was recreated, and the earliest-offset
probe on a partition whose every message expired. (The query-level cases run on the standalone
cluster in test_streaming_checkpoint.py.)"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.spark import ConnectionSettings, SparkDataLossError, to_options
from airflow_provider_liftbridge.spark.stream_offsets import PartitionNow
from airflow_provider_liftbridge.spark.streaming import LiftbridgeStreamReader, StreamSplit
from tests.exact_retention import ONE_MESSAGE_SEGMENTS, publish_each
from tests.margins import bounded
from tests.spark.streaming_support import publish


def reader(settings: ConnectionSettings, stream: str, **options: str) -> LiftbridgeStreamReader:
    return LiftbridgeStreamReader({**to_options(settings), "stream": stream, **options})


def test_a_replayed_batch_of_a_recreated_stream_fails_or_with_the_opt_out_reads_nothing(
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = make_stream(2)
    publish(lb_address, stream, range(10), 2)
    planner = reader(lb_settings, stream, startingOffsets="earliest")
    start = planner.initialOffset()
    end = planner.latestOffset(start, ReadAllAvailable())
    planned = planner.partitions(start, end)
    assert [(s.partition, s.start, s.end) for s in planned if isinstance(s, StreamSplit)] == [(0, 0, 5), (1, 0, 5)]

    # The query stopped after logging the batch; the stream was recreated; the restarted query
    # (a new reader) replays the logged batch without asking for a latest offset first.
    with LiftbridgeClient(lb_address) as client:
        client.delete_stream(stream)
        client.create_stream(stream, stream, partitions=2)
    with pytest.raises(SparkDataLossError, match=rf"stream '{stream}'.*deleted and created again"):
        reader(lb_settings, stream).partitions(start, end)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_liftbridge.spark.streaming"):
        assert reader(lb_settings, stream, failOnDataLoss="false").partitions(start, end) == []
    assert "deleted and created again" in caplog.text and "failOnDataLoss=false" in caplog.text


def test_the_earliest_offset_of_a_partition_whose_messages_all_expired_is_its_next_offset(
    lb_settings: ConnectionSettings, lb_address: str, stream_name: str
) -> None:
    with LiftbridgeClient(lb_address) as client:
        age = timedelta(milliseconds=300)
        client.create_stream(stream_name, stream_name, retention_max_age=age, **ONE_MESSAGE_SEGMENTS)
        publish_each(client, stream_name, [b"%d" % i for i in range(3)])
    now = PartitionNow(next_offset=3, newest_offset=2)
    source = reader(lb_settings, stream_name)
    # The probe waits the client's timeout for the newest message when the time lookup answers
    # past it (an emptied log, or one kept segment before an empty one): a kept one comes at once,
    # so a 3 s client keeps the poll's last round from costing the default 10 s.
    with LiftbridgeClient(lb_address, timeout=3.0) as client:
        # One message a segment: the cleaner rolls the full active one, then deletes all three
        # once aged (it never deletes the active segment). Poll until they are gone.
        with bounded("the messages aged out", 20):
            deadline = time.monotonic() + 20
            while (earliest := source._earliest(client, "0", now)) != 3 and time.monotonic() < deadline:
                assert 0 <= earliest < 3  # the first message left
                time.sleep(0.1)
        # Nothing kept: the partition's next offset is its earliest. A subscription from EARLIEST
        # would wait here for a new message (Liftbridge starts it at 0 on an emptied log, and so
        # does the dev server since issue 59); the probe's time lookup answers at once.
        assert earliest == 3
