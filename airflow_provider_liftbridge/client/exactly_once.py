"""Exactly-once publishing (ADR 2): a producer id and sequence numbers on every record, a durable
per-partition scan start, and resumption by scanning instead of re-sending blindly.

How it works, in order:

1. Every record carries the headers ``lb-producer`` (the producer id, stable across retries) and
   ``lb-seq`` (its position in the producer's input, from 0, in ASCII decimal).
2. Before the first record goes to a partition, the partition's next offset (high watermark + 1)
   is stored in the cursor ``lb-producer:<producer id>`` of that partition, unless the cursor
   exists already. It never moves afterwards: it is where this producer's records can start.
3. A publisher's first call reads every partition that has such a cursor, from the cursor to the
   high watermark, and collects the sequence numbers of its own records. Records already in the
   stream are skipped (and counted as skipped), the rest are published (and counted as written).
4. When a send fails (lost connection, ack timeout, optimistic-concurrency refusal), nothing is
   re-sent blindly: the publisher waits until every partition it reads has no uncommitted tail
   (``newest_offset == high_watermark``, see :meth:`ExactlyOncePublisher._settle`), reads what
   was added since its last scan, and sends only the records that are still missing. A record
   above the high watermark cannot be read yet (subscribers see committed messages only), so
   sending before the tail commits or is truncated could write a second copy. The same wait
   comes before the first scan of a partition an earlier attempt wrote to.
5. Every record is published with the offset it must get (``expected_offset``): the offset after
   the last one the scan (or an ack) has seen, never more. On a stream
   created with optimistic concurrency control the server refuses it if anything else was
   written first, so no other writer (not even a zombie attempt of the same producer) can
   interleave with it unnoticed; on other streams the server ignores the expected offset.

Records are sent by the client's batch publisher (``LiftbridgeClient.batch_publisher``: the
client's path, NATS-direct when it knows NATS servers, else gRPC PublishAsync) with
``resend=NO_RESEND`` and the publisher's ``compression``: a record whose ack is missing is never
sent again blindly, and after a failed batch the publisher drops the client's NATS connection
before it scans, so nothing buffered there reaches the server after the scan. Compression
changes only the values: a scan identifies records by their ``lb-producer`` / ``lb-seq`` headers,
which are never compressed, and reads through a subscription of the client, which hands back the
original values (or, for a value it cannot decompress, the stored one with its headers intact).

No Airflow, no PySpark. See ``docs/exactly-once.md`` for the guarantee and its limits.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import operator
import random
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

from airflow_provider_liftbridge.codec import header_field, header_field_head

from .compression import Compression, check_compression
from .errors import (
    AckTimeoutError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PublishError,
    RequestTimeoutError,
    ServerError,
    UnavailableError,
)
from .partitioners import PartitionerFunc
from .presence import missing_confirmed
from .publishing.batch import PublishPath
from .publishing.columns import RecordColumns
from .publishing.publisher import DEFAULT_BATCH
from .publishing.resend import NO_RESEND
from .publishing.summary import PartitionRange
from .sync_client import LiftbridgeClient
from .types import Ack, AckPolicy, PartitionInfo, Record, StreamInfo

__all__ = [
    "CURSOR_PREFIX",
    "PRODUCER_HEADER",
    "SEQ_HEADER",
    "ExactlyOnceError",
    "ExactlyOncePublishError",
    "ExactlyOncePublisher",
    "ExactlyOnceResult",
    "SeqSet",
    "Sender",
    "UncommittedTailError",
    "producer_cursor_id",
    "producer_id_for",
    "read_producer_records",
]

log = logging.getLogger(__name__)

#: Header naming the producer of a record.
PRODUCER_HEADER = "lb-producer"
#: Header holding the record's sequence number (ASCII decimal).
SEQ_HEADER = "lb-seq"
#: Prefix of the cursor that stores a producer's scan start.
CURSOR_PREFIX = "lb-producer:"
#: Longest producer id accepted (it travels in every record's headers).
MAX_PRODUCER_ID = 512

# Errors after which a send is worth resuming (re-scan, then send what is missing). Anything else
# (read-only partition, message too large, bad argument, ...) will fail again. "No such stream"
# is resumable only for a stream this publisher has seen, until metadata confirms it (presence.py).
_RESUMABLE = (UnavailableError, RequestTimeoutError, NotLeaderError, IncorrectOffsetError, ServerError)
_MISSING = (NoSuchStreamError, NoSuchPartitionError)


class ExactlyOnceError(LiftbridgeError):
    """Base of the errors of exactly-once publishing."""


class ExactlyOncePublishError(ExactlyOnceError):
    """An exactly-once publish stopped before every record was in the stream.

    Publishing again with the same producer id resumes where this one stopped: nothing already in
    the stream is written twice.

    :ivar result: what was written and skipped before the failure.
    """

    def __init__(self, message: str, result: ExactlyOnceResult) -> None:
        super().__init__(message)
        self.result = result


class UncommittedTailError(ExactlyOncePublishError):
    """A resumption found records above a partition's high watermark (written by the leader but
    not committed) that were neither committed nor truncated within ``tail_wait`` seconds.

    Such records cannot be read yet, so whether the ones sent last are among them cannot be told,
    and nothing more was sent. Publishing again with the same producer id resumes without
    duplicates: it waits for the tail again first.

    :ivar partition: the partition whose tail did not settle.
    :ivar high_watermark: its high watermark at the last reading.
    :ivar newest_offset: its newest offset at the last reading.
    """

    def __init__(
        self, message: str, result: ExactlyOnceResult, *, partition: int, high_watermark: int, newest_offset: int
    ) -> None:
        super().__init__(message, result)
        self.partition = partition
        self.high_watermark = high_watermark
        self.newest_offset = newest_offset


class _TailNotSettled(ExactlyOnceError):
    """Internal: the wait for a partition's tail ran out (turned into :class:`UncommittedTailError`)."""

    def __init__(self, info: PartitionInfo, waited: float) -> None:
        super().__init__(f"partition {info.id} did not settle within {waited:g} s")
        self.info = info
        self.waited = waited


def producer_id_for(dag_id: str, task_id: str, run_id: str, map_index: int | None = None) -> str:
    """The default producer id of an Airflow task instance: ``dag_id/task_id/run_id[/map_index]``.

    It is the same for every try of the task instance and differs between runs, so a retry
    resumes its own earlier tries and nothing else.

    :raises InvalidArgumentError: an empty part.
    """
    parts = [dag_id, task_id, run_id]
    if any(not isinstance(p, str) or not p for p in parts):
        raise InvalidArgumentError(f"dag_id, task_id and run_id must be non-empty strings, got {parts!r}")
    if map_index is not None and map_index >= 0:
        parts.append(str(map_index))
    return "/".join(parts)


def producer_cursor_id(producer_id: str) -> str:
    """The cursor id under which a producer's scan start is stored (one per stream partition)."""
    return CURSOR_PREFIX + producer_id


def _check_producer_id(producer_id: Any) -> str:
    if not isinstance(producer_id, str) or not producer_id.strip():
        raise InvalidArgumentError(f"producer_id must be a non-empty string, got {producer_id!r}")
    if len(producer_id) > MAX_PRODUCER_ID:
        raise InvalidArgumentError(
            f"producer_id is {len(producer_id)} characters long; keep it under {MAX_PRODUCER_ID} (it is sent with "
            "every record)"
        )
    return producer_id


class SeqSet:
    """A set of non-negative ints kept as sorted, disjoint, non-adjacent ``[start, end]`` runs.

    A producer's records are mostly one run per attempt, so this stays tiny where a plain ``set``
    of millions of sequence numbers would not.
    """

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._size = 0
        for v in values:
            self.add(v)

    def __len__(self) -> int:
        return self._size

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect.bisect_right(self._starts, value) - 1
        return i >= 0 and value <= self._ends[i]

    def add(self, value: int) -> bool:
        """Add ``value``; return ``False`` if it was there already."""
        i = bisect.bisect_right(self._starts, value) - 1
        if i >= 0 and value <= self._ends[i]:
            return False
        self._size += 1
        joins_left = i >= 0 and self._ends[i] == value - 1
        joins_right = i + 1 < len(self._starts) and self._starts[i + 1] == value + 1
        if joins_left and joins_right:
            self._ends[i] = self._ends[i + 1]
            del self._starts[i + 1], self._ends[i + 1]
        elif joins_left:
            self._ends[i] = value
        elif joins_right:
            self._starts[i + 1] = value
        else:
            self._starts.insert(i + 1, value)
            self._ends.insert(i + 1, value)
        return True

    def top(self) -> int:
        """The largest value, or -1 when empty (a value above it is certainly not in the set)."""
        return self._ends[-1] if self._ends else -1

    def add_run_above(self, first: int, last: int) -> None:
        """Add ``first..last`` (inclusive), all above :meth:`top` (checked)."""
        if first <= self.top() or last < first:
            raise ValueError(f"run {first}..{last} is not above {self.top()}")
        if self._ends and self._ends[-1] == first - 1:
            self._ends[-1] = last
        else:
            self._starts.append(first)
            self._ends.append(last)
        self._size += last - first + 1

    def runs(self) -> list[tuple[int, int]]:
        """The runs, as inclusive ``(start, end)`` pairs in order."""
        return list(zip(self._starts, self._ends, strict=True))


_OFFSET = operator.attrgetter("offset")
_PARTITION = operator.attrgetter("partition")


def _merge(ranges: dict[int, PartitionRange], partition: int, more: PartitionRange) -> None:
    got = ranges.get(partition)
    if got is None:
        ranges[partition] = more
    else:
        got.merge(more)


def _note(ranges: dict[int, PartitionRange], partition: int, offset: int) -> None:
    got = ranges.get(partition)
    if got is None:
        ranges[partition] = PartitionRange(offset, offset)
    else:
        got.add(offset)


@dataclass
class ExactlyOnceResult:
    """The outcome of an exactly-once publish (YDB's written / skipped acks, summed up).

    :ivar stream: the stream.
    :ivar producer_id: the producer id.
    :ivar written: records this call put into the stream.
    :ivar skipped: records that were in the stream already (an earlier attempt wrote them).
    :ivar partitions: offsets of the records written by this call, by partition.
    :ivar resumes: how many times a failed send was resumed (re-scan, send the rest).
    """

    stream: str
    producer_id: str
    written: int = 0
    skipped: int = 0
    partitions: dict[int, PartitionRange] = field(default_factory=dict)
    resumes: int = 0

    @property
    def count(self) -> int:
        """Records handled: ``written + skipped``."""
        return self.written + self.skipped

    def to_dict(self) -> dict[str, Any]:
        """A small JSON-safe dict (partition numbers as strings, as XCom wants)."""
        return {
            "stream": self.stream,
            "producer_id": self.producer_id,
            "written": self.written,
            "skipped": self.skipped,
            "resumes": self.resumes,
            "partitions": {
                str(p): {"first_offset": r.first_offset, "last_offset": r.last_offset, "count": r.count}
                for p, r in sorted(self.partitions.items())
            },
        }


class Sender(Protocol):
    """Publishes one batch of records (each with its partition set) and returns their acks in
    input order, raising :class:`PublishError` when some record got no ack or was refused.

    A sender must never re-send a record on its own: whether a record whose ack is missing is in
    the stream is for the publisher to find out by scanning.
    """

    def send(self, records: Sequence[Record]) -> Sequence[Ack]: ...

    def reset(self) -> None:
        """Drop connections after a failure, so nothing queued in them is delivered later."""

    def close(self) -> None: ...


def _seq_of(headers: Mapping[str, bytes], producer: bytes) -> int | None:
    """The sequence number of a message if ``producer`` wrote it, else ``None``."""
    if headers.get(PRODUCER_HEADER) != producer:
        return None
    raw = headers.get(SEQ_HEADER)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def read_producer_records(
    client: LiftbridgeClient, stream: str, producer_id: str, partition: int, start: int, stop: int
) -> Iterator[tuple[int, int]]:
    """Yield ``(offset, seq)`` of ``producer_id``'s records in ``partition`` between offsets
    ``start`` and ``stop`` (inclusive). Nothing when ``stop < start``.

    :raises LiftbridgeError: the subscription failed (see ``LiftbridgeClient.subscribe``).
    """
    if stop < start:
        return
    producer = producer_id.encode()
    for message in client.subscribe(stream, partition=partition, start_at=start, stop_at=stop):
        seq = _seq_of(message.headers, producer)
        if seq is not None:
            yield message.offset, seq
        if message.offset >= stop:
            return


@dataclass
class _PartitionState:
    scan_start: int  # the cursor: where this producer's records can start
    scanned_to: int  # last offset read (or known to hold nothing unknown of ours)
    next_offset: int  # the offset the next record sent here must get
    hw_seen: int = -1  # the highest high watermark read: committed records never go away


class _SeqWires(Sequence[bytes]):
    """The encoded headers of records ``seqs`` of one producer, made when asked for: the batch
    publisher asks for a burst at a time, as it frames the records, so the work is spread over
    the send (where it overlaps the server's) instead of coming before it."""

    __slots__ = ("_producer_field", "_seqs")

    def __init__(self, producer_field: bytes, seqs: Sequence[int]) -> None:
        self._producer_field = producer_field
        self._seqs = seqs

    def __len__(self) -> int:
        return len(self._seqs)

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        producer, head = self._producer_field, header_field_head
        if isinstance(i, slice):
            return [producer + head(SEQ_HEADER, len(s)) + s for s in map(b"%d".__mod__, self._seqs[i])]
        seq = b"%d" % self._seqs[i]
        return producer + head(SEQ_HEADER, len(seq)) + seq


class _Batch:
    """Records waiting for their acks: their sequence numbers, and the records as columns
    (value, partition, encoded headers, key) without the expected offset each send gives them
    (see :meth:`ExactlyOncePublisher._with_offsets`). A record object per record would cost more
    than framing it does; the columns go to the batch publisher as they are."""

    __slots__ = ("seqs", "records")

    def __init__(self, seqs: Sequence[int] = (), records: RecordColumns | None = None) -> None:
        self.seqs = seqs
        self.records = records if records is not None else RecordColumns([], [], [])

    def __len__(self) -> int:
        return len(self.seqs)

    def take(self, indices: Sequence[int]) -> _Batch:
        """The records at ``indices``, in that order."""
        return _Batch([self.seqs[i] for i in indices], self.records.take(indices))

    def without(self, seqs: Container[int]) -> _Batch:
        """The records whose sequence numbers are not in ``seqs``."""
        return self.take([i for i, seq in enumerate(self.seqs) if seq not in seqs])


class ExactlyOncePublisher:
    """Publish records exactly once per producer id, resuming earlier attempts (see module doc).

    Sequence numbers continue across :meth:`publish` calls of one publisher (a task publishing
    several files numbers their rows as one sequence). The input must be the same, in the same
    order, on every attempt: a record is identified by its position only.

    :param client: the client used for metadata, cursors and scans (its retries are fine there).
    :param stream: the stream (it must exist).
    :param producer_id: stable across retries, unique per data set; see :func:`producer_id_for`.
    :param partition: partition of records that name none (else ``partitioner``, else 0).
    :param partitioner: chooses the partition of records without one (``KeyPartitioner()``, ...).
        A partitioner that is not deterministic (round robin) is fine: skipping does not depend on
        where an earlier attempt put a record.
    :param ack_policy: ``LEADER`` (default) or ``ALL`` (use ``ALL`` on a replicated cluster: a
        record acknowledged by the leader alone can be lost when the leader fails).
    :param batch: input records read and sent per batch (fewer are sent when some are in the stream
        already); every ack of a batch is in before the next batch is read. Larger batches hold
        more in memory and drain the window less often.
    :param window: records in flight at a time within a batch (default: the client's for the path).
    :param timeout: how long to wait for each ack, seconds.
    :param path: the client's publish path (``"auto"``: NATS-direct when the client knows NATS
        servers, else gRPC; ``"nats"``; ``"grpc"``), see ``LiftbridgeClient.publish_many``.
    :param compression: ``"gzip"`` or ``"zstd"`` (the ``zstd`` extra): values are compressed by
        the batch publisher and marked by a ``content-encoding`` header (see :mod:`.compression`).
        Resuming is unaffected: records are recognised by their producer and sequence headers.
    :param sender: a custom :class:`Sender` instead of the client's batch publisher (tests inject
        faults with it); it must not re-send. It sends records as it gets them: ``compression``
        applies to the client's batch publisher only.
    :param max_resumes: how many times in a row a batch may fail and be resumed before giving up.
    :param backoff: first wait after a failed send, seconds (doubled per failure, at most 5 s).
    :param settle: how long a partition's newest offset must stay unchanged after a failed send
        before it is scanned (a record still queued in the server must land first), seconds; also
        the interval between readings while waiting for an uncommitted tail.
    :param tail_wait: how long a resumption waits for records above a partition's high watermark
        to be committed (or truncated by a new leader) before it gives up with
        :class:`UncommittedTailError`, seconds. Liftbridge drops a stalled follower from the ISR
        after ``replica.max.lag.time`` (15 s by default) and replaces a dead leader after
        ``replica.max.leader.timeout`` (15 s): keep this above both.
    :raises InvalidArgumentError: an empty or overlong producer id, ack policy ``NONE``, a
        non-positive batch, window or timeout, a compression other than ``"gzip"``, ``"zstd"`` or
        ``None`` (or ``"zstd"`` without the zstandard package).
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        producer_id: str,
        *,
        partition: int | None = None,
        partitioner: PartitionerFunc | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        batch: int = DEFAULT_BATCH,
        window: int | None = None,
        timeout: float = 10.0,
        path: PublishPath = "auto",
        compression: Compression = None,
        sender: Sender | None = None,
        max_resumes: int = 8,
        backoff: float = 0.2,
        settle: float = 0.2,
        tail_wait: float = 30.0,
    ) -> None:
        if not stream:
            raise InvalidArgumentError("stream must be a non-empty stream name")
        self.producer_id = _check_producer_id(producer_id)
        if AckPolicy(ack_policy) is AckPolicy.NONE:
            raise InvalidArgumentError(
                "exactly-once publishing needs acknowledgements; use ack policy LEADER or ALL, not NONE"
            )
        for name, value in (("batch", batch), ("window", window or 1), ("timeout", timeout), ("tail_wait", tail_wait)):
            if value <= 0:
                raise InvalidArgumentError(f"{name} must be positive, got {value!r}")
        if max_resumes < 0:
            raise InvalidArgumentError(f"max_resumes must not be negative, got {max_resumes}")
        self.client = client
        self.stream = stream
        self.partition = partition
        self.partitioner = partitioner
        self.ack_policy = AckPolicy(ack_policy)
        self.batch = batch
        self.window = window
        self.timeout = float(timeout)
        self.path: PublishPath = path
        self.compression = check_compression(compression)
        self.max_resumes = max_resumes
        self.backoff = backoff
        self.settle = settle
        self.tail_wait = float(tail_wait)
        # Time goes through these two, so a scripted test can run the waits on a virtual clock.
        self._clock: Callable[[], float] = time.monotonic
        self._sleep: Callable[[float], None] = time.sleep
        self._sender = sender
        self._own_sender = sender is None
        self._cursor_id = producer_cursor_id(self.producer_id)
        self._producer = self.producer_id.encode()
        #: The producer's header entry, encoded once: every record carries it (see _prepare).
        self._producer_field = header_field(PRODUCER_HEADER, self._producer)
        self._seen = SeqSet()
        # seq -> (partition, offset) of records acknowledged in a batch that then failed, so the
        # re-scan recognises them instead of taking them for duplicates.
        self._acked_at: dict[int, tuple[int, int]] = {}
        self._parts: dict[int, _PartitionState] = {}
        self._partition_count = 0
        self._subject = ""
        self._info: StreamInfo | None = None  # the stream's metadata as the last resume read it
        # Partitions the last resume found without a cursor: the first send there stores the scan
        # start without asking again (cleared after each publish call, so the answer is fresh).
        self._no_cursor: set[int] = set()
        self._next_seq = 0
        self._resumed = False
        #: Offsets of this producer's records found in the stream by scans (earlier attempts), by partition.
        self.found: dict[int, PartitionRange] = {}
        #: Own sequence numbers seen more than once by scans (a zombie attempt on a stream without OCC).
        self.duplicates_seen = 0
        #: Totals over every :meth:`publish` call.
        self.total = ExactlyOnceResult(stream, self.producer_id)

    # -- public -----------------------------------------------------------------------------
    def publish(self, records: Iterable[Record | bytes]) -> ExactlyOnceResult:
        """Publish ``records`` (the next sequence numbers of this producer), skipping those an
        earlier attempt already put in the stream. Reads the input lazily, ``batch`` at a time.

        :returns: written / skipped counts and the offsets written by this call.
        :raises ExactlyOncePublishError: a batch could not be completed after ``max_resumes``
            resumptions, or failed in a way a resumption cannot fix (read-only partition, message
            too large, ...); ``.result`` says what was done; ``__cause__`` is the last error.
        :raises NoSuchStreamError: the stream does not exist.
        :raises InvalidArgumentError: a record is neither ``Record`` nor bytes, or a partitioner
            returned a partition out of range.
        """
        result = ExactlyOnceResult(self.stream, self.producer_id)
        if not self._resumed:
            self._with_resumes(result, lambda: self._resume(), "reading the stream to resume")
        try:
            iterator = iter(records)
            while chunk := list(itertools.islice(iterator, self.batch)):
                batch = self._batch_of(chunk, result)
                if batch:
                    self._publish_batch(batch, result)
        finally:
            self._no_cursor.clear()
            self._info = None
            self._accumulate(result)
            if self._own_sender:
                self.close()
        return result

    def close(self) -> None:
        """Close the sender's connections (a later :meth:`publish` opens new ones)."""
        if self._sender is not None:
            self._sender.close()
            if self._own_sender:
                self._sender = None

    def __enter__(self) -> ExactlyOncePublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resuming ---------------------------------------------------------------------------
    def _resume(self) -> None:
        """Learn the partitions, then read every partition this producer has written to (once
        its uncommitted tail, if any, has settled)."""
        info = self.client.fetch_metadata([self.stream]).streams.get(self.stream)
        if info is None:
            raise NoSuchStreamError(f"stream {self.stream!r} does not exist; create it first or check the name.")
        self._subject = info.subject
        self._info = info
        self._partition_count = max(1, len(info.partitions))
        for p in sorted(info.partitions) or [0]:
            if p not in self._parts:  # a resume cut short by a failure keeps what it learned
                start = self.client.fetch_cursor(self._cursor_id, self.stream, p)
                if start < 0:
                    self._no_cursor.add(p)
                    continue
                self._parts[p] = _PartitionState(scan_start=start, scanned_to=start - 1, next_offset=start)
        settled = self._settle(sorted(self._parts))
        for p, part in settled.items():
            self._scan(p, {}, part)
        self._resumed = True
        if len(self._seen):
            log.info(
                "Producer %r resumes on stream %r: %d record(s) already in the stream (sequence runs %s)",
                self.producer_id,
                self.stream,
                len(self._seen),
                self._seen.runs()[:5],
            )

    def _scan(self, partition: int, wanted: Container[int], info: PartitionInfo) -> dict[int, int]:
        """Read ``partition`` from after the last scanned offset to ``info``'s high watermark (a
        settled reading: nothing above it); add own sequence numbers to the seen set. Return
        ``{seq: offset}`` of the ``wanted`` ones found.

        Progress is kept per message, so a scan cut short by a failure continues where it stopped.
        """
        state = self._parts[partition]
        found: dict[int, int] = {}
        if info.newest_offset < state.scanned_to:
            # The log is shorter than what we knew of it: a new leader truncated records that only
            # the old leader had, acknowledged ones included (ack policy LEADER). Read again from
            # the high watermark; the lost ones cannot be told apart and stay counted as written.
            log.warning(
                "Producer %r: stream %r partition %d now ends at offset %d, below offset %d this producer had "
                "seen acknowledged; records acknowledged by the old leader alone were lost (use ack policy ALL)",
                self.producer_id,
                self.stream,
                partition,
                info.newest_offset,
                state.scanned_to,
            )
            state.scanned_to = info.high_watermark
        if info.high_watermark > state.scanned_to:
            messages = self.client.subscribe(
                self.stream, partition=partition, start_at=state.scanned_to + 1, stop_at=info.high_watermark
            )
            for message in messages:
                state.scanned_to = max(state.scanned_to, message.offset)
                self._take(partition, message.offset, message.headers, wanted, found)
            state.scanned_to = max(state.scanned_to, info.high_watermark)
        # Never above what was seen: with optimistic concurrency control, an expected offset past
        # an unread record would let the server store a second copy of it.
        state.next_offset = state.scanned_to + 1
        return found

    def _take(
        self, partition: int, offset: int, headers: Mapping[str, bytes], wanted: Container[int],
        found: dict[int, int],
    ) -> None:  # fmt: skip
        seq = _seq_of(headers, self._producer)
        if seq is None:
            return
        if self._acked_at.pop(seq, None) == (partition, offset):
            return  # acknowledged to us in a batch that failed later: known, counted
        if not self._seen.add(seq):
            self.duplicates_seen += 1
            log.warning(
                "Producer %r: sequence number %d is in stream %r more than once (partition %d offset %d); "
                "two attempts of this producer ran at the same time on a stream without optimistic "
                "concurrency control",
                self.producer_id,
                seq,
                self.stream,
                partition,
                offset,
            )
        elif seq in wanted:
            found[seq] = offset
        else:
            _note(self.found, partition, offset)

    def _ensure_cursor(self, partition: int) -> _PartitionState:
        """The partition's state; stores the scan start first if this producer never wrote there."""
        state = self._parts.get(partition)
        if state is not None:
            return state
        if partition in self._no_cursor:  # this call's resume just found none
            self._no_cursor.discard(partition)
            start = -1
        else:
            start = self.client.fetch_cursor(self._cursor_id, self.stream, partition)
        if start >= 0:  # another attempt (or a call racing this one) stored it: read from there
            self._parts[partition] = _PartitionState(scan_start=start, scanned_to=start - 1, next_offset=start)
            self._scan(partition, {}, self._settle([partition])[partition])
            return self._parts[partition]
        info = self.client.fetch_partition_metadata(self.stream, partition)
        start = info.high_watermark + 1
        self.client.set_cursor(self._cursor_id, self.stream, partition, start)
        # Nothing of ours can be there yet; an uncommitted tail is someone else's. The expected
        # offset still stops at what was seen (a foreign tail makes OCC refuse, then we wait).
        state = _PartitionState(scan_start=start, scanned_to=info.high_watermark, next_offset=start)
        self._parts[partition] = state
        return state

    # -- publishing -------------------------------------------------------------------------
    def _batch_of(self, chunk: list[Any], result: ExactlyOnceResult) -> _Batch:
        """The records of ``chunk`` (the next sequence numbers) that are not in the stream yet,
        each with its partition and headers; those that are count as skipped."""
        first = self._next_seq
        self._next_seq += len(chunk)
        seen = self._seen
        if first > seen.top() and self.partitioner is None and set(map(type, chunk)) == {bytes}:
            # The bulk case, values only and none seen: columns made at C speed, headers later.
            seqs = range(first, first + len(chunk))
            partition = self._checked_partition(0 if self.partition is None else self.partition, first)
            return _Batch(seqs, RecordColumns(chunk, [partition] * len(chunk), _SeqWires(self._producer_field, seqs)))
        kept: list[int] = []
        values: list[bytes] = []
        partitions: list[int] = []
        wires: list[bytes] = []
        keys: list[bytes | None] = []
        top = seen.top()  # sequence numbers above it need no lookup (most of them)
        for seq, item in enumerate(chunk, first):
            if seq <= top and seq in seen:
                result.skipped += 1
                continue
            value, key, partition, wire = self._prepare(item, seq)
            kept.append(seq)
            values.append(value)
            partitions.append(partition)
            wires.append(wire)
            keys.append(key)
        has_keys = any(k is not None for k in keys)
        return _Batch(kept, RecordColumns(values, partitions, wires, keys=keys if has_keys else None))

    def _prepare(self, item: Record | bytes, seq: int) -> tuple[bytes, bytes | None, int, bytes]:
        """Record ``seq``'s value, key, partition and encoded headers (the producer's entry,
        encoded once, and the sequence number, after the record's own headers).

        :raises InvalidArgumentError: not a record or bytes, or a partition out of range.
        """
        key: bytes | None
        own: Mapping[str, bytes] | None
        if isinstance(item, (bytes, bytearray, memoryview)):
            value, key, own, partition = bytes(item), None, None, self.partition
        elif isinstance(item, Record):
            value, key, own = item.value, item.key, item.headers
            partition = item.partition if item.partition is not None else self.partition
        else:
            raise InvalidArgumentError(f"record {seq} is a {type(item).__name__}; pass Record objects or bytes")
        if partition is None:
            partition = (
                0 if self.partitioner is None else self.partitioner(self.stream, key, value, self._partition_count)
            )
        seq_b = b"%d" % seq
        if own:
            # The record's own headers, then ours (which win a clash), encoded as the encoder would.
            merged = {**own, PRODUCER_HEADER: self._producer, SEQ_HEADER: seq_b}
            wire = b"".join(header_field(name, data) for name, data in merged.items())
        else:
            wire = self._producer_field + header_field_head(SEQ_HEADER, len(seq_b)) + seq_b
        return value, key, self._checked_partition(partition, seq), wire

    def _checked_partition(self, partition: Any, seq: int) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < self._partition_count:
            raise InvalidArgumentError(
                f"record {seq} goes to partition {partition!r}, but stream {self.stream!r} has "
                f"{self._partition_count} partition(s)"
            )
        return partition

    def _get_sender(self) -> Sender:
        if self._sender is None:
            self._sender = self.client.batch_publisher(
                self.stream,
                path=self.path,
                ack_policy=self.ack_policy,
                window=self.window,
                timeout=self.timeout,
                resend=NO_RESEND,
                stream_info=self._info,
                compression=self.compression,
            )
        return self._sender

    def _publish_batch(self, batch: _Batch, result: ExactlyOnceResult) -> None:
        pending = batch
        recover = False

        def attempt() -> bool:
            nonlocal pending, recover
            if recover:
                pending = self._recover(pending, result)
                recover = False
            targets = sorted(set(pending.records.partitions))
            for partition in targets:
                self._ensure_cursor(partition)
            # Ensuring a cursor may have read records another attempt wrote meanwhile: skip those.
            if pending and self._seen.top() >= pending.seqs[0]:
                kept = pending.without(self._seen)
                result.skipped += len(pending) - len(kept)
                pending = kept
            if not pending:
                return True
            outgoing = self._with_offsets(pending, targets)
            try:
                acks = self._get_sender().send(outgoing)
            except PublishError as exc:
                pending = self._account_partial(pending, exc.acks, result, partial=True)
                recover = True
                raise _unwrap(exc) from exc
            except LiftbridgeError:
                recover = True
                raise
            self._account_partial(pending, acks, result, partial=False)
            return True

        self._with_resumes(result, attempt, f"publishing records {batch.seqs[0]}..{batch.seqs[-1]}")

    def _with_offsets(self, pending: _Batch, targets: Sequence[int]) -> RecordColumns:
        """The records to send, each with the offset it must get (checked on streams with OCC);
        ``targets`` holds every partition of ``pending``."""
        parts, partitions = self._parts, pending.records.partitions
        offsets: Sequence[int]
        if len(targets) == 1:  # one partition: consecutive offsets
            state = parts[partitions[0]]
            offsets = range(state.next_offset, state.next_offset + len(partitions))
            state.next_offset += len(partitions)
        else:
            offsets = []
            append = offsets.append
            for partition in partitions:
                state = parts[partition]
                append(state.next_offset)
                state.next_offset += 1
        return pending.records.with_offsets(offsets)

    def _account_partial(
        self, pending: _Batch, acks: Sequence[Ack | None], result: ExactlyOnceResult, *, partial: bool
    ) -> _Batch:
        """Count the acknowledged records as written; return those without an ack."""
        seqs = pending.seqs
        if not partial and len(acks) == len(seqs) and seqs:
            first, last = seqs[0], seqs[-1]
            if last - first == len(seqs) - 1 and first > self._seen.top():
                self._account_run(first, last, acks, result)  # the usual case, in bulk
                return _Batch()
        left: list[int] = []
        for k, ack in enumerate(list(acks) + [None] * (len(seqs) - len(acks))):
            if ack is None:
                left.append(k)
                continue
            seq = seqs[k]
            self._seen.add(seq)
            if partial:
                self._acked_at[seq] = (ack.partition, ack.offset)
            result.written += 1
            _note(result.partitions, ack.partition, ack.offset)
            state = self._parts[ack.partition]
            state.next_offset = max(state.next_offset, ack.offset + 1)
            if not partial:  # after a failure, a record without an ack may lie below this one
                state.scanned_to = max(state.scanned_to, ack.offset)
        return pending.take(left)

    def _account_run(self, first: int, last: int, acks: Sequence[Ack | None], result: ExactlyOnceResult) -> None:
        """:meth:`_account_partial` of a whole batch of consecutive sequence numbers, all acknowledged."""
        self._seen.add_run_above(first, last)
        result.written += last - first + 1
        offsets = list(map(_OFFSET, acks))
        partitions = list(map(_PARTITION, acks))
        by_partition: dict[int, list[int]] = {}
        if partitions.count(partitions[0]) == len(partitions):  # one partition (C-speed checks)
            by_partition[partitions[0]] = offsets
        else:
            for partition, offset in zip(partitions, offsets, strict=True):
                by_partition.setdefault(partition, []).append(offset)
        for partition, got in by_partition.items():
            low, high = min(got), max(got)
            _merge(result.partitions, partition, PartitionRange(low, high, len(got)))
            state = self._parts[partition]
            state.next_offset = max(state.next_offset, high + 1)
            state.scanned_to = max(state.scanned_to, high)

    def _recover(self, pending: _Batch, result: ExactlyOnceResult) -> _Batch:
        """After a failed send: let the partitions settle, read what was added, drop what landed."""
        if self._sender is not None:
            self._sender.reset()
        partitions = sorted({p for p in pending.records.partitions if p in self._parts})
        wanted = set(pending.seqs)
        for p, info in self._settle(partitions).items():
            for offset in self._scan(p, wanted, info).values():
                # Written by this attempt, ack lost: it is in the stream, so it counts as written.
                result.written += 1
                _note(result.partitions, p, offset)
        return pending.without(self._seen)  # the scan added what it found

    def _settle(self, partitions: Sequence[int]) -> dict[int, PartitionInfo]:
        """Wait until each of ``partitions`` has settled; return the settling reading of each.

        A partition has settled when a reading shows no uncommitted tail (``newest_offset ==
        high_watermark``) and its newest offset is the one of the reading ``settle`` seconds
        before (a record the server still held has landed). While a tail is above the high
        watermark, a scan cannot see it and nothing may be sent: the wait goes on (a stalled
        follower is dropped from the ISR, a new leader truncates) for up to ``tail_wait`` seconds.
        A committed partition whose newest offset keeps moving (other writers) is taken as settled
        after ``timeout`` seconds.

        :raises _TailNotSettled: a tail was still there after ``tail_wait`` seconds.
        """
        started = self._clock()
        previous: dict[int, int] = {}
        settled: dict[int, PartitionInfo] = {}
        while True:
            waiting: list[PartitionInfo] = []
            for p in partitions:
                if p in settled:
                    continue
                info = self.client.fetch_partition_metadata(self.stream, p)
                state = self._parts[p]
                # A high watermark below one read before is a cluster still loading after a
                # restart (it reads -1 for seconds), not a partition that lost committed records.
                committed = state.hw_seen <= info.high_watermark >= info.newest_offset
                state.hw_seen = max(state.hw_seen, info.high_watermark)
                still = self.settle <= 0 or previous.get(p) == info.newest_offset
                if committed and (still or self._clock() - started >= self.timeout):
                    settled[p] = info
                else:
                    previous[p] = info.newest_offset
                    waiting.append(info)
            if not waiting:
                return settled
            if self._clock() - started >= self.tail_wait:
                raise _TailNotSettled(max(waiting, key=lambda i: i.newest_offset - i.high_watermark), self.tail_wait)
            self._sleep(self.settle if self.settle > 0 else 0.2)

    def _with_resumes(self, result: ExactlyOnceResult, step: Callable[[], object], what: str) -> None:
        """Run ``step`` until it succeeds, resuming after resumable failures, with backoff."""
        failures = 0
        while True:
            try:
                step()
                return
            except LiftbridgeError as exc:
                if isinstance(exc, _TailNotSettled):
                    raise self._unsettled(result, what, exc) from None
                if isinstance(exc, _MISSING) and self._missing_for_sure():
                    raise self._failed(result, what, exc) from exc
                if isinstance(exc, ExactlyOnceError) or not isinstance(exc, _RESUMABLE + _MISSING):
                    raise self._failed(result, what, exc) from exc
                failures += 1
                if failures > self.max_resumes:
                    raise self._failed(result, what, exc, after=failures - 1) from exc
                result.resumes += 1
                wait = min(5.0, self.backoff * 2 ** (failures - 1)) * random.uniform(0.75, 1.0)
                log.warning(
                    "Producer %r on stream %r: %s failed (%s: %s); resuming in %.1f s (%d of %d)",
                    self.producer_id,
                    self.stream,
                    what,
                    type(exc).__name__,
                    exc,
                    wait,
                    failures,
                    self.max_resumes,
                )
                self._sleep(wait)

    def _missing_for_sure(self) -> bool:
        """After a "no such stream / partition": believe it, unless this publisher has seen the
        stream and the cluster may still be loading after a restart (see :mod:`.presence`)."""
        if not self._subject:  # never seen: a wrong name or a stream not created yet
            return True
        try:
            return missing_confirmed(self.client.fetch_metadata(), self.stream)
        except LiftbridgeError:  # no answer: the cluster is not back yet
            return False

    def _unsettled(self, result: ExactlyOnceResult, what: str, exc: _TailNotSettled) -> UncommittedTailError:
        info = exc.info
        return UncommittedTailError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped while {what}: "
            f"partition {info.id} holds {info.newest_offset - info.high_watermark} record(s) above its high "
            f"watermark (newest offset {info.newest_offset}, high watermark {info.high_watermark}) that were "
            f"neither committed nor truncated within {exc.waited:g} s (a replica is stalled or the leader is "
            "failing over). Those records cannot be read yet, so whether they include ours cannot be told, and "
            f"nothing more was sent. {result.written} record(s) written and {result.skipped} skipped so far; "
            "publishing again with the same producer id resumes without duplicates once the partition has "
            "settled (raise tail_wait to wait longer).",
            result,
            partition=info.id,
            high_watermark=info.high_watermark,
            newest_offset=info.newest_offset,
        )

    def _failed(
        self, result: ExactlyOnceResult, what: str, exc: LiftbridgeError, after: int | None = None
    ) -> ExactlyOncePublishError:
        tries = f" after {after} resumption(s)" if after is not None else ""
        hint = ""
        if isinstance(exc, IncorrectOffsetError):
            hint = (
                " Another writer kept moving the partition (optimistic concurrency control refused the expected "
                "offset): stop the other writer, or publish to another partition."
            )
        # A resumable cause clears by itself; any other (cursors off, read-only, too large) must be fixed first.
        again = "publishing again" if isinstance(exc, _RESUMABLE + _MISSING) else "once that is fixed, publishing again"
        return ExactlyOncePublishError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped{tries} while "
            f"{what}: {type(exc).__name__}: {str(exc).rstrip('.')}. {result.written} record(s) written and "
            f"{result.skipped} skipped so far; {again} with the same producer id resumes without duplicates.{hint}",
            result,
        )

    def _accumulate(self, result: ExactlyOnceResult) -> None:
        total = self.total
        total.written += result.written
        total.skipped += result.skipped
        total.resumes += result.resumes
        for p, r in result.partitions.items():
            _merge(total.partitions, p, PartitionRange(r.first_offset, r.last_offset, r.count))


def _unwrap(exc: PublishError) -> LiftbridgeError:
    """The typed error behind a ``PublishError``: the failed record's own, else the cause."""
    if exc.index is not None and exc.index in exc.errors:
        return exc.errors[exc.index]
    if exc.errors:
        return exc.errors[min(exc.errors)]
    cause = exc.__cause__
    if isinstance(cause, LiftbridgeError):
        return cause
    return AckTimeoutError(str(exc)) if "ack" in str(exc).lower() else UnavailableError(str(exc))
