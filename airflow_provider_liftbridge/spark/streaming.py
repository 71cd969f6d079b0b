"""Structured Streaming in and out of Liftbridge: ``readStream.format("liftbridge")`` and
``writeStream.format("liftbridge")`` (PySpark 4.2 Python streaming data source API).

Source
    The source offset is, per stream partition, the **next offset to read** (partition ids as
    strings), with the stream's identity (:mod:`.stream_offsets`): every trigger checks the
    checkpoint still matches the stream, and fails the query when it does not (``failOnDataLoss``,
    the default) or goes on from the earliest available offsets. The latest offset is each
    partition's high watermark + 1, so a micro-batch reads only committed messages. A micro-batch
    ``(start, end)`` reads, per partition, offsets ``start[p] .. end[p] - 1`` with one Spark
    partition per stream partition: the same offsets on every run, which is what makes a restart
    from the checkpoint exact (Spark re-plans a logged batch with the logged offsets: no gap, no
    duplicate). ``maxMessagesPerPartition`` caps what one trigger takes from each partition
    (``Trigger.AvailableNow`` honours it too, in several batches). Start positions: ``earliest``,
    ``latest`` (default, as Kafka), per partition offsets (JSON), or a time (``startingTimestamp``).

Sink
    Each micro-batch partition publishes with its own client, exactly as ``publish_dataframe``.
    With ``deliveryGuarantee=exactlyOnce`` (the default) it publishes as the exactly-once producer
    ``<producerIdPrefix>/<query id>/<batch id>/spark-<partition>`` (ADR 2): the query id survives
    restarts from the checkpoint and Spark replays an unfinished batch with the same id and the
    same input, so a replayed batch skips the rows that are already in the stream.
    ``atLeastOnce`` publishes plainly: a replayed batch publishes its rows again.

No Airflow is imported: this runs on executors and in the driver's Python planning workers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from airflow_provider_liftbridge.client import LiftbridgeClient, LiftbridgeError
from airflow_provider_liftbridge.client.reading.seek import oldest_retained

from .errors import SparkOptionError, SparkReadError, SparkStreamError
from .plan import plan_from_options
from .publish import check_between_tasks, merge_summaries, publish_partition, resolve_plan
from .reading import (
    LiftbridgeSplit,
    ReadBounds,
    datetime_of_ns,
    parse_time_ns,
    read_split,
    requested_partitions,
    stream_info,
)
from .settings import from_options
from .stream_offsets import (
    FAIL_ON_DATA_LOSS,
    Offsets,
    PartitionNow,
    SourceOffset,
    StreamIdentity,
    data_loss_error,
    describe_change,
    parse_fail_on_data_loss,
    resolve_starts,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_provider_liftbridge.client import StreamInfo

log = logging.getLogger(__name__)

EXACTLY_ONCE = "exactlyonce"
AT_LEAST_ONCE = "atleastonce"
DEFAULT_PRODUCER_PREFIX = "spark-stream"
# TaskContext local properties Spark's micro-batch engine sets for every task of a batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def _lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {key.lower(): value for key, value in options.items() if value not in (None, "")}


# ---------------------------------------------------------------------------------------------
# Source


@dataclass(frozen=True)
class StreamReadOptions:
    """The streaming source's options after parsing.

    :param stream: the stream to read.
    :param partitions: stream partitions to read (``None``: all).
    :param starting: ``"earliest"``, ``"latest"`` or ``"offsets"``/``"timestamp"`` (given below).
    :param starting_offsets: with ``"offsets"``: next offset per partition (others: earliest).
    :param starting_time_ns: with ``"timestamp"``: first message time, epoch ns.
    :param max_per_partition: most messages one micro-batch takes from a partition.
    :param fail_on_data_loss: fail the query when its checkpoint no longer matches the stream
        (:mod:`.stream_offsets`); false: log a warning and go on from the earliest available offsets.
    """

    stream: str
    partitions: tuple[int, ...] | None = None
    starting: str = "latest"
    starting_offsets: Mapping[int, int] | None = None
    starting_time_ns: int | None = None
    max_per_partition: int | None = None
    fail_on_data_loss: bool = True

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> StreamReadOptions:
        """:raises SparkOptionError: naming the option and what it accepts."""
        lowered = _lowered(options)
        stream = lowered.get("stream")
        if not stream:
            raise SparkOptionError("the liftbridge streaming source needs option 'stream'")
        bounds = ReadBounds.from_options({k: v for k, v in options.items() if k.lower() == "partitions"})
        raw_limit = lowered.get("maxmessagesperpartition")
        limit = None
        if raw_limit is not None:
            try:
                limit = int(raw_limit)
            except ValueError:
                limit = 0
            if limit < 1:
                raise SparkOptionError(f"option 'maxMessagesPerPartition' must be an integer >= 1, got {raw_limit!r}")
        common: dict[str, Any] = {
            "stream": stream,
            "partitions": bounds.partitions,
            "max_per_partition": limit,
            "fail_on_data_loss": parse_fail_on_data_loss(lowered.get(FAIL_ON_DATA_LOSS.lower())),
        }
        raw_start = lowered.get("startingoffsets", "").strip()
        raw_time = lowered.get("startingtimestamp")
        if raw_time and raw_start:
            raise SparkOptionError("give either option 'startingOffsets' or 'startingTimestamp', not both")
        if raw_time:
            return cls(**common, starting="timestamp", starting_time_ns=parse_time_ns("startingTimestamp", raw_time))
        if raw_start.lower() in ("", "latest", "earliest"):
            return cls(**common, starting=raw_start.lower() or "latest")
        try:
            given = json.loads(raw_start)
            offsets = {int(p): int(o) for p, o in given.items()}
        except (ValueError, TypeError, AttributeError):
            raise SparkOptionError(
                "option 'startingOffsets' must be 'earliest', 'latest' or a JSON object of partition -> next "
                f'offset such as {{"0": 120, "1": 98}}, got {raw_start!r}'
            ) from None
        if any(o < 0 for o in offsets.values()):
            raise SparkOptionError(f"option 'startingOffsets' holds a negative offset: {raw_start!r}")
        return cls(**common, starting="offsets", starting_offsets=offsets)


def cap_offsets(
    start: Mapping[str, int], latest: Mapping[str, int], per_partition: int | None, total: int | None
) -> Offsets:
    """The end offsets of one micro-batch: ``latest``, at most ``per_partition`` past ``start`` in
    each partition and at most ``total`` past ``start`` altogether (shared out evenly, so one busy
    partition cannot starve the others). Never below ``start``."""
    room = {p: max(0, end - start.get(p, 0)) for p, end in latest.items()}
    if per_partition is not None:
        room = {p: min(n, per_partition) for p, n in room.items()}
    if total is not None and sum(room.values()) > total:
        # Water-filling: each round gives every partition that still has data an equal share.
        granted = dict.fromkeys(room, 0)
        left = total
        hungry = sorted(p for p, n in room.items() if n > 0)
        while left > 0 and hungry:
            share = max(1, left // len(hungry))
            for p in list(hungry):
                give = min(share, room[p] - granted[p], left)
                granted[p] += give
                left -= give
                if granted[p] >= room[p]:
                    hungry.remove(p)
                if left == 0:
                    break
        room = granted
    return {p: start.get(p, 0) + n for p, n in room.items()}


class StreamSplit(InputPartition):
    """One stream partition's offsets ``start .. end - 1`` of a micro-batch."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__(partition)
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"StreamSplit(partition={self.partition}, offsets={self.start}..{self.end - 1})"


@dataclass(frozen=True)
class _Snapshot:
    """The stream at one trigger: its identity and the partitions the query reads."""

    identity: StreamIdentity
    partitions: dict[str, PartitionNow]

    @property
    def latest(self) -> Offsets:
        return {p: now.next_offset for p, now in self.partitions.items()}

    def offset(self, next_offsets: Offsets, reset_from: Offsets | None = None) -> dict[str, Any]:
        return SourceOffset(self.identity, next_offsets, reset_from or {}).to_json()


class LiftbridgeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``readStream.format("liftbridge")``: per-partition offsets, high watermark as the latest.

    Runs on the driver (in a Python worker Spark keeps for the query); ``read`` runs on executors.
    Every trigger checks the checkpoint's last offsets against the stream (:mod:`.stream_offsets`).

    :raises SparkOptionError: bad options.
    :raises SparkStreamError: the stream does not exist (at start), was deleted, or a partition
        is paused (whenever the source looks for new data).
    :raises SparkDataLossError: the checkpoint no longer matches the stream (recreated stream,
        offset beyond the newest, messages removed by retention) and ``failOnDataLoss`` is true.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = StreamReadOptions.from_options(options)
        self.stream = self.options.stream
        self.settings = from_options(options)
        self._target: _Snapshot | None = None
        self._latest: dict[str, Any] | None = None
        self._planned: dict[str, Any] | None = None
        with self._client() as client:
            count = len(self._info(client).partitions)
            self.partition_ids = requested_partitions(self.stream, count, self.options.partitions)

    # -- helpers (driver side) ------------------------------------------------------------

    def _client(self) -> LiftbridgeClient:
        return LiftbridgeClient.from_settings(self.settings)

    def _info(self, client: LiftbridgeClient) -> StreamInfo:
        try:
            return stream_info(client, self.stream)
        except SparkStreamError:
            raise SparkStreamError(
                f"stream {self.stream!r} does not exist (or was deleted): a streaming query can only read an "
                "existing stream; create it (a recreated stream is detected against the checkpoint when "
                f"the query reads on: see option {FAIL_ON_DATA_LOSS!r})"
            ) from None
        except LiftbridgeError as exc:
            raise SparkStreamError(f"cannot look up stream {self.stream!r}: {type(exc).__name__}: {exc}") from exc

    def _identity(self, client: LiftbridgeClient) -> tuple[StreamIdentity, tuple[int, ...]]:
        info = self._info(client)
        count = len(info.partitions)
        wanted = requested_partitions(self.stream, count, self.options.partitions)
        return StreamIdentity(self.stream, info.creation_timestamp, count), wanted

    def _snapshot(self) -> _Snapshot:
        """The stream's identity and, per partition read, its high watermark + 1 and newest offset."""
        parts: dict[str, PartitionNow] = {}
        with self._client() as client:
            identity, wanted = self._identity(client)
            for partition in wanted:
                try:
                    info = client.fetch_partition_metadata(self.stream, partition)
                except LiftbridgeError as exc:
                    raise self._partition_error(client, partition, exc) from exc
                parts[str(partition)] = PartitionNow(info.high_watermark + 1, info.newest_offset)
        return _Snapshot(identity, parts)

    def _partition_error(self, client: LiftbridgeClient, partition: int, exc: Exception) -> SparkStreamError:
        try:
            paused = stream_info(client, self.stream).partitions[partition].paused
        except Exception:
            paused = False
        if paused:
            return SparkStreamError(
                f"partition {partition} of stream {self.stream!r} is paused, so its high watermark cannot be read: "
                "resume it (publish to it, or subscribe with resume) and restart the query; the query's "
                "checkpoint keeps its position"
            )
        return SparkStreamError(
            f"cannot read the high watermark of stream {self.stream!r} partition {partition}: "
            f"{type(exc).__name__}: {exc}"
        )

    def _earliest(self, client: LiftbridgeClient, partition: str, now: PartitionNow) -> int:
        """The earliest offset retention left in ``partition`` (its next offset when it holds none).

        Liftbridge's metadata does not report it. ``oldest_retained`` finds it without waiting for
        a new message, as a subscription from EARLIEST on a log that retention emptied would. That
        case costs it the client's ``timeout``.
        """
        return oldest_retained(client, self.stream, int(partition), now.next_offset - 1)

    def _time_offsets(self, time_ns: int, latest: Offsets) -> Offsets:
        """Per partition, the offset of the first committed message at or after ``time_ns`` (else latest)."""
        start_at = datetime_of_ns(time_ns)
        found: Offsets = {}
        with self._client() as client:
            for p, end in latest.items():
                found[p] = end
                if end == 0:
                    continue
                for message in client.subscribe(self.stream, partition=int(p), start_at=start_at, stop_at=end - 1):
                    if message.timestamp >= time_ns:
                        found[p] = message.offset
                        break
        return found

    def _data_loss(self, losses: list[str]) -> None:
        """Fail the query (``failOnDataLoss``, the default), or log the losses and go on."""
        if self.options.fail_on_data_loss:
            raise data_loss_error(self.stream, losses)
        log.warning(
            "stream %r: %s. %s=false: the query goes on from the earliest available offsets, so messages were "
            "skipped or will be read again",
            self.stream,
            "; ".join(losses),
            FAIL_ON_DATA_LOSS,
        )

    def _resolve(self, previous: SourceOffset, snapshot: _Snapshot) -> Offsets:
        """Where the next micro-batch starts in each partition, after checking the checkpoint."""
        if previous.identity is None:
            log.warning(
                "stream %r: the checkpoint's offsets carry no stream identity (written by an earlier version of "
                "this source), so a deleted and recreated stream cannot be detected for this micro-batch; the "
                "next offsets record it",
                self.stream,
            )
        with self._client() as client:
            found = resolve_starts(
                previous,
                snapshot.identity,
                snapshot.partitions,
                lambda p: self._earliest(client, p, snapshot.partitions[p]),
            )
        if found.added:
            log.info(
                "stream %r: partition(s) %s are not in the checkpoint; reading them from their earliest offset",
                self.stream,
                ", ".join(found.added),
            )
        if found.losses:
            self._data_loss(found.losses)
        return found.starts

    # -- DataSourceStreamReader ----------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        snapshot = self._snapshot()
        latest = snapshot.latest
        start = self.options.starting
        if start == "latest":
            return snapshot.offset(latest)
        if start == "timestamp":
            assert self.options.starting_time_ns is not None
            return snapshot.offset(self._time_offsets(self.options.starting_time_ns, latest))
        given = self.options.starting_offsets or {}
        unknown = sorted(set(given) - {int(p) for p in latest})
        if unknown:
            raise SparkOptionError(
                f"option 'startingOffsets' names partition(s) {unknown} that this query does not read "
                f"(stream {self.stream!r}, partitions {sorted(int(p) for p in latest)})"
            )
        with self._client() as client:
            return snapshot.offset(
                {
                    p: min(given[int(p)], end) if int(p) in given else self._earliest(client, p, snapshot.partitions[p])
                    for p, end in latest.items()
                }
            )

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_partition is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_per_partition * len(self.partition_ids))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        previous = SourceOffset.parse(start)
        snapshot = self._target if self._target is not None else self._snapshot()
        starts = self._resolve(previous, snapshot)
        latest = snapshot.latest
        self._latest = snapshot.offset(latest)
        if isinstance(limit, ReadAllAvailable):
            end = cap_offsets(starts, latest, None, None)
        else:
            total = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            end = cap_offsets(starts, latest, self.options.max_per_partition, total)
        reset = {p: s for p, s in starts.items() if previous.next.get(p) != s}
        if not reset and end == previous.next and previous.identity == snapshot.identity:
            return start  # nothing new: the very same offset tells Spark so
        self._planned = snapshot.offset(end, reset)
        return self._planned

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        # Bounded run: what is committed now, and nothing written later.
        self._target = self._snapshot()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        previous, until = SourceOffset.parse(start), SourceOffset.parse(end)
        if end != self._planned and not self._still_matches(until):
            return []  # a replayed batch of a stream since recreated, with failOnDataLoss=false
        splits = []
        for p, stop in sorted(until.next.items(), key=lambda item: int(item[0])):
            first = until.start_of(p, previous)
            if stop > first:
                splits.append(StreamSplit(int(p), first, stop))
        return splits

    def _still_matches(self, until: SourceOffset) -> bool:
        """Whether a micro-batch Spark replays from its offset log (planned before a restart) still
        reads the stream incarnation it was planned on."""
        if until.identity is None:
            return True
        with self._client() as client:
            identity, _ = self._identity(client)
        if identity == until.identity:
            return True
        self._data_loss([describe_change(until.identity, identity)])
        return False

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamSplit)
        split = LiftbridgeSplit(partition.partition, partition.start, partition.end - 1)
        delivered = 0
        try:
            for batch in read_split(self.stream, self.settings, split):
                delivered += batch.num_rows
                yield batch
        except Exception as exc:
            raise SparkReadError(
                f"reading stream {self.stream!r} partition {partition.partition} offsets "
                f"{partition.start}..{partition.end - 1} failed after {delivered} message(s): "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        expected = partition.end - partition.start
        if delivered != expected:
            # Offsets below the high watermark are committed: fewer means retention removed them
            # between planning and reading.
            message = (
                f"stream {self.stream!r} partition {partition.partition} delivered {delivered} message(s) for "
                f"offsets {partition.start}..{partition.end - 1} ({expected} expected): messages were removed "
                "(retention, compaction) before the query read them"
            )
            if self.options.fail_on_data_loss:
                raise SparkReadError(
                    f"{message}; set the source option {FAIL_ON_DATA_LOSS}=false to go on without them"
                )
            log.warning("%s; %s=false: going on", message, FAIL_ON_DATA_LOSS)

    def commit(self, end: dict[str, Any]) -> None:
        # Liftbridge keeps the log; the query's checkpoint is the source of truth for positions.
        return None


# ---------------------------------------------------------------------------------------------
# Sink


@dataclass
class _BatchSummary(WriterCommitMessage):
    summary: dict[str, Any]


class LiftbridgeStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("liftbridge")``: each micro-batch partition publishes like
    ``publish_dataframe``; exactly-once across query restarts by default.

    Options: the writer's (``docs/spark.md``), plus ``deliveryGuarantee`` (``exactlyOnce`` or
    ``atLeastOnce``) and ``producerIdPrefix``.

    :raises SparkOptionError: bad options or columns (when the query starts).
    :raises SparkStreamError: the stream does not exist (when the query starts).
    """

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        lowered = _lowered(options)
        raw = lowered.get("deliveryguarantee", EXACTLY_ONCE)
        guarantee = raw.replace("_", "").replace("-", "").lower()
        if guarantee not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise SparkOptionError(f"option 'deliveryGuarantee' must be 'exactlyOnce' or 'atLeastOnce', got {raw!r}")
        self.exactly_once = guarantee == EXACTLY_ONCE
        self.prefix = lowered.get("produceridprefix", DEFAULT_PRODUCER_PREFIX)
        self.settings = from_options(options)
        plan = plan_from_options(options)
        plan.validate_schema(schema)
        self.plan = resolve_plan(plan, self.settings)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _BatchSummary:
        from pyspark import TaskContext

        context = TaskContext.get()
        spark_partition = context.partitionId() if context is not None else 0
        producer_id = None
        if self.exactly_once:
            query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
            batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
            if not query_id or batch_id is None:
                raise SparkOptionError(
                    "exactly-once streaming publish needs the query id and batch id Spark gives micro-batch "
                    "tasks, and found none: use deliveryGuarantee=atLeastOnce for this trigger"
                )
            producer_id = f"{self.prefix}/{query_id}/{batch_id}"
        return _BatchSummary(publish_partition(iterator, self.plan, self.settings, spark_partition, producer_id))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        summaries = [m.summary for m in messages if isinstance(m, _BatchSummary)]
        summary = merge_summaries(self.plan.stream, self.plan.ack_policy, summaries, 0.0)
        if self.exactly_once:  # the batch is committed only once no row of it is stored twice
            check_between_tasks(self.settings, self.plan.stream, summaries)
        log.info(
            "micro-batch %d: %d row(s) published to %s, %d skipped (already there)",
            batchId,
            summary.count - summary.skipped,
            summary.stream,
            summary.skipped,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Acknowledged messages are durable; with exactly-once a replay of this batch skips them.
        return None
