"""The streaming source's checkpoint offsets and the check that a checkpoint still matches the stream
(pure logic; the same cases run on a real SparkSession in test_streaming_checkpoint.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_provider_liftbridge.spark import SparkDataLossError, SparkOptionError, SparkStreamError
from airflow_provider_liftbridge.spark.stream_offsets import (
    PartitionNow,
    SourceOffset,
    StreamIdentity,
    data_loss_error,
    parse_fail_on_data_loss,
    resolve_starts,
)

ORDERS = StreamIdentity("orders", 1_764_000_000_000_000_000, 2)


def earliest_of(values: dict[str, int]) -> tuple[Callable[[str], int], list[str]]:
    """A stand-in for the earliest-offset probe, and the partitions it was asked about."""
    asked: list[str] = []

    def earliest(p: str) -> int:
        asked.append(p)
        return values[p]

    return earliest, asked


def test_offsets_round_trip_and_old_checkpoints_parse_without_identity() -> None:
    offset = SourceOffset(ORDERS, {"1": 7, "0": 120}, {"1": 3})
    as_json = offset.to_json()
    assert list(as_json) == ["stream", "creationTimestamp", "partitionCount", "offsets", "resetFrom"]
    assert list(as_json["offsets"]) == ["0", "1"]  # fixed order: Spark compares offsets as text
    assert SourceOffset.parse(as_json) == offset
    old = SourceOffset.parse({"0": 60, "1": 0})
    assert old.identity is None and old.next == {"0": 60, "1": 0}
    with pytest.raises(SparkStreamError, match="written by another query"):
        SourceOffset.parse({"offsets": {"0": 1}})


def test_matching_checkpoint_goes_on_and_probes_earliest_only_where_there_is_something_to_read() -> None:
    earliest, asked = earliest_of({"0": 0, "1": 0})
    now = {"0": PartitionNow(130, 129), "1": PartitionNow(7, 6)}
    found = resolve_starts(SourceOffset(ORDERS, {"0": 120, "1": 7}), ORDERS, now, earliest)
    assert found.starts == {"0": 120, "1": 7} and found.losses == [] and found.added == []
    assert asked == ["0"]


def test_recreated_stream_is_a_loss_and_every_partition_restarts_at_its_earliest() -> None:
    recreated = StreamIdentity("orders", ORDERS.creation_timestamp + 5, 3)
    earliest, _ = earliest_of({"0": 0, "1": 0, "2": 4})
    now = {p: PartitionNow(10, 9) for p in ("0", "1", "2")}
    found = resolve_starts(SourceOffset(ORDERS, {"0": 60, "1": 0}), recreated, now, earliest)
    assert found.starts == {"0": 0, "1": 0, "2": 4}
    assert len(found.losses) == 1 and "deleted and created again" in found.losses[0]
    assert "with 2 partition(s)" in found.losses[0] and "with 3 partition(s)" in found.losses[0]


def test_offset_beyond_newest_and_offsets_removed_by_retention() -> None:
    earliest, _ = earliest_of({"0": 2, "1": 40})
    now = {"0": PartitionNow(5, 4), "1": PartitionNow(50, 49)}
    found = resolve_starts(SourceOffset(ORDERS, {"0": 60, "1": 30}), ORDERS, now, earliest)
    assert found.starts == {"0": 2, "1": 40}
    assert "checkpoint's next offset 60 is beyond the partition's newest offset 4" in found.losses[0]
    assert "offsets 30..39 were removed (retention)" in found.losses[1]


def test_partition_new_to_the_checkpoint_starts_at_its_earliest_without_a_loss() -> None:
    earliest, _ = earliest_of({"1": 3})
    now = {"0": PartitionNow(5, 4), "1": PartitionNow(9, 8)}
    found = resolve_starts(SourceOffset(None, {"0": 5}), ORDERS, now, earliest)
    assert found.starts == {"0": 5, "1": 3} and found.added == ["1"] and found.losses == []


def test_the_error_names_the_stream_the_change_and_both_ways_out() -> None:
    error = data_loss_error("orders", ["partition 0: offsets 3..9 were removed"])
    assert isinstance(error, SparkDataLossError) and isinstance(error, SparkStreamError)
    message = str(error)
    assert "stream 'orders'" in message and "offsets 3..9 were removed" in message
    assert "new checkpointLocation" in message and "failOnDataLoss=false" in message
    assert parse_fail_on_data_loss(None) is True and parse_fail_on_data_loss(" False ") is False
    with pytest.raises(SparkOptionError, match="'failOnDataLoss' must be 'true' or 'false', got 'no'"):
        parse_fail_on_data_loss("no")
