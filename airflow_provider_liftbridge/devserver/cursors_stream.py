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

The dev server does the same, with one simplification: the positions themselves stay in the
server's own cursor log (:class:`~.cursors.CursorStore`), so the ``__cursors`` partitions hold no
messages (their offsets stay at -1).
"""

from __future__ import annotations

import zlib

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .errors import ApiError
from .model import BrokerSlot
from .partition import Partition
from .state import Store

#: Name of the internal stream (reserved: CreateStream and DeleteStream refuse it).
CURSORS_STREAM = "__cursors"
#: Its subject: Liftbridge's ``<clustering.namespace>.cursors`` with the default namespace.
CURSORS_SUBJECT = "liftbridge-default.cursors"
#: Liftbridge's default ``cursors.stream.auto.pause.time`` (accepted and ignored, as for any stream).
_AUTO_PAUSE_MS = 60_000


def cursor_partition(cursor_id: str, stream: str, partition: int, partitions: int) -> int:
    """The ``__cursors`` partition owning cursor (``cursor_id``, ``stream``, ``partition``)."""
    return zlib.crc32(f"{cursor_id},{stream},{partition}".encode()) % partitions


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
    )
    await store.create_stream(request, internal=True)


def check_cursor_owner(store: Store, broker: BrokerSlot, cursor_id: str, stream: str, partition: int) -> None:
    """Refuse a cursor call this broker may not serve, as Liftbridge does.

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
