"""One partition and its stream: the log, the flags, leadership, commit callbacks and waiting
subscribers (see :mod:`.state` for how the store flushes them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from airflow_provider_liftbridge._proto import api_pb2

from .clock import RECEPTION_SHIFTS, clock_shift_ns
from .errors import ExpectedOffsetRefused
from .group_subscribers import GroupSubscribers
from .log import LogClosedError, PartitionLog
from .model import REFUSED, BrokerLink, BrokerSlot, CommitCallback, NewMessage, StreamConfig, partition_subject
from .wire import TimestampField, header_entries, header_entry, length_delimited, message_body, varint

log = logging.getLogger(__name__)


class Partition:
    """One partition: its log, its flags and its leadership, plus commit callbacks and waiting subscribers."""

    def __init__(self, store: PartitionStore, stream: Stream, pid: int, log_: PartitionLog) -> None:
        self.store = store
        self.stream = stream
        self.id = pid
        self.subject = partition_subject(stream.subject, pid)
        self.log = log_
        self.paused = False
        #: Metadata (FetchMetadata and FetchPartitionMetadata) keeps showing ``paused`` after a publish
        #: resumed the partition, as the real server does; ``paused`` is whether it is paused now.
        self.paused_in_metadata = False
        self.readonly = False
        self.deleted = False
        self.leader = ""
        self.replicas: list[str] = []
        self.isr: list[str] = []
        self.pause_timestamps = (0, 0)
        self.readonly_timestamps = (0, 0)
        #: The replicas, ISR and high watermark in cluster mode; ``None`` on a single broker, where
        #: the one log is committed as soon as it is written.
        self.replication: PartitionReplication | None = None
        self._last_ts = log_.latest_timestamp
        self._callbacks: list[tuple[CommitCallback, Any]] = []
        self._waiters: list[asyncio.Future[None]] = []
        #: Each consumer group's one subscriber on this partition (Liftbridge's fencing on Subscribe).
        self.group_subscribers = GroupSubscribers()
        # The parts of a stored Message that are the same for every message of this partition: fields
        # 5 to 7 and the server's headers for a message that came on the partition's own subject
        # without a reply (the usual case).
        self._stream_fields = length_delimited(b"\x2a", stream.name.encode()) + (b"\x30" + varint(pid) if pid else b"")
        self._own_tail_parts = (
            self._stream_fields + length_delimited(b"\x3a", self.subject.encode()),
            header_entry("subject", self.subject.encode()) + header_entry("reply", b""),
        )
        self._own_tail = b"".join(self._own_tail_parts)
        self._ts_field = TimestampField()
        self._occ = stream.occ  # settings do not change after creation; read on every append
        #: Whether the store's next flush includes this partition (see :meth:`Store.mark_dirty`).
        self._flush_scheduled = False

    # -- writing --------------------------------------------------------------
    def append(
        self,
        key: bytes,
        value: bytes,
        headers: Mapping[str, bytes] | None,
        subject: str,
        reply: str,
        expected_offset: int,
        timestamp: int,
    ) -> int:
        """Buffer one message and return its offset; server headers ``subject`` and ``reply`` are added.

        :raises ExpectedOffsetRefused: optimistic concurrency control is on and ``expected_offset``
            (-1 turns the check off) is not the offset the message would get.
        """
        (offset,) = self.append_many(((key, value, headers, subject, reply, expected_offset),), timestamp)
        if offset == REFUSED:
            raise ExpectedOffsetRefused(f"expected offset {expected_offset}, next offset is {self.log.next_offset}")
        return offset

    def append_many(self, messages: Iterable[NewMessage], timestamp: int) -> list[int]:
        """Buffer messages received together at ``timestamp`` (ns); return the offset of each, in order.

        A message whose expected offset does not match on a stream with optimistic concurrency
        control (-1 turns the check off) is not stored; its entry is :data:`REFUSED`.
        """
        log_ = self.log
        offset = first = log_.next_offset
        if RECEPTION_SHIFTS:  # a test moved this stream's reception clock (devserver/clock.py)
            timestamp += clock_shift_ns(self.stream.name)
        # Reception timestamps never go backwards, so timestamp lookups can bisect.
        if timestamp < self._last_ts:
            timestamp = self._last_ts
        self._last_ts = timestamp
        # The Message protobuf is written by hand (wire.message_body): the bytes are what
        # ``Message(...).SerializeToString()`` gives, at a fraction of the cost
        # (tests/devserver/test_state_body.py holds the two equal).
        ts_field = self._ts_field(timestamp)
        occ, own_subject, own_tail, body = self._occ, self.subject, self._own_tail, message_body
        bodies: list[bytes] = []
        offsets: list[int] = []
        for key, value, headers, subject, reply, expected in messages:
            if occ and expected != -1 and expected != offset:
                offsets.append(REFUSED)
                continue
            bodies.append(
                body(
                    offset,
                    key,
                    value,
                    ts_field,
                    own_tail
                    if subject == own_subject and not reply and not headers
                    else self._tail(headers, subject, reply),
                )
            )
            offsets.append(offset)
            offset += 1
        if bodies:
            log_.extend(first, bodies, timestamp)
            if not self._flush_scheduled:
                self.store.mark_dirty(self)
        return offsets

    def _tail(self, headers: Mapping[str, bytes] | None, subject: str, reply: str) -> bytes:
        """Fields 5-9 of a stored Message: stream, partition, subject, reply and the headers, the
        server's own ``subject`` and ``reply`` replacing any the publisher sent."""
        if subject == self.subject and not reply:
            # A message with headers on the partition's own subject (exactly-once records): only
            # its own entries are encoded, the rest comes from the own-subject tail.
            own_head, own_server_headers = self._own_tail_parts
            return own_head + header_entries(headers) + own_server_headers if headers else own_head + own_server_headers
        parts = [self._stream_fields, length_delimited(b"\x3a", subject.encode())]
        if reply:
            parts.append(length_delimited(b"\x42", reply.encode()))
        if headers:
            parts.append(header_entries(headers))
        parts += (header_entry("subject", subject.encode()), header_entry("reply", reply.encode()))
        return b"".join(parts)

    def after_commit(self, callback: CommitCallback, arg: Any) -> None:
        """Call ``callback(arg, commit_timestamp_ns)`` once everything appended so far is written."""
        self._callbacks.append((callback, arg))
        self.store.mark_dirty(self)

    def _commit(self, now_ns: int) -> None:
        self._flush_scheduled = False
        try:
            self.log.flush()
        except LogClosedError as exc:
            # Its broker stopped (or the cluster restarted) after the write was accepted: as on a
            # killed broker the write is lost and never acknowledged; its callers time out (a
            # SetCursor after Liftbridge's 5 s, with INTERNAL "context deadline exceeded").
            log.warning("partition %s/%d: %s; their publishes get no ack", self.stream.name, self.id, exc)
            self._callbacks.clear()
            if self.store.listener is not None:
                self.store.listener.commit_failed(self)
            return
        except OSError:
            log.exception(
                "writing partition %s/%d failed; its unacked publishes will time out", self.stream.name, self.id
            )
            self._callbacks.clear()
            if self.store.listener is not None:
                self.store.listener.commit_failed(self)
            return
        callbacks = self._callbacks
        if callbacks:
            self._callbacks = []
            for fn, arg in callbacks:
                try:
                    fn(arg, now_ns)
                except Exception:  # one broken consumer of acks must not stop the others
                    log.exception("commit callback failed")
        self.notify()
        if self.replication is not None:
            self.replication.leader_wrote()

    @property
    def hw(self) -> int:
        """The high watermark: the last committed offset (-1 when none)."""
        repl = self.replication
        return self.log.newest_offset if repl is None else repl.reported_hw()

    # -- subscribers ----------------------------------------------------------
    def wait_change(self) -> asyncio.Future[None]:
        """A future resolved at the next commit or state change (pause, delete, read-only, leader move)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def notify(self) -> None:
        waiters = self._waiters
        if waiters:
            self._waiters = []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    # -- metadata -------------------------------------------------------------
    def metadata(self) -> api_pb2.PartitionMetadata:
        """The partition's ``PartitionMetadata``, for FetchMetadata and FetchPartitionMetadata alike.

        ``paused`` is the sticky flag: it stays true after a publish resumed the partition, in both
        calls, as on the real server (``liftbridge-semantics.md``, "Pause").
        """
        log_ = self.log
        newest = log_.newest_offset
        return api_pb2.PartitionMetadata(
            id=self.id,
            leader=self.leader,
            replicas=self.replicas,
            isr=self.isr,
            highWatermark=newest if self.replication is None else self.replication.reported_hw(),
            newestOffset=newest,
            paused=self.paused_in_metadata,
            readonly=self.readonly,
            messagesReceivedTimestamps=api_pb2.PartitionEventTimestamps(
                firstTimestamp=log_.first_timestamp, latestTimestamp=log_.latest_timestamp
            ),
            pauseTimestamps=api_pb2.PartitionEventTimestamps(
                firstTimestamp=self.pause_timestamps[0], latestTimestamp=self.pause_timestamps[1]
            ),
            readonlyTimestamps=api_pb2.PartitionEventTimestamps(
                firstTimestamp=self.readonly_timestamps[0], latestTimestamp=self.readonly_timestamps[1]
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **(self.replication.to_json() if self.replication is not None else {}),
            "paused": self.paused,
            "paused_in_metadata": self.paused_in_metadata,
            "readonly": self.readonly,
            "leader": self.leader,
            "replicas": self.replicas,
            "isr": self.isr,
            "pause_timestamps": list(self.pause_timestamps),
            "readonly_timestamps": list(self.readonly_timestamps),
        }

    def load_json(self, data: Mapping[str, Any]) -> None:
        self.paused = bool(data.get("paused", False))
        self.paused_in_metadata = bool(data.get("paused_in_metadata", self.paused))
        self.readonly = bool(data.get("readonly", False))
        self.leader = str(data.get("leader", ""))
        self.replicas = [str(r) for r in data.get("replicas", [])]
        self.isr = [str(r) for r in data.get("isr", [])]
        pt, rt = data.get("pause_timestamps", (0, 0)), data.get("readonly_timestamps", (0, 0))
        self.pause_timestamps = (int(pt[0]), int(pt[1]))
        self.readonly_timestamps = (int(rt[0]), int(rt[1]))


@dataclass
class Stream:
    """A stream: name, subject, optional NATS queue group, its settings and partitions."""

    name: str
    subject: str
    group: str
    replication_factor: int
    creation_timestamp: int
    directory: str
    config: StreamConfig
    resume_all: bool = False
    partitions: list[Partition] = field(default_factory=list)
    #: ``time.monotonic()`` of the next run of its cleaner (0: not scheduled yet; ``Store.run_cleaners``).
    next_clean: float = 0.0

    @property
    def occ(self) -> bool:
        return self.config.optimistic_concurrency_control

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subject": self.subject,
            "group": self.group,
            "replication_factor": self.replication_factor,
            "creation_timestamp": self.creation_timestamp,
            "directory": self.directory,
            "config": asdict(self.config),
            "resume_all": self.resume_all,
            "partitions": [p.to_json() for p in self.partitions],
        }


class PartitionListener(Protocol):
    """Told when a partition starts or stops taking NATS messages, and when writing it failed
    (the NATS ingest implements it)."""

    async def partition_opened(self, partition: Partition) -> None: ...

    async def partition_closed(self, partition: Partition) -> None: ...

    def commit_failed(self, partition: Partition) -> None: ...


class PartitionStore(Protocol):
    """What a partition asks of the store that holds it (:class:`~.state.Store`)."""

    listener: PartitionListener | None

    def mark_dirty(self, partition: Partition) -> None: ...


class PartitionReplication(Protocol):
    """What the rest of the server asks of a partition's replicas in cluster mode.

    Implemented by :class:`~.replication.Replication`; declared here so that a partition and its
    replication do not import each other.
    """

    #: Work held for a stalled leader, run when it resumes.
    parked: list[Callable[[], None]]

    @property
    def leader_serving(self) -> bool: ...

    @property
    def leader_stalled(self) -> bool: ...

    @property
    def leader_broker(self) -> BrokerSlot | None: ...

    @property
    def leader_link(self) -> BrokerLink | None: ...

    @property
    def leader_live(self) -> bool: ...

    @property
    def no_leaders(self) -> bool: ...

    def reported_hw(self) -> int: ...

    def readable(self, broker_id: str) -> tuple[PartitionLog, int] | None: ...

    def after_hw(self, offset: int, callback: CommitCallback, arg: Any) -> None: ...

    def leader_wrote(self) -> None: ...

    def start_followers(self) -> None: ...

    def replica_logs(self) -> list[PartitionLog]: ...

    def close(self) -> None: ...

    def destroy(self) -> None: ...

    def to_json(self) -> dict[str, Any]: ...
