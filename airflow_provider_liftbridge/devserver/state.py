"""Streams, partitions, brokers and cursors: the dev server's state, and how it is made durable.

Everything runs on one asyncio event loop, so nothing here takes a lock. Records
are appended to a partition's log in memory and written in batches: every
append marks its partition dirty and schedules one flush for the end of the
current loop iteration; after the write, the partition's commit callbacks run
(acks, PublishAsync responses) and waiting subscribers wake up. An ack is
therefore never sent before its record is in the file.

Metadata (streams, partitions, leaders, paused and read-only flags) lives in
``meta.json``, rewritten atomically on every change; cursors live in their own
log (``cursors/``), compacted when it is opened.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .errors import ApiError, DataDirError, IncorrectOffsetError
from .log import DEFAULT_SEGMENT_BYTES, PartitionLog
from .wire import TimestampField, header_entries, header_entry, length_delimited, message_body, varint

if TYPE_CHECKING:
    from .replication import ClusterTimings, Replication

log = logging.getLogger(__name__)

RESERVED_STREAMS = frozenset({"__cursors", "__activity"})
META_FILE = "meta.json"
_META_VERSION = 1
_CURSOR_COMPACT_MIN = 10_000

#: Async error codes of PublishAsync (``PublishAsyncError.Code``).
ASYNC_NOT_FOUND = api_pb2.PublishAsyncError.NOT_FOUND
ASYNC_BAD_REQUEST = api_pb2.PublishAsyncError.BAD_REQUEST
ASYNC_READONLY = api_pb2.PublishAsyncError.READONLY
ASYNC_INCORRECT_OFFSET = api_pb2.PublishAsyncError.INCORRECT_OFFSET
ASYNC_INTERNAL = api_pb2.PublishAsyncError.INTERNAL


_SUBJECT_BAD_CHARS = re.compile(r"[\s]")


def is_valid_subject(subject: str) -> bool:
    """A NATS subject: no whitespace, no empty token (the real server's check)."""
    return bool(subject) and not _SUBJECT_BAD_CHARS.search(subject) and all(subject.split("."))


def partition_subject(subject: str, partition: int) -> str:
    """Subject of a partition: the stream subject for partition 0, ``subject.N`` otherwise."""
    return subject if partition == 0 else f"{subject}.{partition}"


@dataclass
class StreamConfig:
    """Per-stream settings from ``CreateStreamRequest`` (durations in milliseconds, as the Go client sends them)."""

    retention_max_bytes: int = 0
    retention_max_messages: int = 0
    retention_max_age_ms: int = 0
    cleaner_interval_ms: int = 0
    segment_max_bytes: int = 0
    segment_max_age_ms: int = 0
    compact_enabled: bool = False
    compact_max_goroutines: int = 0
    auto_pause_time_ms: int = 0
    auto_pause_disable_if_subscribers: bool = False
    min_isr: int = 0
    optimistic_concurrency_control: bool = False

    @classmethod
    def from_request(cls, req: api_pb2.CreateStreamRequest) -> StreamConfig:
        """Read the nullable fields of a create request (unset ones keep their defaults)."""
        cfg = cls()
        mapping = {
            "retentionMaxBytes": "retention_max_bytes",
            "retentionMaxMessages": "retention_max_messages",
            "retentionMaxAge": "retention_max_age_ms",
            "cleanerInterval": "cleaner_interval_ms",
            "segmentMaxBytes": "segment_max_bytes",
            "segmentMaxAge": "segment_max_age_ms",
            "compactEnabled": "compact_enabled",
            "compactMaxGoroutines": "compact_max_goroutines",
            "autoPauseTime": "auto_pause_time_ms",
            "autoPauseDisableIfSubscribers": "auto_pause_disable_if_subscribers",
            "minIsr": "min_isr",
            "optimisticConcurrencyControl": "optimistic_concurrency_control",
        }
        for proto_name, attr in mapping.items():
            if req.HasField(proto_name):
                setattr(cfg, attr, getattr(req, proto_name).value)
        return cfg


@dataclass
class BrokerSlot:
    """One broker of the (single-process) cluster."""

    index: int
    id: str
    host: str
    port: int
    live: bool = False
    #: Frozen like a SIGSTOPped process: no replication, calls to it wait (cluster fault hook).
    stalled: bool = False


CommitCallback = Callable[[Any, int], None]
#: One message for :meth:`Partition.append_many`: key, value, headers, subject, reply, expected offset.
NewMessage = tuple[bytes, bytes, Mapping[str, bytes] | None, str, str, int]
#: The offset :meth:`Partition.append_many` gives a message refused by optimistic concurrency control.
REFUSED = -1


class Partition:
    """One partition: its log, its flags and its leadership, plus commit callbacks and waiting subscribers."""

    def __init__(self, store: Store, stream: Stream, pid: int, log_: PartitionLog) -> None:
        self.store = store
        self.stream = stream
        self.id = pid
        self.subject = partition_subject(stream.subject, pid)
        self.log = log_
        self.paused = False
        #: FetchMetadata keeps showing ``paused`` after a publish resumed the partition, as the real server does.
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
        self.replication: Replication | None = None
        self._last_ts = log_.latest_timestamp
        self._callbacks: list[tuple[CommitCallback, Any]] = []
        self._waiters: list[asyncio.Future[None]] = []
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

        :raises IncorrectOffsetError: optimistic concurrency control is on and ``expected_offset``
            (-1 turns the check off) is not the offset the message would get.
        """
        (offset,) = self.append_many(((key, value, headers, subject, reply, expected_offset),), timestamp)
        if offset == REFUSED:
            raise IncorrectOffsetError(f"expected offset {expected_offset}, next offset is {self.log.next_offset}")
        return offset

    def append_many(self, messages: Iterable[NewMessage], timestamp: int) -> list[int]:
        """Buffer messages received together at ``timestamp`` (ns); return the offset of each, in order.

        A message whose expected offset does not match on a stream with optimistic concurrency
        control (-1 turns the check off) is not stored; its entry is :data:`REFUSED`.
        """
        log_ = self.log
        offset = first = log_.next_offset
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
        except OSError:
            log.exception(
                "writing partition %s/%d failed; its unacked publishes will time out", self.stream.name, self.id
            )
            self._callbacks.clear()
            if self.store.listener is not None:
                self.store.listener.commit_failed(self)
            return
        cfg = self.stream.config
        if cfg.retention_max_messages or cfg.retention_max_bytes:
            self.log.enforce_retention(max_messages=cfg.retention_max_messages, max_bytes=cfg.retention_max_bytes)
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
    def metadata(self, *, for_cluster_view: bool = False) -> api_pb2.PartitionMetadata:
        """The partition's ``PartitionMetadata`` (the cluster view shows the sticky ``paused`` flag)."""
        log_ = self.log
        newest = log_.newest_offset
        return api_pb2.PartitionMetadata(
            id=self.id,
            leader=self.leader,
            replicas=self.replicas,
            isr=self.isr,
            highWatermark=newest if self.replication is None else self.replication.reported_hw(),
            newestOffset=newest,
            paused=self.paused_in_metadata if for_cluster_view else self.paused,
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


class CursorStore:
    """Cursors keyed by (cursor id, stream, partition), kept in an append-only log of ``SetCursorRequest``s."""

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self._dir = directory
        self._fsync = fsync
        fresh = directory.with_name(directory.name + ".new")
        if not directory.exists() and fresh.exists():
            fresh.rename(directory)  # a compaction finished writing but not renaming
        shutil.rmtree(fresh, ignore_errors=True)
        self._log = PartitionLog(directory, fsync=fsync)
        self._cursors: dict[tuple[str, str, int], int] = {}
        for body in self._read_all(self._log):
            req = api_pb2.SetCursorRequest.FromString(body)
            self._cursors[(req.cursorId, req.stream, req.partition)] = req.offset
        records = self._log.newest_offset + 1 - self._log.oldest_offset
        if records > _CURSOR_COMPACT_MIN and records > 4 * len(self._cursors):
            self._compact(fresh)

    @staticmethod
    def _read_all(log_: PartitionLog) -> Iterable[bytes]:
        offset = log_.oldest_offset
        while offset <= log_.newest_offset:
            batch = log_.read(offset, 4096)
            yield from batch
            offset += len(batch)

    def _compact(self, fresh: Path) -> None:
        new_log = PartitionLog(fresh, fsync=True)
        now = time.time_ns()
        for (cid, stream, part), offset in self._cursors.items():
            req = api_pb2.SetCursorRequest(cursorId=cid, stream=stream, partition=part, offset=offset)
            new_log.append(req.SerializeToString(), now)
        new_log.flush()
        new_log.close()
        self._log.close()
        old = self._dir.with_name(self._dir.name + ".old")
        self._dir.rename(old)
        fresh.rename(self._dir)
        shutil.rmtree(old, ignore_errors=True)
        self._log = PartitionLog(self._dir, fsync=self._fsync)

    def set(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        """Record a cursor durably (written before this returns)."""
        req = api_pb2.SetCursorRequest(cursorId=cursor_id, stream=stream, partition=partition, offset=offset)
        self._log.append(req.SerializeToString(), time.time_ns())
        self._log.flush()
        self._cursors[(cursor_id, stream, partition)] = offset

    def get(self, cursor_id: str, stream: str, partition: int) -> int:
        """The cursor's offset, -1 when it was never set."""
        return self._cursors.get((cursor_id, stream, partition), -1)

    def close(self) -> None:
        self._log.close()


class Store:
    """All streams of the server, the broker list, cursors and the batched flushing of logs.

    :param data_dir: where ``meta.json``, ``cursors/`` and ``streams/`` live (created if missing).
    :param brokers: the cluster's brokers; partition leaders are chosen among them.
    :param fsync: ``fsync`` log writes (default: written to the OS page cache only).
    :param timings: cluster-mode time-outs (more than one broker; default: Liftbridge's).
    :raises DataDirError: the directory is unusable or its metadata unreadable.
    """

    def __init__(
        self, data_dir: Path, brokers: list[BrokerSlot], *, fsync: bool = False, timings: ClusterTimings | None = None
    ) -> None:
        from .replication import Cluster, ClusterTimings

        self.data_dir = data_dir
        self.brokers = brokers
        self.fsync = fsync
        #: Replication, faults and the restart window; ``None`` on a single broker (none of it costs anything there).
        self.cluster: Cluster | None = Cluster(self, timings or ClusterTimings()) if len(brokers) > 1 else None
        self.streams: dict[str, Stream] = {}
        self.listener: PartitionListener | None = None
        self._dirty: dict[Partition, None] = {}
        self._flush_handle: asyncio.Handle | None = None
        try:
            (data_dir / "streams").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DataDirError(
                f"cannot create the data directory {data_dir}: {exc}; pass a writable --data-dir"
            ) from exc
        self.cursors = CursorStore(data_dir / "cursors", fsync=fsync)
        self._load()

    # -- persistence ----------------------------------------------------------
    def _load(self) -> None:
        path = self.data_dir / META_FILE
        known_dirs: set[str] = set()
        if path.exists():
            try:
                meta = json.loads(path.read_text())
                if meta.get("version") != _META_VERSION:
                    raise ValueError(f"unsupported metadata version {meta.get('version')!r}")
                for data in meta["streams"]:
                    stream = self._make_stream(
                        name=data["name"],
                        subject=data["subject"],
                        group=data["group"],
                        replication_factor=data["replication_factor"],
                        creation_timestamp=data["creation_timestamp"],
                        directory=data["directory"],
                        config=StreamConfig(**data["config"]),
                        partitions=data["partitions"],
                    )
                    stream.resume_all = bool(data.get("resume_all", False))
                    # Age-based retention is re-applied on open; count and size limits hold already.
                    known_dirs.add(stream.directory)
            except (ValueError, KeyError, TypeError) as exc:
                raise DataDirError(
                    f"{path} is not readable dev-server metadata ({exc}); use another --data-dir or remove it"
                ) from exc
        for child in (self.data_dir / "streams").iterdir():
            if child.name not in known_dirs:
                # A stream deleted (or half-created) before a crash.
                shutil.rmtree(child, ignore_errors=True)
        if self.cluster is None:
            self.reconcile_leaders()

    def save(self) -> None:
        """Rewrite ``meta.json`` atomically."""
        meta = {"version": _META_VERSION, "streams": [s.to_json() for s in self.streams.values()]}
        path = self.data_dir / META_FILE
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(meta, fh)
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)

    def _make_stream(
        self,
        *,
        name: str,
        subject: str,
        group: str,
        replication_factor: int,
        creation_timestamp: int,
        directory: str,
        config: StreamConfig,
        partitions: list[Mapping[str, Any]],
    ) -> Stream:
        """Open a stream's logs; ``partitions`` holds each partition's saved state (``Partition.to_json``)."""
        stream = Stream(name, subject, group, replication_factor, creation_timestamp, directory, config)
        seg_bytes = config.segment_max_bytes or DEFAULT_SEGMENT_BYTES
        base = self.data_dir / "streams" / directory
        for pid, pdata in enumerate(partitions):
            if self.cluster is None:
                part = Partition(
                    self, stream, pid, PartitionLog(base / str(pid), segment_max_bytes=seg_bytes, fsync=self.fsync)
                )
                part.load_json(pdata)
            else:
                # One log per replica: broker 0's in the single-broker place, the others' beside it.
                first = self.brokers[0].id
                logs = {
                    bid: PartitionLog(
                        base / (str(pid) if bid == first else f"{pid}.{bid}"),
                        segment_max_bytes=seg_bytes,
                        fsync=self.fsync,
                    )
                    for bid in pdata["replicas"]
                }
                leader = str(pdata["leader"])
                part = Partition(self, stream, pid, logs[leader])
                part.load_json(pdata)
                self.cluster.attach(part, logs, pdata)
            stream.partitions.append(part)
        self.streams[name] = stream
        return stream

    def leadership_moved(self, part: Partition) -> None:
        """``part`` has a new leader (cluster mode): subscribers and waiting publishers re-check."""
        part.notify()

    # -- flushing -------------------------------------------------------------
    def mark_dirty(self, partition: Partition) -> None:
        """Schedule ``partition`` for the flush at the end of this loop iteration."""
        partition._flush_scheduled = True
        self._dirty[partition] = None
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write every dirty partition, then run its commit callbacks and wake its subscribers."""
        self._flush_handle = None
        dirty = self._dirty
        self._dirty = {}
        now = time.time_ns()
        for part in dirty:
            try:
                part._commit(now)
            except Exception:  # the other partitions must still be written and acked
                log.exception("committing partition %s/%d failed", part.stream.name, part.id)

    def enforce_age_retention(self) -> None:
        """Expire messages older than each stream's retention max age."""
        now = time.time_ns()
        for stream in self.streams.values():
            age = stream.config.retention_max_age_ms
            if age > 0:
                for part in stream.partitions:
                    logs = (
                        [part.log] if part.replication is None else [r.log for r in part.replication.replicas.values()]
                    )
                    if any([plog.enforce_retention(max_age_ns=age * 1_000_000, now_ns=now) for plog in logs]):
                        part.notify()

    # -- brokers --------------------------------------------------------------
    def live_brokers(self) -> list[BrokerSlot]:
        return [b for b in self.brokers if b.live]

    def broker_by_id(self, broker_id: str) -> BrokerSlot | None:
        return next((b for b in self.brokers if b.id == broker_id), None)

    def leader_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Per broker id: (partitions hosted, partitions led)."""
        hosted = {b.id: 0 for b in self.brokers}
        led = {b.id: 0 for b in self.brokers}
        for stream in self.streams.values():
            for part in stream.partitions:
                for r in part.replicas:
                    hosted[r] = hosted.get(r, 0) + 1
                led[part.leader] = led.get(part.leader, 0) + 1
        return hosted, led

    def _pick_leader(self, candidates: list[BrokerSlot]) -> BrokerSlot:
        _, led = self.leader_counts()
        return min(candidates, key=lambda b: (led.get(b.id, 0), b.index))

    def reconcile_leaders(self) -> None:
        """Give every partition a live leader and an ISR of its live replicas; call after liveness changes."""
        live = self.live_brokers()
        live_ids = {b.id for b in live}
        changed = False
        for stream in self.streams.values():
            for part in stream.partitions:
                isr = [r for r in part.replicas if r in live_ids]
                if live and part.leader not in live_ids:
                    in_replicas = [b for b in live if b.id in part.replicas]
                    new = self._pick_leader(in_replicas or live)
                    part.leader = new.id
                    if new.id not in part.replicas:
                        part.replicas.append(new.id)
                        isr.append(new.id)
                    changed = True
                if isr != part.isr:
                    part.isr = isr
                    changed = True
                part.notify()
        if changed and self.streams:
            self.save()

    # -- admin ----------------------------------------------------------------
    def get_stream(self, name: str) -> Stream | None:
        return self.streams.get(name)

    def get_partition(self, name: str, pid: int) -> Partition | None:
        stream = self.streams.get(name)
        if stream is None or not 0 <= pid < len(stream.partitions):
            return None
        return stream.partitions[pid]

    async def create_stream(self, req: api_pb2.CreateStreamRequest) -> Stream:
        """Create a stream from a request, validated as the real server validates it.

        :raises ApiError: INVALID_ARGUMENT (empty name, bad subject, reserved name, replication
            factor), ALREADY_EXISTS, FAILED_PRECONDITION (encryption).
        """
        if not req.name:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Name cannot be empty")
        if not is_valid_subject(req.subject):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Subject is invalid")
        if req.name in RESERVED_STREAMS:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Stream is reserved")
        if req.HasField("encryption") and req.encryption.value:
            raise ApiError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "Failed  on preconditions for stream's encryption handler: the dev server does not encrypt data",
            )
        size = len(self.brokers)
        rf = req.replicationFactor or 1
        if rf == -1:
            rf = size
        if rf < 1 or rf > size:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"Invalid replicationFactor {req.replicationFactor}, cluster size {size}",
            )
        if req.name in self.streams:
            raise ApiError(grpc.StatusCode.ALREADY_EXISTS, "stream already exists")
        live = [b for b in self.live_brokers() if not b.stalled] or list(self.brokers)
        created = time.time_ns()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", req.name)[:64]
        placements: list[Mapping[str, Any]] = []
        led = self.leader_counts()[1]
        for _ in range(req.partitions or 1):
            leader = min(live, key=lambda b: (led.get(b.id, 0), b.index))
            led[leader.id] = led.get(leader.id, 0) + 1
            # Replicas: the leader, then the next brokers in index order.
            order = sorted(self.brokers, key=lambda b: (b.index - leader.index) % size)
            placements.append(
                {
                    "leader": leader.id,
                    "replicas": [b.id for b in order[:rf]],
                    "isr": [b.id for b in order[:rf] if b.live and not b.stalled],
                }
            )
        stream = self._make_stream(
            name=req.name,
            subject=req.subject,
            group=req.group,
            replication_factor=rf,
            creation_timestamp=created,
            directory=f"{safe}-{created}",
            config=StreamConfig.from_request(req),
            partitions=placements,
        )
        self.save()
        if self.cluster is not None:
            for part in stream.partitions:
                part.replication.start_followers()  # type: ignore[union-attr]
        if self.listener is not None:
            for part in stream.partitions:
                await self.listener.partition_opened(part)
        return stream

    async def delete_stream(self, name: str) -> None:
        """Delete a stream and its data; subscribers end with NOT_FOUND.

        :raises ApiError: INVALID_ARGUMENT for a reserved name, NOT_FOUND for an unknown stream.
        """
        if name in RESERVED_STREAMS:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Stream is reserved")
        stream = self.streams.pop(name, None)
        if stream is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, "stream does not exist")
        self.save()
        for part in stream.partitions:
            part.deleted = True
            if self.listener is not None:
                await self.listener.partition_closed(part)
            self._dirty.pop(part, None)
            part._callbacks.clear()
            if part.replication is not None:
                part.replication.destroy()
            else:
                part.log.destroy()
            part.notify()
        shutil.rmtree(self.data_dir / "streams" / stream.directory, ignore_errors=True)

    def _select(self, name: str, pids: Iterable[int]) -> tuple[Stream, list[Partition]]:
        stream = self.streams.get(name)
        if stream is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, "stream does not exist")
        ids = list(pids) or list(range(len(stream.partitions)))
        parts = []
        for pid in ids:
            if not 0 <= pid < len(stream.partitions):
                raise ApiError(grpc.StatusCode.NOT_FOUND, "partition does not exist")
            parts.append(stream.partitions[pid])
        return stream, parts

    async def pause(self, name: str, pids: Iterable[int], resume_all: bool) -> None:
        """Pause partitions (all when ``pids`` is empty).

        :raises ApiError: NOT_FOUND for an unknown stream or partition.
        """
        stream, parts = self._select(name, pids)
        now = time.time_ns()
        stream.resume_all = resume_all
        for part in parts:
            if not part.paused:
                part.paused = part.paused_in_metadata = True
                part.pause_timestamps = (part.pause_timestamps[0] or now, now)
                if self.listener is not None:
                    await self.listener.partition_closed(part)
            part.notify()
        self.save()

    async def resume_for_publish(self, partition: Partition) -> None:
        """Resume ``partition`` (or every paused partition of its stream when paused with resumeAll)."""
        stream = partition.stream
        targets = [p for p in stream.partitions if p.paused] if stream.resume_all else [partition]
        targets = [p for p in targets if p.paused]
        if not targets:
            return
        now = time.time_ns()
        for part in targets:
            part.paused = False
            part.pause_timestamps = (part.pause_timestamps[0] or now, now)
            if self.listener is not None:
                await self.listener.partition_opened(part)
        stream.resume_all = False
        self.save()

    async def set_readonly(self, name: str, pids: Iterable[int], readonly: bool) -> None:
        """Set or clear the read-only flag of partitions (all when ``pids`` is empty).

        :raises ApiError: NOT_FOUND for an unknown stream or partition.
        """
        _, parts = self._select(name, pids)
        now = time.time_ns()
        for part in parts:
            if part.readonly != readonly:
                part.readonly = readonly
                part.readonly_timestamps = (part.readonly_timestamps[0] or now, now)
            part.notify()
        self.save()

    def close(self) -> None:
        """Flush and close every log (the server is stopping)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for part in self._dirty:
            part._commit(time.time_ns())
        self._dirty = {}
        if self.cluster is not None:
            self.cluster.stop()
        for stream in self.streams.values():
            for part in stream.partitions:
                if part.replication is not None:
                    part.replication.close()
                else:
                    part.log.close()
        self.cursors.close()
