"""The store: the dev server's streams, brokers and cursors, and how they are made durable
(one partition is :mod:`.partition`, cursors :mod:`.cursors`, cluster mode :mod:`.cluster`).

Everything runs on one asyncio event loop, so nothing here takes a lock. Records
are appended to a partition's log in memory and written in batches: every
append marks its partition dirty and schedules one flush for the end of the
current loop iteration; after the write, the partition's commit callbacks run
(acks, PublishAsync responses) and waiting subscribers wake up. An ack is
therefore never sent before its record is in the file.

Metadata (streams, partitions, leaders, paused and read-only flags) lives in
``meta.json``, rewritten atomically on every change; cursors are messages of the
internal ``__cursors`` stream (``cursors_stream.py``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .clock import clock_shift_ns
from .cluster import Cluster, replication_of
from .cursors import CursorIndex
from .errors import ApiError, DataDirError
from .log import DEFAULT_SEGMENT_BYTES, PartitionLog
from .model import DEFAULT_CLEANER_INTERVAL_MS, BrokerSlot, ClusterTimings, StreamConfig, is_valid_subject
from .partition import Partition, PartitionListener, Stream

log = logging.getLogger(__name__)

RESERVED_STREAMS = frozenset({"__cursors", "__activity"})
META_FILE = "meta.json"
_META_VERSION = 1

#: Async error codes of PublishAsync (``PublishAsyncError.Code``).
ASYNC_NOT_FOUND = api_pb2.PublishAsyncError.NOT_FOUND
ASYNC_BAD_REQUEST = api_pb2.PublishAsyncError.BAD_REQUEST
ASYNC_READONLY = api_pb2.PublishAsyncError.READONLY
ASYNC_INCORRECT_OFFSET = api_pb2.PublishAsyncError.INCORRECT_OFFSET
ASYNC_INTERNAL = api_pb2.PublishAsyncError.INTERNAL


class Store:
    """All streams of the server, the broker list, cursors and the batched flushing of logs.

    :param data_dir: where ``meta.json`` and ``streams/`` live (created if missing).
    :param brokers: the cluster's brokers; partition leaders are chosen among them.
    :param fsync: ``fsync`` log writes (default: written to the OS page cache only).
    :param timings: cluster-mode time-outs (more than one broker; default: Liftbridge's).
    :raises DataDirError: the directory is unusable or its metadata unreadable.
    """

    def __init__(
        self, data_dir: Path, brokers: list[BrokerSlot], *, fsync: bool = False, timings: ClusterTimings | None = None
    ) -> None:
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
        #: Cursor positions, in step with the messages of ``__cursors`` (``cursors_stream.py``).
        self.cursors = CursorIndex()
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
        seg_age = config.segment_max_age_ms * 1_000_000
        base = self.data_dir / "streams" / directory
        for pid, pdata in enumerate(partitions):
            if self.cluster is None:
                plog = PartitionLog(
                    base / str(pid), segment_max_bytes=seg_bytes, fsync=self.fsync, segment_max_age_ns=seg_age
                )
                part = Partition(self, stream, pid, plog)
                part.load_json(pdata)
            else:
                # One log per replica: broker 0's in the single-broker place, the others' beside it.
                first = self.brokers[0].id
                logs = {
                    bid: PartitionLog(
                        base / (str(pid) if bid == first else f"{pid}.{bid}"),
                        segment_max_bytes=seg_bytes,
                        fsync=self.fsync,
                        segment_max_age_ns=seg_age,
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

    def run_cleaners(self) -> None:
        """Run each stream's cleaner whose interval is up, on every replica's log of its partitions:
        roll a full or aged active segment, or else apply the retention limits (Liftbridge's
        ``commitLog.cleanerLoop``: a tick that rolled skips the clean). A stream's first run is one
        interval after the first call that sees it (Liftbridge's ticker starts with the log)."""
        mono = time.monotonic()
        now = time.time_ns()
        for stream in self.streams.values():
            cfg = stream.config
            interval = (cfg.cleaner_interval_ms or DEFAULT_CLEANER_INTERVAL_MS) / 1000
            if not stream.next_clean:
                stream.next_clean = mono + interval
            if mono < stream.next_clean:
                continue
            stream.next_clean = mono + interval
            # A segment's age is judged by the clock that stamped it (a test's reception clock too).
            stamp_now = now + clock_shift_ns(stream.name)
            limits = {
                "max_messages": cfg.retention_max_messages,
                "max_bytes": cfg.retention_max_bytes,
                "max_age_ns": cfg.retention_max_age_ms * 1_000_000,
                "now_ns": now,
            }
            for part in stream.partitions:
                logs = [part.log] if part.replication is None else part.replication.replica_logs()
                cleaned = [plog.enforce_retention(**limits) for plog in logs if not plog.check_split(stamp_now)]
                if any(cleaned):
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
    def get_partition(self, name: str, pid: int) -> Partition | None:
        stream = self.streams.get(name)
        if stream is None or not 0 <= pid < len(stream.partitions):
            return None
        return stream.partitions[pid]

    async def create_stream(self, req: api_pb2.CreateStreamRequest, *, internal: bool = False) -> Stream:
        """Create a stream from a request, validated as the real server validates it.

        :param internal: the server creates one of its reserved streams (``cursors_stream.py``).
        :raises ApiError: INVALID_ARGUMENT (empty name, bad subject, reserved name, replication
            factor), ALREADY_EXISTS, FAILED_PRECONDITION (encryption).
        """
        if not req.name:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Name cannot be empty")
        if not is_valid_subject(req.subject):
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "Subject is invalid")
        if req.name in RESERVED_STREAMS and not internal:
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
        live = [b for b in self.live_brokers() if not b.stalled and not b.isolated] or list(self.brokers)
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
                    "isr": [b.id for b in order[:rf] if b.live and not b.stalled and not b.isolated],
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
                replication_of(part).start_followers()
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
