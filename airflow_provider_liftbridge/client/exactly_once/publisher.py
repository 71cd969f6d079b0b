"""``ExactlyOncePublisher``: exactly-once publishing (ADRs 2 and 8) as a wrapper around the
caller's publisher. It numbers the records, skips those already in the stream, hands the rest to
the publisher it wraps, and after a failed send decides what to send again (:mod:`.decision`)
from what the partitions hold (:mod:`.tail`); its knowledge lives in :mod:`.state`.

How it works, in order:

1. Every record carries the headers ``lb-producer`` (the producer id, stable across retries) and
   ``lb-seq`` (its position in the producer's input, from 0, in ASCII decimal).
2. Before the first record goes to a partition, the partition's next offset (high watermark + 1)
   is stored in the cursor ``lb-producer:<producer id>`` of that partition, unless the cursor
   exists already. It never moves afterwards: it is where this producer's records can start.
3. A publisher's first call reads every partition that has such a cursor, from the cursor to the
   high watermark, and collects the sequence numbers of its own records, then watches for
   ``quiet`` seconds whether more of them arrive (a zombie try still writing: it waits until they
   stop, for up to ``zombie_wait``). Records already in the stream are skipped (and counted as
   skipped), the rest are published (and counted as written).
4. When a send fails (lost connection, ack timeout, optimistic-concurrency refusal), nothing is
   re-sent blindly: the publisher waits until the partitions have settled (no uncommitted tail,
   no record of its own arriving from elsewhere, and the broker that got the unacknowledged
   records answering again or gone), reads what was added since its last scan, and sends only
   the records that are still missing.
5. Every record is published with the offset it must get (``expected_offset``): the offset after
   the last one the scan (or an ack) has seen, never more. On a stream created with optimistic
   concurrency control the server refuses it if anything else was written first, which fences a
   late copy and a zombie try; on other streams the server ignores it.
6. Before a call returns, the offsets between its own acknowledged records that it has not read
   (another writer's records landed between them) are read: a record of this producer stored
   twice there fails the call with :class:`ConcurrentProducerError` instead of a success.

No Airflow, no PySpark. See ``docs/exactly-once.md`` for the guarantee and its limits.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from airflow_provider_liftbridge.codec import header_field

from ..errors import InvalidArgumentError, LiftbridgeError, NoSuchStreamError, PublishError
from ..presence import missing_confirmed
from ..publishing.columns import RecordColumns
from ..publishing.contract import accounted
from ..publishing.options import PublishOptions
from ..publishing.publisher import DEFAULT_BATCH, BatchPublisher
from ..publishing.resend import NO_RESEND
from ..publishing.summary import PartitionRange
from ..sync_client import LiftbridgeClient
from ..types import Ack, AckPolicy, Record, StreamInfo
from .between import Unread, unread_of
from .decision import Resumption, suspects_after, suspects_at_start, unwrap
from .errors import ExactlyOncePublishError
from .identity import PRODUCER_HEADER, SeqWires, check_producer_id, producer_cursor_id, record_wire
from .recount import recount
from .sender import Sender, chunks
from .state import Batch, ExactlyOnceResult, PartitionState, ProducerState, merge, note
from .tail import TailReader, Timer, Waits

__all__ = ["ExactlyOncePublisher", "Sender"]

log = logging.getLogger("airflow_provider_liftbridge.client.exactly_once")

_OFFSET = operator.attrgetter("offset")
_PARTITION = operator.attrgetter("partition")


class ExactlyOncePublisher:
    """Publish records exactly once per producer id, resuming earlier attempts (see module doc).

    Sequence numbers continue across :meth:`publish` calls of one publisher (a task publishing
    several files numbers their rows as one sequence). The input must be the same, in the same
    order, on every attempt: a record is identified by its position only.

    To wrap a publisher the caller already has, use :meth:`wrapping`; this constructor opens the
    client's batch publisher with the options below unless ``publisher`` is given.

    :param client: the caller's client: metadata, cursors and scans go through it.
    :param stream: the stream (it must exist).
    :param producer_id: stable across retries, unique per data set; see :func:`.producer_id_for`.
    :param publisher: the publisher to wrap (see :class:`Sender`; it must not re-send); default:
        ``client.batch_publisher(...)`` with the options below and ``resend=NO_RESEND``.
    :param options: how the batch publisher it opens sends (:class:`~..publishing.options.PublishOptions`;
        its re-send policy is always ``NO_RESEND``). ``partition``, else ``partitioner``, else 0
        is the partition of records naming none; a partitioner that is not deterministic (round
        robin) is fine: skipping does not depend on where an earlier attempt put a record. The
        ack policy defaults to ``LEADER`` (use ``ALL`` on a replicated cluster: a record
        acknowledged by the leader alone can be lost when the leader fails); the timeout (default
        10 s) also bounds how long a partition that other producers keep writing to is watched
        before it counts as settled.
    :param batch: input records read and sent per batch (fewer are sent when some are in the stream
        already); every ack of a batch is in before the next batch is read.
    :param max_resumes: how many times in a row a batch may fail and be resumed before giving up.
    :param backoff: first wait after a failed send, seconds (doubled per failure, at most 5 s).
    :param settle: how long a partition's newest offset must stay unchanged after a failed send
        before it is scanned, seconds; also the interval between readings while waiting.
    :param tail_wait: how long a resumption waits for an uncommitted tail to be committed or
        truncated, or for a broker holding records of unknown fate to answer again, before it
        gives up (:class:`UncommittedTailError`, :class:`SilentBrokerError`), seconds. Keep it
        above Liftbridge's ``replica.max.lag.time`` and ``replica.max.leader.timeout`` (15 s).
    :param quiet: how long no record of this producer may arrive from elsewhere before a
        partition counts as settled, seconds; a try resuming an earlier one watches this long.
    :param zombie_wait: how long to wait for another writer of this producer id (a zombie try)
        to stop before failing with :class:`ConcurrentProducerError`, seconds (the operators pass
        the task's ``execution_timeout`` when it has one).
    :param defer_check: leave the read between this publisher's acknowledged records (ADR 8 rule 5)
        to the caller, who gathers :meth:`unread` of every publisher writing beside this one and
        hands them to :func:`.between.check_unread` (the tasks of a Spark job); a call then does not
        report success on its own.
    :raises InvalidArgumentError: an empty or overlong producer id, ack policy ``NONE``, a
        non-positive batch, window, timeout or wait, an unknown compression, or a publisher that
        re-sends.
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        producer_id: str,
        *,
        publisher: Sender | None = None,
        options: PublishOptions | None = None,
        batch: int = DEFAULT_BATCH,
        max_resumes: int = 8,
        backoff: float = 0.2,
        settle: float = 0.2,
        tail_wait: float = 30.0,
        quiet: float = 1.0,
        zombie_wait: float = 600.0,
        defer_check: bool = False,
    ) -> None:
        if not stream:
            raise InvalidArgumentError("stream must be a non-empty stream name")
        self.producer_id = check_producer_id(producer_id)
        options = (options or PublishOptions()).replace(resend=NO_RESEND)
        options = options.resolved(options.policy, options.wait)
        if options.policy is AckPolicy.NONE:
            raise InvalidArgumentError(
                "exactly-once publishing needs acknowledgements; use ack policy LEADER or ALL, not NONE"
            )
        positive = (("batch", batch), ("tail_wait", tail_wait), ("zombie_wait", zombie_wait))
        for name, value in positive:
            if value <= 0:
                raise InvalidArgumentError(f"{name} must be positive, got {value!r}")
        if max_resumes < 0 or quiet < 0:
            raise InvalidArgumentError(f"max_resumes and quiet must not be negative, got {max_resumes}, {quiet}")
        if isinstance(publisher, BatchPublisher) and publisher.options.resend is not NO_RESEND:
            raise InvalidArgumentError(
                "exactly-once publishing needs a publisher that never re-sends: open it with resend=NO_RESEND "
                "(a re-sent record whose first copy was stored would be stored twice)"
            )
        self.client = client
        self.stream = stream
        #: How records are sent: the ack policy and timeout filled in, never re-sent blindly.
        self.options = options
        self.batch = batch
        #: The clock of every wait (a scripted test swaps in a virtual one).
        self.timer = Timer()
        self.state = ProducerState(self.producer_id, keep_acked=defer_check)
        self.defer_check = defer_check
        waits = Waits(settle, options.wait, float(tail_wait), float(quiet), float(zombie_wait))
        acks_all = options.policy is AckPolicy.ALL
        self.reader = TailReader(client, stream, self.state, waits, self.timer, acks_all=acks_all)
        self.resumption = Resumption(
            self.producer_id,
            stream,
            max_resumes=max_resumes,
            backoff=backoff,
            timer=self.timer,
            missing_for_sure=self._missing_for_sure,
        )
        self._sender = publisher
        self._own_sender = publisher is None
        self._cursor_id = producer_cursor_id(self.producer_id)
        #: The producer's header entry, encoded once: every record carries it (see _prepare).
        self._producer_field = header_field(PRODUCER_HEADER, self.state.producer)
        self._partition_count = 0
        self._subject = ""
        self._info: StreamInfo | None = None  # the stream's metadata as the last resume read it
        # Partitions the last resume found without a cursor: the first send there stores the scan
        # start without asking again (cleared after each publish call, so the answer is fresh).
        self._no_cursor: set[int] = set()
        self._next_seq = 0
        self._resumed = False
        #: Totals over every :meth:`publish` call.
        self.total = ExactlyOnceResult(stream, self.producer_id)

    @classmethod
    def wrapping(
        cls, client: LiftbridgeClient, publisher: BatchPublisher, producer_id: str, **bounds: Any
    ) -> ExactlyOncePublisher:
        """An exactly-once publisher around ``publisher``, the caller's batch publisher of
        ``client`` (opened with ``resend=NO_RESEND``): its stream and options are used, with the
        path it took. ``bounds`` are the waits and bounds of the constructor (``batch``,
        ``max_resumes``, ``tail_wait``, ``zombie_wait``, ...).

        :raises InvalidArgumentError: as the constructor.
        :raises NoSuchStreamError: the publisher's NATS path was chosen and the stream does not exist.
        """
        options = publisher.options.replace(path=publisher.path)
        return cls(client, publisher.stream, producer_id, publisher=publisher, options=options, **bounds)

    # -- what the state knows ---------------------------------------------------------------
    @property
    def found(self) -> dict[int, PartitionRange]:
        """Offsets of this producer's records found in the stream by scans (earlier attempts)."""
        return self.state.found

    @property
    def duplicates_seen(self) -> int:
        """Own sequence numbers seen more than once by scans."""
        return self.state.duplicates_seen

    # -- public -----------------------------------------------------------------------------
    def publish(self, records: Iterable[Record | bytes]) -> ExactlyOnceResult:
        """Publish ``records`` (the next sequence numbers of this producer), skipping those an
        earlier attempt already put in the stream. Reads the input lazily, ``batch`` at a time.

        :returns: written / skipped counts and the offsets written by this call.
        :raises ExactlyOncePublishError: a batch could not be completed after ``max_resumes``
            resumptions, or failed in a way a resumption cannot fix (read-only partition, message
            too large, ...); ``.result`` says what was done; ``__cause__`` is the last error.
            :class:`ConcurrentProducerError`: another writer of this producer id is at work.
        :raises NoSuchStreamError: the stream does not exist.
        :raises InvalidArgumentError: a record is neither ``Record`` nor bytes, or a partitioner
            returned a partition out of range.
        """
        result = ExactlyOnceResult(self.stream, self.producer_id)
        read = 0
        try:
            if not self._resumed:
                self.resumption.run(result, self._resume, "reading the stream to resume")
            arrivals, changes = self.reader.arrivals, self.reader.leader_changes
            for chunk in chunks(records, self.batch):
                read += len(chunk)
                batch = self._batch_of(chunk, result)
                if batch:
                    self._send_and_record(batch, result)
            self.resumption.run(result, lambda: self._verify(self.reader.arrivals > arrivals), "checking the writes")
            if self.reader.leader_changes > changes and self.state.parts:  # a history may have been replaced
                step = lambda: recount(self.reader, sorted(self.state.parts))  # noqa: E731
                self.resumption.run(result, step, "reading its records again after a leader change")
            if result.count != read:
                # The contract at this level: every input record written now or found written.
                raise ExactlyOncePublishError(
                    f"exactly-once publishing to stream {self.stream!r} read {read} record(s) but accounts for "
                    f"{result.count} (written {result.written}, skipped {result.skipped}); this is a bug of "
                    "airflow-provider-liftbridge, please report it. Publishing again with the same producer id "
                    "resumes without duplicates.",
                    result,
                )
        finally:
            self._no_cursor.clear()
            self._info = None
            self.total.add(result)
            if self._own_sender:
                self.close()
        return result

    def unread(self) -> Unread:
        """What this publisher left unread between its acknowledged records, and the offsets it
        was acknowledged for (with ``defer_check``: the caller's :func:`.between.check_unread`)."""
        return unread_of(self.state)

    def close(self) -> None:
        """Close the sender's connections if this publisher opened it (a later :meth:`publish`
        opens new ones); a wrapped publisher is the caller's to close."""
        if self._sender is not None and self._own_sender:
            self._sender.close()
            self._sender = None

    def __enter__(self) -> ExactlyOncePublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- resuming ---------------------------------------------------------------------------
    def _resume(self) -> None:
        """Learn the partitions, then read every partition this producer has written to (once
        its uncommitted tail, if any, has settled and no zombie try is writing to it)."""
        metadata = self.client.fetch_metadata([self.stream])
        info = metadata.streams.get(self.stream)
        if info is None:
            raise NoSuchStreamError(f"stream {self.stream!r} does not exist; create it first or check the name.")
        self.reader.addresses = {b.id: (b.host, b.port) for b in metadata.brokers}
        self._subject = info.subject
        self._info = info
        self._partition_count = max(1, len(info.partitions))
        parts = self.state.parts
        for p in sorted(info.partitions) or [0]:
            if p not in parts:  # a resume cut short by a failure keeps what it learned
                start = self.client.fetch_cursor(self._cursor_id, self.stream, p)
                if start < 0:
                    self._no_cursor.add(p)
                    continue
                leader = info.partitions[p].leader if p in info.partitions else ""
                parts[p] = PartitionState(scan_start=start, scanned_to=start - 1, next_offset=start, leader=leader)
        if parts:
            suspects = suspects_at_start(info.partitions, parts)
            self.reader.settle(
                sorted(parts), history=True, observe=self.reader.waits.quiet, suspects=suspects, unreachable_ok=True
            )
        self._resumed = True
        seen = self.state.seen
        if len(seen):
            log.info(
                "Producer %r resumes on stream %r: %d record(s) already in the stream (sequence runs %s)",
                self.producer_id,
                self.stream,
                len(seen),
                seen.runs()[:5],
            )

    def _ensure_cursor(self, partition: int) -> PartitionState:
        """The partition's state; stores the scan start first if this producer never wrote there."""
        state = self.state.parts.get(partition)
        if state is not None:
            return state
        if partition in self._no_cursor:  # this call's resume just found none
            self._no_cursor.discard(partition)
            start = -1
        else:
            start = self.client.fetch_cursor(self._cursor_id, self.stream, partition)
        if start >= 0:  # another attempt (or a call racing this one) stored it: read from there
            self.state.parts[partition] = PartitionState(scan_start=start, scanned_to=start - 1, next_offset=start)
            self.reader.settle([partition], history=True)
            return self.state.parts[partition]
        info = self.client.fetch_partition_metadata(self.stream, partition)
        start = info.high_watermark + 1
        # Retried by the client and resumed here when its commit is late; a write given up on may
        # still commit later. Safe: every value written is a high watermark + 1 read before any
        # record of ours went here, so whichever lands last, the scan starts at or before ours.
        self.client.set_cursor(self._cursor_id, self.stream, partition, start)
        # Nothing of ours can be there yet; an uncommitted tail is someone else's. The expected
        # offset still stops at what was seen (a foreign tail makes OCC refuse, then we wait).
        state = PartitionState(scan_start=start, scanned_to=info.high_watermark, next_offset=start, leader=info.leader)
        self.state.parts[partition] = state
        return state

    def _verify(self, others_seen: bool) -> None:
        """Read what lies between this call's acknowledged records and was not read yet (another
        writer's records landed there); after records of this producer came from elsewhere during
        the call, or turned up in that read, also watch for ``quiet`` seconds whether more arrive.

        The read waits only until those records are committed, not for the partition to stand
        still (with other producers beside this one, e.g. one Spark job's tasks, that meant
        waiting for them to pause at every call).

        :raises ProducerStillWriting: a sequence number of this producer is stored twice.
        """
        parts = self.state.parts
        if not others_seen:
            if self.defer_check:
                return  # the caller reads the gaps no sibling was acknowledged for (unread)
            gaps = [p for p, state in sorted(parts.items()) if state.unread_own >= 0]
            if not gaps or not self.reader.read_between_own(gaps):
                return
        if parts:
            self.reader.settle(sorted(parts), observe=self.reader.waits.quiet)

    # -- publishing -------------------------------------------------------------------------
    def _batch_of(self, chunk: Sequence[Any], result: ExactlyOnceResult) -> Batch:
        """The records of ``chunk`` (the next sequence numbers) that are not in the stream yet,
        each with its partition and headers; those that are count as skipped."""
        first = self._next_seq
        self._next_seq += len(chunk)
        seen = self.state.seen
        if chunk.__class__ is RecordColumns and first > seen.top() and not any(chunk.header_wires):
            # Columns with their partitions and no headers of their own (Spark), none seen: kept as columns.
            seqs = range(first, first + len(chunk))
            parts = chunk.partitions
            low, high = min(parts), max(parts)
            if low < 0 or high >= self._partition_count:
                bad = low if low < 0 else high
                self._checked_partition(bad, first + list(parts).index(bad))
            return Batch(
                seqs, RecordColumns(chunk.values, parts, SeqWires(self._producer_field, seqs), keys=chunk.keys)
            )
        if first > seen.top() and self.options.partitioner is None and set(map(type, chunk)) == {bytes}:
            # The bulk case, values only and none seen: columns made at C speed, headers later.
            seqs = range(first, first + len(chunk))
            partition = self._checked_partition(self.options.partition or 0, first)
            return Batch(seqs, RecordColumns(chunk, [partition] * len(chunk), SeqWires(self._producer_field, seqs)))
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
        return Batch(kept, RecordColumns(values, partitions, wires, keys=keys if has_keys else None))

    def _prepare(self, item: Record | bytes, seq: int) -> tuple[bytes, bytes | None, int, bytes]:
        """Record ``seq``'s value, key, partition and encoded headers.

        :raises InvalidArgumentError: not a record or bytes, or a partition out of range.
        """
        key: bytes | None
        own: Mapping[str, bytes] | None
        if isinstance(item, (bytes, bytearray, memoryview)):
            value, key, own, partition = bytes(item), None, None, self.options.partition
        elif isinstance(item, Record):
            value, key, own = item.value, item.key, item.headers
            partition = item.partition if item.partition is not None else self.options.partition
        else:
            raise InvalidArgumentError(f"record {seq} is a {type(item).__name__}; pass Record objects or bytes")
        if partition is None:
            partition = (
                0
                if self.options.partitioner is None
                else self.options.partitioner(self.stream, key, value, self._partition_count)
            )
        wire = record_wire(self._producer_field, self.state.producer, seq, own)
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
            self._sender = self.client.batch_publisher(self.stream, self.options, stream_info=self._info)
        return self._sender

    def _sender_path(self) -> str:
        sender = self._get_sender()
        return sender.path if isinstance(sender, BatchPublisher) else "grpc"

    def _send_and_record(self, batch: Batch, result: ExactlyOnceResult) -> None:
        """Send ``batch`` through the sender and record in ``result`` and the producer's state
        what it wrote, resuming after a failure as the resumption allows."""
        pending = batch
        recover = False
        suspects: dict[int, set[str]] = {}

        def attempt() -> bool:
            nonlocal pending, recover, suspects
            if recover:
                pending = self._recover(pending, result, suspects)
                recover, suspects = False, {}
            targets = sorted(set(pending.records.partitions))
            for partition in targets:
                self._ensure_cursor(partition)
            # Ensuring a cursor may have read records another attempt wrote meanwhile: skip those.
            if pending and self.state.seen.top() >= pending.seqs[0]:
                kept = pending.without(self.state.seen)
                result.skipped += len(pending) - len(kept)
                pending = kept
            if not pending:
                return True
            outgoing = self._with_offsets(pending, targets)
            sender = self._get_sender()
            leaders = {p: self.state.parts[p].leader for p in targets}
            try:
                # The publish contract again, for any Sender: one ack per record, or raise (a
                # short list would mark the wrong records as written).
                where = f"stream {self.stream!r}"
                acks = accounted(sender.send(outgoing), len(outgoing), expects_acks=True, where=where)
            except PublishError as exc:
                pending = self._account_partial(pending, exc.acks, result, partial=True)
                recover, error = True, unwrap(exc)
                suspects = suspects_after(error, self._sender_path(), targets, leaders)
                raise error from exc
            except LiftbridgeError as exc:
                recover = True
                suspects = suspects_after(exc, self._sender_path(), targets, leaders)
                raise
            self._account_partial(pending, acks, result, partial=False)
            return True

        self.resumption.run(result, attempt, f"publishing records {batch.seqs[0]}..{batch.seqs[-1]}")

    def _with_offsets(self, pending: Batch, targets: Sequence[int]) -> RecordColumns:
        """The records to send, each with the offset it must get (checked on streams with OCC);
        ``targets`` holds every partition of ``pending``."""
        parts, partitions = self.state.parts, pending.records.partitions
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
        self, pending: Batch, acks: Sequence[Ack | None], result: ExactlyOnceResult, *, partial: bool
    ) -> Batch:
        """Count the acknowledged records as written; return those without an ack."""
        seqs = pending.seqs
        if not partial and len(acks) == len(seqs) and seqs:
            first, last = seqs[0], seqs[-1]
            if last - first == len(seqs) - 1 and first > self.state.seen.top():
                self._account_run(first, last, acks, result)  # the usual case, in bulk
                return Batch()
        left: list[int] = []
        seen, parts = self.state.seen, self.state.parts
        # Checked before counting (counting moves what was seen), raised after: every ack counts.
        got = sorted(((a.partition, a.offset) for a in acks if a is not None), reverse=True)
        shorter = self.reader.check_acks(dict(got))  # offsets fall: each partition's lowest stays
        for k, ack in enumerate(list(acks) + [None] * (len(seqs) - len(acks))):
            if ack is None:
                left.append(k)
                continue
            seen.add(seqs[k])
            result.written += 1
            note(result.partitions, ack.partition, ack.offset)
            parts[ack.partition].acked(ack.offset)
            self.state.note_acked(ack.partition, ack.offset, ack.offset, (ack.offset,))
        if shorter is not None:
            raise shorter
        return pending.take(left)

    def _account_run(self, first: int, last: int, acks: Sequence[Ack | None], result: ExactlyOnceResult) -> None:
        """:meth:`_account_partial` of a whole batch of consecutive sequence numbers, all acknowledged."""
        self.state.seen.add_run_above(first, last)
        result.written += last - first + 1
        offsets = list(map(_OFFSET, acks))
        partitions = list(map(_PARTITION, acks))
        by_partition: dict[int, list[int]] = {}
        if partitions.count(partitions[0]) == len(partitions):  # one partition (C-speed checks)
            by_partition[partitions[0]] = offsets
        else:
            for partition, offset in zip(partitions, offsets, strict=True):
                by_partition.setdefault(partition, []).append(offset)
        shorter = self.reader.check_acks({partition: min(got) for partition, got in by_partition.items()})
        for partition, got in by_partition.items():
            low, high = min(got), max(got)
            merge(result.partitions, partition, PartitionRange(low, high, len(got)))
            self.state.note_acked(partition, low, high, got)
            state = self.state.parts[partition]
            if not state.acked_run(low, high, len(got)):  # other writers' records lie between ours
                for offset in got:
                    state.acked(offset)
        if shorter is not None:
            raise shorter  # after counting every ack, as in _account_partial

    def _recover(self, pending: Batch, result: ExactlyOnceResult, suspects: dict[int, set[str]]) -> Batch:
        """After a failed send: let the partitions settle, read what was added, drop what landed."""
        delivered = self._reset_sender()
        partitions = sorted({p for p in pending.records.partitions if p in self.state.parts})
        # Records on their way when the connection was reset may still land: watch for them.
        observe = 0.0 if delivered else self.reader.waits.quiet
        found = self.reader.settle(partitions, set(pending.seqs), suspects=suspects, observe=observe)
        if self.reader.leader_moved:
            # Batches go to the leader the client's metadata cache names: have it name the new
            # one, not a former leader that may be stopped (and would hold what it is sent).
            self.reader.leader_moved = False
            self.client.fetch_metadata([self.stream])
        for p, seqs in found.items():
            for offset in seqs.values():
                # Written by this attempt, ack lost: it is in the stream, so it counts as written.
                result.written += 1
                note(result.partitions, p, offset)
        return pending.without(self.state.seen)  # the scan added what it found

    def _reset_sender(self) -> bool:
        """Drop the sender's connections after a failed send; whether everything it sent is known
        to have reached the server. A batch publisher's NATS connection is flushed for up to
        ``tail_wait`` seconds first (the PONG proves every publish before it handled), and reset
        if that does not come back (see ``BatchPublisher.reset``)."""
        sender = self._sender
        if sender is None:
            return True
        if isinstance(sender, BatchPublisher):
            return sender.reset(flush_within=self.reader.waits.tail_wait)
        return sender.reset() is True

    def _missing_for_sure(self) -> bool:
        """After a "no such stream / partition": believe it, unless this publisher has seen the
        stream and the cluster may still be loading after a restart (see :mod:`..presence`)."""
        if not self._subject:  # never seen: a wrong name or a stream not created yet
            return True
        try:
            return missing_confirmed(self.client.fetch_metadata(), self.stream)
        except LiftbridgeError:  # no answer: the cluster is not back yet
            return False
