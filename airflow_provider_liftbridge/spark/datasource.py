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

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_liftbridge.extras import needs_extra

with needs_extra("spark", "the liftbridge Spark data source"):
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

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

# What this module imports at its top is all that Spark's planner processes need to unpickle the
# data source and answer name() and schema(): each is a fresh Python process on a session's first
# query (PySpark 4.2 reuses them after). The client, PyArrow and the publishing code are imported
# by the methods that use them, and the read planner imports no publishing code (issue 57).

FORMAT_NAME = "liftbridge"
READ_SCHEMA = (
    "stream string, partition int, offset long, key binary, value binary, timestamp timestamp, "
    "headers map<string, binary>"
)


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
        if overwrite:
            raise SparkOptionError(
                "a Liftbridge stream is an append-only log: use outputMode('append'), not 'complete'"
            )
        from .streaming import LiftbridgeStreamWriter

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
        from .plan import plan_from_options
        from .publish import resolve_plan
        from .settings import from_options

        self.settings = from_options(options)
        plan = plan_from_options(options)
        plan.validate_schema(schema)
        self.plan = resolve_plan(plan, self.settings)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _PartitionSummary:
        from pyspark import TaskContext

        from .publish import publish_partition

        context = TaskContext.get()
        spark_partition = context.partitionId() if context is not None else 0
        return _PartitionSummary(publish_partition(iterator, self.plan, self.settings, spark_partition))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        from .publish import merge_summaries

        summaries = [m.summary for m in messages if isinstance(m, _PartitionSummary)]
        merge_summaries(self.plan.stream, self.plan.ack_policy, summaries, 0.0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Nothing to undo: acknowledged messages are durable in the log.
        return None


class LiftbridgeReader(DataSourceReader):
    """Plans one split per stream partition (or offset range) and reads the splits in parallel.

    :raises SparkOptionError: bad options.
    :raises SparkStreamError: the stream or a requested partition does not exist.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        from .reading import ReadBounds
        from .settings import from_options

        lowered = {key.lower(): value for key, value in options.items()}
        stream = lowered.get("stream")
        if not stream:
            raise SparkOptionError("the liftbridge data source needs option 'stream'")
        self.stream: str = stream
        self.settings = from_options(options)
        self.bounds = ReadBounds.from_options(options)

    def partitions(self) -> Sequence[InputPartition]:
        from airflow_provider_liftbridge.client import LiftbridgeClient, LiftbridgeError

        from .reading import LiftbridgeSplit, requested_partitions, stream_partition_count

        try:
            with LiftbridgeClient.from_settings(self.settings) as client:
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
        from .reading import LiftbridgeSplit, read_split

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
