"""The read side both ``liftbridge`` sources share (batch reads in :mod:`.datasource`, micro-batches in
:mod:`.streaming`): a split (one stream partition's offset range), the parsed read bounds, and
reading one split into Arrow batches; and a stream's metadata, which the publishing side uses too (kept
here so that the read planner does not import the publishing code).

Both source modules import this one and neither imports the other's internals, so the batch
source can hand out the streaming reader and writer without an import cycle.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

from .errors import SparkOptionError, SparkStreamError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_liftbridge.client import LiftbridgeClient, StreamInfo

    from .settings import ConnectionSettings

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Rows per Arrow batch handed to Spark by the reader.
READ_BATCH_ROWS = 8192


class LiftbridgeSplit(InputPartition):
    """One Spark read partition: a stream partition from a start position to an inclusive stop offset."""

    def __init__(
        self,
        partition: int,
        start_offset: int,
        stop_offset: int,
        start_time_ns: int | None = None,
        stop_time_ns: int | None = None,
    ) -> None:
        super().__init__(partition)
        self.partition = partition
        self.start_offset = start_offset
        self.stop_offset = stop_offset
        self.start_time_ns = start_time_ns
        self.stop_time_ns = stop_time_ns

    def __repr__(self) -> str:
        return f"LiftbridgeSplit(partition={self.partition}, offsets={self.start_offset}..{self.stop_offset})"


def parse_time_ns(name: str, raw: str) -> int:
    """An option holding a time: ISO-8601 (naive means UTC) or integer epoch milliseconds, as epoch ns.

    :raises SparkOptionError: when it is neither.
    """
    text = raw.strip()
    if text.lstrip("-").isdigit():
        return int(text) * 1_000_000
    try:
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be an ISO-8601 time or epoch milliseconds, got {raw!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1_000


def datetime_of_ns(ns: int) -> dt.datetime:
    """Epoch nanoseconds as an aware datetime, floored to the microsecond (its precision) in integers:
    a float of the epoch seconds rounds, and rounding up would start a read past the first message."""
    return _EPOCH + dt.timedelta(microseconds=ns // 1000)


@dataclass(frozen=True)
class ReadBounds:
    """Read options after parsing: which partitions and which offsets / times.

    :param partitions: stream partitions to read (``None``: all).
    :param starting_offset: first offset (inclusive).
    :param ending_offset: last offset (inclusive); capped at the high watermark at planning time.
    :param starting_time_ns: first message time (inclusive), epoch ns.
    :param ending_time_ns: last message time (inclusive), epoch ns.
    :param max_records_per_split: split a stream partition into offset ranges of this size.
    """

    partitions: tuple[int, ...] | None = None
    starting_offset: int = 0
    ending_offset: int | None = None
    starting_time_ns: int | None = None
    ending_time_ns: int | None = None
    max_records_per_split: int | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReadBounds:
        """:raises SparkOptionError: on a value that does not parse or is negative."""
        lowered = {key.lower(): value for key, value in options.items() if value not in (None, "")}

        def number(name: str) -> int | None:
            raw = lowered.get(name.lower())
            if raw is None:
                return None
            try:
                value = int(raw)
            except ValueError:
                raise SparkOptionError(f"option {name!r} must be an integer, got {raw!r}") from None
            if value < 0:
                raise SparkOptionError(f"option {name!r} must be >= 0, got {value}")
            return value

        parts = lowered.get("partitions")
        try:
            partitions = tuple(int(p) for p in parts.split(",") if p.strip()) if parts else None
        except ValueError:
            raise SparkOptionError(f"option 'partitions' must be comma-separated integers, got {parts!r}") from None
        split = number("maxRecordsPerSplit")
        if split == 0:
            raise SparkOptionError("option 'maxRecordsPerSplit' must be >= 1")
        start_time = lowered.get("startingTimestamp")
        end_time = lowered.get("endingTimestamp")
        return cls(
            partitions=partitions,
            starting_offset=number("startingOffset") or 0,
            ending_offset=number("endingOffset"),
            starting_time_ns=parse_time_ns("startingTimestamp", start_time) if start_time else None,
            ending_time_ns=parse_time_ns("endingTimestamp", end_time) if end_time else None,
            max_records_per_split=split,
        )

    def splits(self, partition: int, high_watermark: int) -> list[LiftbridgeSplit]:
        """The read ranges of one stream partition whose high watermark is ``high_watermark``."""
        stop = high_watermark if self.ending_offset is None else min(self.ending_offset, high_watermark)
        start = self.starting_offset
        if stop < 0 or start > stop:
            return []
        times = {"start_time_ns": self.starting_time_ns, "stop_time_ns": self.ending_time_ns}
        # A start time maps to an offset only on the server, so such reads are not split.
        if not self.max_records_per_split or self.starting_time_ns is not None:
            return [LiftbridgeSplit(partition, start, stop, **times)]
        size = self.max_records_per_split
        return [
            LiftbridgeSplit(partition, lo, min(lo + size - 1, stop), **times) for lo in range(start, stop + 1, size)
        ]


def requested_partitions(stream: str, count: int, wanted: tuple[int, ...] | None) -> tuple[int, ...]:
    """The partitions option checked against the stream's ``count`` partitions (``None``: all).

    :raises SparkStreamError: naming the partitions the stream does not have.
    """
    chosen = wanted if wanted is not None else tuple(range(count))
    missing = [p for p in chosen if not 0 <= p < count]
    if missing:
        raise SparkStreamError(
            f"stream {stream!r} has partitions 0..{count - 1}; option 'partitions' asks for {missing}"
        )
    return chosen


def stream_info(client: LiftbridgeClient, stream: str) -> StreamInfo:
    """The metadata of ``stream``.

    :raises SparkStreamError: when the stream does not exist (or has no partitions).
    """
    metadata = client.fetch_metadata([stream])
    info = metadata.streams.get(stream)
    if info is None or not info.partitions:
        raise SparkStreamError(
            f"stream {stream!r} does not exist on the Liftbridge cluster: create it first "
            "(LiftbridgeCreateStreamOperator or client.create_stream)"
        )
    return info


def stream_partition_count(client: LiftbridgeClient, stream: str) -> int:
    """The number of partitions of ``stream``.

    :raises SparkStreamError: when the stream does not exist (or has no partitions).
    """
    return len(stream_info(client, stream).partitions)


def read_split(stream: str, settings: ConnectionSettings, split: LiftbridgeSplit) -> Iterator[pa.RecordBatch]:
    """The messages of ``split`` as Arrow batches of the read schema (batch reads and micro-batches),
    built from the subscription's columns (:mod:`.arrow_read`)."""
    # Imported here, not at the top: Spark's planner processes import this module only to plan.
    from airflow_provider_liftbridge.client import LiftbridgeClient

    from .arrow_read import columns_batch

    start_at: Any = split.start_offset
    if split.start_time_ns is not None:
        start_at = datetime_of_ns(split.start_time_ns)
    bounds = {
        "first_offset": split.start_offset,
        "last_offset": split.stop_offset,
        "start_time_ns": split.start_time_ns,
        "stop_time_ns": split.stop_time_ns,
    }
    with LiftbridgeClient.from_settings(settings) as client:
        batches = client.subscribe_columns(
            stream, partition=split.partition, start_at=start_at, stop_at=split.stop_offset, rows=READ_BATCH_ROWS
        )
        for columns in batches:
            batch = columns_batch(columns, **bounds)
            if batch.num_rows:
                yield batch
