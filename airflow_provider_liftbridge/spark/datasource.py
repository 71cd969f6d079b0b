"""The ``liftbridge`` PySpark data source: batch write and batch read of a stream, and (through
:mod:`.streaming`) Structured Streaming reads and writes.

Register it once per session with :func:`register` (or ``spark.dataSource.register(
LiftbridgeDataSource)``), then::

    df.write.format("liftbridge").mode("append").option("stream", "orders") \\
        .option("brokers", "127.0.0.1:9292").option("keyColumn", "id").save()

    spark.read.format("liftbridge").option("stream", "orders") \\
        .option("brokers", "127.0.0.1:9292").load()

Reads are planned on the driver: each stream partition's high watermark is fetched once, and
each Spark partition subscribes to one stream partition (or one offset range of it) with that
offset as its stop position, so a read is a consistent snapshot and ends even if writers go on.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)

from .errors import SparkOptionError, SparkReadError, SparkStreamError
from .plan import plan_from_options
from .publish import merge_summaries, publish_partition, resolve_plan, stream_partition_count
from .settings import ConnectionSettings, from_options

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

FORMAT_NAME = "liftbridge"
READ_SCHEMA = (
    "stream string, partition int, offset long, key binary, value binary, timestamp timestamp, "
    "headers map<string, binary>"
)
# Rows per Arrow batch handed to Spark by the reader.
READ_BATCH_ROWS = 8192


def register(spark: SparkSession) -> None:
    """Register the ``liftbridge`` format on ``spark`` and make ``spark`` the JVM's active session
    for the calling thread (idempotent).

    Classic Spark looks Python data sources up in the *active* session of the JVM thread serving
    the call, and the JVM thread behind a Python thread can change (seen after starting an
    in-process gRPC server); calling this again right before ``format("liftbridge")`` fixes
    ``DATA_SOURCE_NOT_FOUND`` in that case.
    """
    spark.dataSource.register(LiftbridgeDataSource)
    jsession = getattr(spark, "_jsparkSession", None)  # absent on Spark Connect, which needs no fix
    if jsession is not None:
        spark._jvm.SparkSession.setActiveSession(jsession)  # type: ignore[union-attr]


class LiftbridgeDataSource(DataSource):
    """``format("liftbridge")``: write DataFrames to a stream, read a stream as a DataFrame.

    Options (case-insensitive) are listed in ``docs/spark.md``; ``stream`` and ``brokers`` are
    always required.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> LiftbridgeReader:
        return LiftbridgeReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .streaming import LiftbridgeStreamReader

        return LiftbridgeStreamReader(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .streaming import LiftbridgeStreamWriter

        if overwrite:
            raise SparkOptionError(
                "a Liftbridge stream is an append-only log: use outputMode('append'), not 'complete'"
            )
        return LiftbridgeStreamWriter(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> LiftbridgeWriter:
        if overwrite:
            raise SparkOptionError(
                "a Liftbridge stream is an append-only log: use mode('append'), not mode('overwrite')"
            )
        return LiftbridgeWriter(self.options, schema)


@dataclass
class _PartitionSummary(WriterCommitMessage):
    summary: dict[str, Any]


class LiftbridgeWriter(DataSourceArrowWriter):
    """Publishes each Spark partition with its own client; ``commit`` raises if any row failed.

    :raises SparkOptionError: bad options or columns (at planning time).
    :raises SparkStreamError: the stream does not exist (at planning time).
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.settings = from_options(options)
        plan = plan_from_options(options)
        plan.validate_schema(schema)
        self.plan = resolve_plan(plan, self.settings)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _PartitionSummary:
        from pyspark import TaskContext

        context = TaskContext.get()
        spark_partition = context.partitionId() if context is not None else 0
        return _PartitionSummary(publish_partition(iterator, self.plan, self.settings, spark_partition))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        summaries = [m.summary for m in messages if isinstance(m, _PartitionSummary)]
        merge_summaries(self.plan.stream, self.plan.ack_policy, summaries, 0.0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Nothing to undo: acknowledged messages are durable in the log.
        return None


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


class LiftbridgeReader(DataSourceReader):
    """Plans one split per stream partition (or offset range) and reads the splits in parallel.

    :raises SparkOptionError: bad options.
    :raises SparkStreamError: the stream or a requested partition does not exist.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        lowered = {key.lower(): value for key, value in options.items()}
        stream = lowered.get("stream")
        if not stream:
            raise SparkOptionError("the liftbridge data source needs option 'stream'")
        self.stream: str = stream
        self.settings = from_options(options)
        self.bounds = ReadBounds.from_options(options)

    def partitions(self) -> Sequence[InputPartition]:
        from airflow_provider_liftbridge.client import LiftbridgeError

        try:
            with self.settings.client() as client:
                count = stream_partition_count(client, self.stream)
                wanted = requested_partitions(self.stream, count, self.bounds.partitions)
                splits: list[InputPartition] = []
                for partition in wanted:
                    info = client.fetch_partition_metadata(self.stream, partition)
                    splits.extend(self.bounds.splits(partition, info.high_watermark))
        except LiftbridgeError as exc:
            raise SparkStreamError(
                f"cannot plan the read of stream {self.stream!r}: {type(exc).__name__}: {exc}"
            ) from exc
        # Spark needs at least one partition; an empty one reads nothing.
        return splits or [LiftbridgeSplit(0, 0, -1)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LiftbridgeSplit)
        if partition.stop_offset < partition.start_offset:
            return
        try:
            yield from read_split(self.stream, self.settings, partition)
        except SparkReadError:
            raise
        except Exception as exc:
            raise SparkReadError(
                f"reading stream {self.stream!r} partition {partition.partition} offsets "
                f"{partition.start_offset}..{partition.stop_offset} failed: {type(exc).__name__}: {exc}"
            ) from exc


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("stream", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("headers", pa.map_(pa.string(), pa.binary())),
        ]
    )


def read_split(stream: str, settings: ConnectionSettings, split: LiftbridgeSplit) -> Iterator[pa.RecordBatch]:
    """The messages of ``split`` as Arrow batches of the read schema (batch reads and micro-batches)."""
    import pyarrow as pa

    schema = _arrow_schema()
    start_at: Any = split.start_offset
    if split.start_time_ns is not None:
        start_at = dt.datetime.fromtimestamp(split.start_time_ns / 1e9, tz=dt.UTC)
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}

    def flush() -> pa.RecordBatch:
        batch = pa.RecordBatch.from_pydict(columns, schema=schema)
        for values in columns.values():
            values.clear()
        return batch

    with settings.client() as client:
        messages = client.subscribe(stream, partition=split.partition, start_at=start_at, stop_at=split.stop_offset)
        for message in messages:
            if message.offset > split.stop_offset:
                break
            if message.offset < split.start_offset:
                continue
            if split.start_time_ns is not None and message.timestamp < split.start_time_ns:
                continue
            if split.stop_time_ns is None or message.timestamp <= split.stop_time_ns:
                columns["stream"].append(message.stream)
                columns["partition"].append(message.partition)
                columns["offset"].append(message.offset)
                columns["key"].append(message.key)
                columns["value"].append(message.value)
                columns["timestamp"].append(message.timestamp // 1000)
                columns["headers"].append(list((message.headers or {}).items()))
                if len(columns["offset"]) >= READ_BATCH_ROWS:
                    yield flush()
            if message.offset >= split.stop_offset:
                break
    if columns["offset"]:
        yield flush()
