"""The internal cursors stream ``__cursors``, kept the way Liftbridge keeps it.

Liftbridge (``server/cursors.go``) stores cursors in an internal stream that its metadata leader
creates when cursors are enabled (``cursors.stream.partitions`` > 0), with every broker as a
replica by default, compaction on, and the subject ``<namespace>.cursors``. FetchMetadata lists
it like any stream, and clients route by it (go-liftbridge, gufo-liftbridge, this project's
client): a cursor (id, stream, partition) belongs to partition
``crc32_ieee("<id>,<stream>,<partition>") % partition count``, and only that partition's leader
serves SetCursor and FetchCursor for it. Any other broker answers FAILED_PRECONDITION
"Server not leader for cursors partition N"; without the stream every cursor call answers
INTERNAL "Cursors stream does not exist".

Every SetCursor is a message of the owning partition (key and value: :mod:`.cursors`), published
with ack policy ALL and a 5 s limit as Liftbridge does; FetchCursor answers from the serving
broker's cursor cache, or on a miss from its replica of the owning partition, read backwards from
the high watermark that replica knows (:func:`read_cursor`, :mod:`.cursors`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .cluster import replication_of
from .cursors import (
    CursorId,
    compaction_due,
    cursor_key,
    cursor_partition,
    cursor_value,
    drop_legacy,
    latest_cursor_offset,
    take_legacy,
)
from .errors import ApiError
from .log import PartitionLog
from .model import BrokerSlot, NewMessage
from .partition import Partition
from .state import Store

#: Name of the internal stream (reserved: CreateStream and DeleteStream refuse it).
CURSORS_STREAM = "__cursors"
#: Its subject: Liftbridge's ``<clustering.namespace>.cursors`` with the default namespace.
CURSORS_SUBJECT = "liftbridge-default.cursors"
#: Liftbridge's default ``cursors.stream.auto.pause.time`` (accepted and ignored, as for any stream).
_AUTO_PAUSE_MS = 60_000
#: Segment size of a new ``__cursors`` stream: small, so that what compaction discards leaves the disk.
_SEGMENT_BYTES = 1 << 20
#: How long SetCursor waits for its message to commit (Liftbridge's ``defaultCursorTimeout``).
CURSOR_TIMEOUT = 5.0


async def ensure_cursors_stream(store: Store, partitions: int) -> None:
    """Create ``__cursors`` with ``partitions`` partitions, replicated on every broker, unless it
    exists already (then it keeps its partition count, as on Liftbridge) or ``partitions`` is 0."""
    if partitions <= 0 or CURSORS_STREAM in store.streams:
        return
    request = api_pb2.CreateStreamRequest(
        name=CURSORS_STREAM,
        subject=CURSORS_SUBJECT,
        partitions=partitions,
        replicationFactor=-1,
        compactEnabled=api_pb2.NullableBool(value=True),
        autoPauseTime=api_pb2.NullableInt64(value=_AUTO_PAUSE_MS),
        autoPauseDisableIfSubscribers=api_pb2.NullableBool(value=True),
        segmentMaxBytes=api_pb2.NullableInt64(value=_SEGMENT_BYTES),
    )
    await store.create_stream(request, internal=True)


async def open_cursors(store: Store) -> None:
    """Read the cursors back from ``__cursors`` (the server starts), move in those an earlier dev
    server kept in ``DATA_DIR/cursors/``, and compact partitions that grew past their bound."""
    cursors = store.streams.get(CURSORS_STREAM)
    if cursors is None:
        return  # cursors off: an earlier server's cursor log stays until they are on again
    for part in cursors.partitions:
        records = store.cursors.load(part.log)
        if compaction_due(records, len(store.cursors.owned_by(part.id, len(cursors.partitions)))):
            _compact(store, part)
    legacy = take_legacy(store.data_dir)
    if not legacy:
        return
    # Not awaited: in cluster mode nothing commits before the brokers serve. The old log goes
    # once every cursor it held is committed in __cursors; they count as set meanwhile.
    waits = []
    for cursor, offset in legacy.items():
        if store.cursors.get(*cursor) == -1:
            store.cursors.record(cursor, offset)
            pid = cursor_partition(*cursor, len(cursors.partitions))
            # They count as set: the leader's cache has them, as after a SetCursor.
            store.cursors.cache(cursors.partitions[pid].leader).add(cursor_key(*cursor), offset)
            waits.append(_write(store, cursors.partitions[pid], cursor, offset))
    asyncio.gather(*waits).add_done_callback(lambda _done: drop_legacy(store.data_dir))


async def write_cursor(store: Store, owner: Partition, cursor: CursorId, offset: int, timeout: float | None) -> None:
    """Store a SetCursor as a message of ``owner`` (its ``__cursors`` partition) and return once
    it is committed on the whole ISR, as Liftbridge's publish with ack policy ALL.

    :param timeout: the caller's time left (Liftbridge waits at most 5 s whatever it is).
    :raises ApiError: INTERNAL "context deadline exceeded" when it did not commit in time (it may
        still commit later), INTERNAL naming a read-only partition.
    """
    if owner.readonly:
        raise ApiError(grpc.StatusCode.INTERNAL, f"readonly partition: {owner.id}")
    serving = owner.leader  # the broker serving the call (check_cursor_owner): its cache takes the value
    if owner.paused:
        await store.resume_for_publish(owner)  # a publish resumes a paused partition, this one too
    limit = CURSOR_TIMEOUT if timeout is None else max(0.0, min(timeout, CURSOR_TIMEOUT))
    try:
        await asyncio.wait_for(asyncio.shield(_write(store, owner, cursor, offset)), limit)
    except TimeoutError:
        raise ApiError(grpc.StatusCode.INTERNAL, "context deadline exceeded") from None
    store.cursors.cache(serving).add(cursor_key(*cursor), offset)
    _trim(store, owner)
    partitions = len(store.streams[CURSORS_STREAM].partitions)
    records = owner.log.newest_offset + 1 - owner.log.oldest_offset
    if compaction_due(records, len(store.cursors.owned_by(owner.id, partitions))):
        _compact(store, owner)


def read_cursor(store: Store, broker: BrokerSlot, owner: Partition, cursor: CursorId) -> int:
    """FetchCursor on ``broker`` (the leader of ``owner``, the cursor's ``__cursors`` partition):
    the cached offset, else what ``broker``'s replica of ``owner`` holds for the cursor at or below
    the high watermark that replica knows (:func:`~.cursors.latest_cursor_offset`; -1 when
    nothing), which is then cached."""
    key = cursor_key(*cursor)
    cache = store.cursors.cache(broker.id)
    offset = cache.get(key)
    if offset is not None:
        return offset
    if owner.replication is None:
        local: tuple[PartitionLog, int] | None = (owner.log, owner.log.newest_offset)
    else:
        local = replication_of(owner).local_hw(broker.id)
    offset = -1 if local is None else latest_cursor_offset(local[0], key, local[1])
    cache.add(key, offset)
    return offset


def _write(store: Store, owner: Partition, cursor: CursorId, offset: int) -> asyncio.Future[Any]:
    """Append one cursor message; the future resolves (and the index moves) once it is committed."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    key, value = cursor_key(*cursor), cursor_value(*cursor, offset)
    written = owner.append(key, value, None, owner.subject, "", -1, time.time_ns())

    def committed(_arg: object, _commit_ts: int) -> None:
        store.cursors.record(cursor, offset)
        if not done.done():
            done.set_result(None)

    if owner.replication is None:
        owner.after_commit(committed, None)
    else:
        owner.replication.after_hw(written, committed, None)
    return done


def _compact(store: Store, owner: Partition) -> None:
    """Write the latest message of every cursor of ``owner`` again, then discard everything
    before those copies in every replica's log that holds them all (the others at a later write)."""
    partitions = len(store.streams[CURSORS_STREAM].partitions)
    live = store.cursors.owned_by(owner.id, partitions)
    messages: list[NewMessage] = [(cursor_key(*c), cursor_value(*c, o), None, owner.subject, "", -1) for c, o in live]
    first = owner.log.next_offset
    owner.append_many(messages, time.time_ns())
    end = first + len(messages)

    def copied(_arg: object, _commit_ts: int) -> None:
        store.cursors.trims[owner.id] = (first, end)
        _trim(store, owner)

    owner.after_commit(copied, None)


def _trim(store: Store, owner: Partition) -> None:
    """Discard what the last compaction of ``owner`` replaced, in every replica's log that holds
    the copies (a follower behind them is trimmed at a later write)."""
    trim = store.cursors.trims.get(owner.id)
    if trim is None:
        return
    first, end = trim
    logs = [owner.log] if owner.replication is None else owner.replication.replica_logs()
    if any([log_.discard_before(first) for log_ in logs if log_.newest_offset + 1 >= end]):
        owner.notify()


def check_cursor_owner(store: Store, broker: BrokerSlot, cursor_id: str, stream: str, partition: int) -> Partition:
    """The ``__cursors`` partition owning the cursor, when this broker may serve the call.

    :raises ApiError: INTERNAL "Cursors stream does not exist" (cursors off), FAILED_PRECONDITION
        "Server not leader for cursors partition N" (another broker leads the owning partition, or
        no one does yet).
    """
    cursors = store.streams.get(CURSORS_STREAM)
    if cursors is None or (store.cluster is not None and store.cluster.no_streams):
        raise ApiError(grpc.StatusCode.INTERNAL, "Cursors stream does not exist")
    pid = cursor_partition(cursor_id, stream, partition, len(cursors.partitions))
    owner: Partition = cursors.partitions[pid]
    if owner.leader != broker.id or (store.cluster is not None and store.cluster.no_leaders):
        raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"Server not leader for cursors partition {pid}")
    return owner
