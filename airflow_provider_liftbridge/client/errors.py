"""Typed errors of the client: one base class, one subclass per thing that went wrong.

Every message says what was wrong and what to do about it. The gRPC error that caused one is
kept as ``__cause__`` but its details never make up the error's type: callers catch these
classes, never ``grpc.RpcError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .types import Ack

__all__ = [
    "AckTimeoutError",
    "AckedThenLostError",
    "ClientClosedError",
    "CursorsDisabledError",
    "EncryptionError",
    "IncorrectOffsetError",
    "InvalidArgumentError",
    "LiftbridgeError",
    "MessageTooLargeError",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "NotLeaderError",
    "NotSentError",
    "PartitionPausedError",
    "PermissionDeniedError",
    "PublishError",
    "ReadonlyPartitionError",
    "RequestTimeoutError",
    "ServerError",
    "StreamExistsError",
    "UnaccountedRecordError",
    "UnavailableError",
    "UnsettledCursorError",
]


class LiftbridgeError(Exception):
    """Base class of every error the client raises."""


class StreamExistsError(LiftbridgeError):
    """``create_stream``: a stream with this name already exists."""


class NoSuchStreamError(LiftbridgeError):
    """The stream does not exist (never created, or deleted)."""


class NoSuchPartitionError(LiftbridgeError):
    """The stream exists but has no partition with this number."""


class PartitionPausedError(LiftbridgeError):
    """The partition is paused; publish to it, or subscribe with ``resume=True``, to resume it."""


class ReadonlyPartitionError(LiftbridgeError):
    """The partition is read-only: it accepts no more messages."""


class IncorrectOffsetError(LiftbridgeError):
    """Optimistic concurrency control refused a message: ``expected_offset`` was not the offset
    the message would get."""


class MessageTooLargeError(LiftbridgeError):
    """The message is larger than the server accepts."""


class EncryptionError(LiftbridgeError):
    """The server could not encrypt the message for a stream with encryption at rest."""


class NotLeaderError(LiftbridgeError):
    """The broker is not the partition's leader, and a fresh leader could not be found in time."""


class RequestTimeoutError(LiftbridgeError):
    """A call did not finish within its deadline."""


class AckTimeoutError(RequestTimeoutError):
    """A publish was sent but its ack did not arrive within the timeout. The message may or may
    not be stored: publish again only if duplicates are acceptable (or use an expected offset)."""


class NotSentError(LiftbridgeError):
    """A record of a publishing call was never handed to the connection: the call stopped at an
    earlier record's failure first. It is certainly not stored, so publishing it again cannot
    store it twice."""


class AckedThenLostError(LiftbridgeError):
    """A record was acknowledged with ack policy ALL during the call, and by the time the call
    failed the partition's leader (agreed on by the replicas that answered) held no record at its
    offset: the log ends below it. Liftbridge v1.9 can do that (a follower cuts its log to its own
    lagging high watermark and is elected; docs/reliability.md, seed 59961). The record is not
    stored: publish it again, and check the cluster (its brokers' logs, the partition's ISR).

    :ivar stream: the stream.
    :ivar partition: the partition.
    :ivar offset: the offset the ack named.
    :ivar newest_offset: the partition's newest offset as its leader reported it (-1: empty).
    """

    def __init__(self, message: str, *, stream: str, partition: int, offset: int, newest_offset: int) -> None:
        super().__init__(message)
        self.stream = stream
        self.partition = partition
        self.offset = offset
        self.newest_offset = newest_offset


class UnaccountedRecordError(LiftbridgeError):
    """The publishing engine reported neither an ack nor an error for a record. This is a bug in
    the provider, caught by the publish contract (``publishing/contract.py``) instead of being
    returned as a short list of acks; the record may or may not be stored. Please report it."""


class UnavailableError(LiftbridgeError):
    """No broker could be reached, after every retry.

    :ivar cause: the transport's own account of the last failure (gRPC's status text, e.g. "...
        Connection refused", or nats-py's error), or "".
    """

    def __init__(self, message: str, *, cause: str = "") -> None:
        super().__init__(message)
        self.cause: str = cause


class UnsettledCursorError(UnavailableError):
    """``fetch_cursor``: the leader of the cursors-stream partition that owns the cursor held
    messages it had not committed yet, for longer than the client waits. Liftbridge answers a
    FetchCursor it has not cached by reading that partition backwards from its high watermark and
    caches the answer, so asked then it could return (and keep returning) an older position than
    the last one stored. Nothing was read; try again once the cluster has settled."""


class CursorsDisabledError(LiftbridgeError):
    """The cluster has cursors switched off (Liftbridge's default): SetCursor and FetchCursor cannot
    work until the server is configured with ``cursors.stream.partitions`` above 0 (and, on a
    cluster, ``cursors.stream.replication.factor``). Never retried: retrying cannot change it."""


class InvalidArgumentError(LiftbridgeError, ValueError):
    """The server (or the client, before sending) refused an argument as invalid."""


class PermissionDeniedError(LiftbridgeError):
    """The server refused the call for lack of permission or authentication."""


class ClientClosedError(LiftbridgeError):
    """The client was closed; create a new one."""


class ServerError(LiftbridgeError):
    """The server failed in a way none of the other classes describes."""


class PublishError(LiftbridgeError):
    """``publish_many`` did not get every record acknowledged.

    :ivar acks: one entry per input record, in input order: its :class:`Ack`, or ``None`` when
        it was not acknowledged.
    :ivar acked: how many records were acknowledged.
    :ivar index: the index of the first record that failed, or ``None`` when the failure did not
        belong to one record (e.g. the connection was lost).
    :ivar errors: the typed error of each failed record, by record index.
    :ivar start: the position of ``acks[0]`` in the caller's whole input: 0 for ``publish_many``;
        ``BatchPublisher.publish`` sends its input batch by batch, and ``acks``, ``index`` and
        ``errors`` are those of the batch that failed.
    """

    def __init__(
        self,
        message: str,
        *,
        acks: Sequence[Ack | None],
        index: int | None,
        errors: dict[int, LiftbridgeError] | None = None,
        start: int = 0,
    ) -> None:
        super().__init__(message)
        self.start = start
        self.acks: tuple[Ack | None, ...] = tuple(acks)
        self.acked: int = sum(1 for a in self.acks if a is not None)
        self.index: int | None = index
        self.errors: dict[int, LiftbridgeError] = dict(errors or {})
