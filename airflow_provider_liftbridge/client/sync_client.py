"""The blocking client: executes the shared operations with synchronous gRPC."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from . import column_subscription, cursors, group_roster, operations, subscription
from .base import ClientBase
from .column_subscription import DEFAULT_COLUMN_ROWS, MessageColumns
from .compression import Compression
from .consumer import MAX_POLL_INTERVAL, AutoOffset, GroupMember
from .effects import Op
from .group_consumer import GroupConsumer
from .partitioners import PartitionerFunc
from .publishing import single
from .publishing.options import PublishOptions, PublishPath
from .publishing.resend import ResendPolicy
from .requests import StartAt, StopAt
from .routing import ClientCore
from .stream_options import StreamOptions
from .transport.channels import ChannelFactory, SyncChannelPool
from .transport.nats import NatsLink
from .transport.sync import SyncTransport
from .types import Ack, AckPolicy, Message, Metadata, PartitionInfo, Record, StartPosition, StreamInfo

if TYPE_CHECKING:
    from .publishing.publisher import BatchPublisher

# The batch publishing engines (and nats-py under them) are imported by the methods that publish
# batches: a process that only reads or asks for metadata (Spark's read planner and readers)
# would otherwise import them with every client (issue 57).

__all__ = ["LiftbridgeClient"]

_R = TypeVar("_R")
_P = ParamSpec("_P")


def _runs(op: Callable[Concatenate[ClientCore, _P], Op[_R]]) -> Callable[Concatenate[LiftbridgeClient, _P], _R]:
    """A client method that runs the operation ``op`` with the client's core and transport: the
    method has ``op``'s parameters after the core, and its docstring (one signature, written once)."""

    def method(self: LiftbridgeClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self._transport.run(op(self._core, *args, **kwargs))

    functools.update_wrapper(method, op)
    signature = inspect.signature(op)
    params = list(signature.parameters.values())
    me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    # ``op`` returns an operation; the method returns what it yields in the end (annotated on ``op``).
    unannotated = signature.replace(parameters=[me, *params[1:]], return_annotation=inspect.Signature.empty)
    method.__signature__ = unannotated  # type: ignore[attr-defined]
    vars(method).pop("__wrapped__")  # the signature above, not the operation's (which takes the core)
    return method


class LiftbridgeClient(ClientBase):
    """A blocking Liftbridge client; thread-safe, a context manager. Constructor parameters:
    see :class:`~.base.ClientBase`. Each method runs one operation (:mod:`.operations`,
    :mod:`.publishing`, :mod:`.subscription`) with blocking gRPC. The asyncio client shares these
    methods (:func:`.async_client.awaited`): a method's body builds the operation and hands it to
    ``self._transport``, and does nothing that only one transport could do.
    """

    #: What :meth:`group_consumer` makes (the asyncio client, which shares the method, makes
    #: its own kind).
    _consumer_class: type[GroupConsumer] = GroupConsumer

    def _open(self, factory: ChannelFactory, subscription_channels: int) -> None:
        self._pool = SyncChannelPool(factory, subscription_channels)
        self._transport = SyncTransport(
            self._pool, NatsLink(self.nats_servers, self._core.timeout, self.nats_security, self.settings.keepalive)
        )

    def create_stream(self, /, subject: str, name: str, options: StreamOptions | None = None, **keywords: Any) -> None:
        """Create a stream named ``name`` attached to the NATS subject ``subject``, with ``options``
        (a :class:`~.stream_options.StreamOptions`) or the same options as keywords
        (``create_stream(subject, name, partitions=3)``; keywords replace fields of ``options``).

        Options left at ``None`` take the server's defaults. Durations are ``timedelta`` and are sent
        in milliseconds. ``partitions=0`` means 1; ``replication_factor=-1`` means every broker.

        :raises StreamExistsError: a stream with this name exists.
        :raises InvalidArgumentError: an empty or invalid name, subject or option, a reserved name,
            a replication factor larger than the cluster.
        :raises TypeError: a keyword that is no stream option.
        :raises UnavailableError: no broker could be reached.
        """
        chosen = StreamOptions.of(options, keywords)
        return self._transport.run(operations.create_stream(self._core, subject, name, chosen))

    def delete_stream(self, name: str) -> None:
        """Delete the stream ``name`` and all its partitions.

        :raises NoSuchStreamError: there is no such stream.
        :raises InvalidArgumentError: the name is reserved.
        """
        return self._transport.run(operations.delete_stream(self._core, name))

    def pause_stream(self, name: str, partitions: Sequence[int] | None = None, resume_all: bool = False) -> None:
        """Pause the given partitions of ``name`` (all when ``partitions`` is ``None``).

        A paused partition resumes when a message is published to it (all partitions when
        ``resume_all``) or when a subscriber asks with ``resume=True``.

        :raises NoSuchStreamError: there is no such stream.
        :raises NoSuchPartitionError: a listed partition does not exist.
        """
        return self._transport.run(operations.pause_stream(self._core, name, partitions, resume_all))

    def set_stream_readonly(self, name: str, partitions: Sequence[int] | None = None, readonly: bool = True) -> None:
        """Make the given partitions of ``name`` read-only (all when ``partitions`` is ``None``), or
        writable again with ``readonly=False``.

        :raises NoSuchStreamError: there is no such stream.
        :raises NoSuchPartitionError: a listed partition does not exist.
        """
        return self._transport.run(operations.set_stream_readonly(self._core, name, partitions, readonly))

    #: One message, waiting for its ack: :func:`.publishing.single.publish` (its signature and
    #: docstring, declared there once) run by this client's transport.
    publish = _runs(single.publish)

    def publish_many(
        self,
        stream: str,
        records: Iterable[Record | bytes],
        *,
        partition: int | None = None,
        partitioner: PartitionerFunc | None = None,
        ack_policy: AckPolicy | None = None,
        window: int | None = None,
        timeout: float | None = None,
        path: PublishPath = "auto",
        resend: ResendPolicy | None = None,
        compression: Compression = None,
    ) -> list[Ack]:
        """Publish many records and return their acks in input order (an empty list with
        ``AckPolicy.NONE``), at most ``window`` unacknowledged at a time (default: 256 over gRPC,
        4096 over NATS, where a smaller window leaves the pipeline waiting on round trips).

        ``path``: ``"nats"`` publishes enveloped messages straight to the partitions' NATS subjects
        with acks on an ack inbox (the bulk path, an order of magnitude faster from Python; needs
        ``nats_servers``); ``"grpc"`` pipelines them over PublishAsync; ``"auto"`` (default) takes
        NATS when the client knows NATS servers, except when a target partition is paused or
        read-only or NATS cannot be reached, where it falls back to gRPC (not when NATS refuses the
        credentials or the TLS settings: that raises, naming the cause). The choice is logged
        (logger ``airflow_provider_liftbridge.client``, once per client, and on every fallback).

        A record's own ``partition`` wins over ``partition``, which wins over ``partitioner``.
        ``timeout`` bounds the wait for each ack. A record not acknowledged in time (NATS), or in
        flight when the connection was lost (gRPC), is sent again while ``resend`` allows (default:
        up to two re-sends, see :class:`~.publishing.resend.ResendUnacked`): publishing is at-least-once
        and a re-sent record may land after later ones. Pass :data:`~.publishing.resend.NO_RESEND` to fail
        instead of re-sending. Over gRPC, records refused with "no such stream" for a stream this
        client has seen in metadata (a cluster restarting says that for a second or two) are sent
        again after a backoff, up to ``max_retries`` times, until metadata confirms the stream is gone.

        ``compression``: ``"gzip"`` or ``"zstd"`` (the ``zstd`` extra) compresses every value before
        it is enveloped and marks it with the header ``content-encoding``; this client's
        subscriptions hand back the original value (see :mod:`.compression`).

        :raises PublishError: a record was refused or not acknowledged in time; it carries the acks
            received (``.acks``, ``.acked``), the first failing record's index (``.index``) and the
            typed error of each failed record (``.errors``: ``IncorrectOffsetError``,
            ``MessageTooLargeError``, ``ReadonlyPartitionError``, ``AckTimeoutError``, ...);
            ``__cause__`` is the first error.
        :raises NoSuchStreamError: the stream does not exist (NATS path; gRPC reports it per record).
        :raises InvalidArgumentError: a bad record, window, path or duplicate correlation id, before
            anything is sent.
        """
        from .publishing import batch

        return self._transport.run(
            batch.publish_many(
                self._core,
                stream,
                records,
                PublishOptions(path, partition, partitioner, ack_policy, window, timeout, resend, compression),
            )
        )

    def batch_publisher(
        self,
        stream: str,
        options: PublishOptions | None = None,
        *,
        stream_info: StreamInfo | None = None,
        write_stats: bool = False,
    ) -> BatchPublisher:
        """A publisher of batches to ``stream`` with ``options`` (default: ``PublishOptions()``),
        on this client's connections: what ``publish_many`` does for one batch, for callers that
        send many batches (the publishing operators, Spark executors, exactly-once publishing) or
        an input of any length (:meth:`BatchPublisher.publish`, in bounded memory). The path is
        chosen once, when the first batch is sent, as ``publish_many`` chooses it; a fallback to
        gRPC holds for the later batches. ``stream_info``: the stream's metadata if the caller has
        just fetched it (the NATS path then does not read it again); ``write_stats``: measure
        latencies from the acks and the throughput (:attr:`BatchPublisher.stats`, see
        :mod:`.write_stats`).

        :raises InvalidArgumentError: an empty stream, or path ``"nats"`` without NATS servers
            (the options' own values are checked when the value is made).
        """
        from .publishing import batch
        from .publishing.publisher import BatchPublisher

        resolved = batch.resolve_options(self._core, stream, options or PublishOptions())
        return BatchPublisher(self._transport.run, self._core, stream, resolved, stream_info, write_stats=write_stats)

    def group_consumer(
        self,
        group_id: str,
        streams: str | Sequence[str],
        *,
        consumer_id: str | None = None,
        auto_offset: AutoOffset = "new_only",
        auto_commit_interval: float | None = 5.0,
        max_batch: int = 512,
        idle_wait: float = 0.2,
        handover: bool = True,
        max_poll_interval: float | None = MAX_POLL_INTERVAL,
    ) -> GroupConsumer:
        """A member of consumer group ``group_id`` reading ``streams`` on this client's connections
        (see :mod:`.consumer` and ``docs/consumer-groups.md``): ``join()`` / ``with`` joins,
        ``messages()`` reads the partitions the group's coordinator assigns to it from the group's
        positions, ``commit()`` stores them, ``leave()`` hands the partitions back.

        :param consumer_id: this member's id (default: a random one). A stable id lets a restarted
            process take its place again before the server times the old one out.
        :param auto_offset: where to start a partition the group has no position for:
            ``"new_only"`` (messages after the assignment), ``"earliest"``, ``"latest"`` or
            ``"none"`` (:class:`~.consumer.ConsumerGroupError`).
        :param auto_commit_interval: seconds between automatic commits at the start of a poll
            (``None``: only ``commit()``, and no commit when a partition is taken away).
        :param max_batch: messages read per partition per poll, at most.
        :param idle_wait: seconds between polls that found nothing.
        :param handover: read a partition taken over from another member only 1.5 s after the
            assignment, from where that member stopped (at most about a second of messages read
            twice after a rebalance); ``False``: read it at once from the group's position.
        :param max_poll_interval: seconds the caller may spend away from the consumer (handling a
            message or a batch) before the member leaves the group (default 300, Kafka's
            ``max.poll.interval.ms``; ``None``: never). Until then a keeper thread (a task on the
            asyncio client) heartbeats for it, so a slow batch keeps its partitions; after it the
            keeper leaves without committing and the other members take over from the group's
            positions (see :mod:`.liveness`).
        :raises InvalidArgumentError: an empty group id or stream list, an unknown ``auto_offset``,
            a ``max_batch`` below 1, a ``max_poll_interval`` that is not positive.
        """
        member = GroupMember(
            group_id,
            [streams] if isinstance(streams, str) else list(streams),
            consumer_id or "",
            auto_offset,
            auto_commit_interval,
            max_batch,
            handover,
            max_poll_interval,
        )
        return self._consumer_class(self._transport.run, self._transport.drive, self._core, member, idle_wait)

    #: One message to a NATS subject: :func:`.publishing.single.publish_to_subject`, run by this
    #: client's transport.
    publish_to_subject = _runs(single.publish_to_subject)

    def subscribe(
        self,
        stream: str,
        *,
        partition: int = 0,
        start_at: StartAt = StartPosition.EARLIEST,
        stop_at: StopAt = None,
        read_isr_replica: bool = False,
        resume: bool = False,
    ) -> Iterator[Message]:
        """Read messages of one partition, from ``start_at`` until ``stop_at`` (or until the caller
        stops iterating). The server's empty handshake message is swallowed.

        ``start_at``: ``StartPosition.EARLIEST`` / ``LATEST`` / ``NEW_ONLY``, an ``int`` offset, an
        aware ``datetime`` (first message at or after it) or a ``timedelta`` (that long ago).
        ``stop_at``: ``None`` (never stop), an ``int`` offset (inclusive), ``StopPosition.LATEST``
        (the newest message when subscribing: the partition's newest offset, read as it starts) or an
        aware ``datetime``. A stop that retention has removed ends the iteration at the first message
        past it, which on a log emptied by retention means waiting for the next message.

        Reaching the stop position, or the end of a read-only partition, ends the iteration cleanly.
        After a transient failure (connection lost, broker restarted, leader changed) the client
        resubscribes from the last delivered offset + 1 — no gap, no duplicate — for up to
        ``resubscribe_wait`` seconds before giving up.

        :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist (or was
            deleted while subscribed).
        :raises PartitionPausedError: the partition is paused and ``resume`` is false.
        :raises UnavailableError: / :raises NotLeaderError: no broker served the partition within the
            wait.
        :raises InvalidArgumentError: bad positions (e.g. a stop offset before the start).
        """
        return self._transport.drive(
            subscription.subscribe(
                self._core,
                stream,
                partition=partition,
                start_at=start_at,
                stop_at=stop_at,
                read_isr_replica=read_isr_replica,
                resume=resume,
            )
        )

    def subscribe_columns(
        self,
        stream: str,
        *,
        partition: int = 0,
        start_at: StartAt = StartPosition.EARLIEST,
        stop_at: StopAt = None,
        rows: int = DEFAULT_COLUMN_ROWS,
        read_isr_replica: bool = False,
        resume: bool = False,
    ) -> Iterator[MessageColumns]:
        """:meth:`subscribe`, with the messages handed over ``rows`` at a time as columns
        (:class:`~.column_subscription.MessageColumns`: lists of offsets, keys, values, timestamps
        and indexes into the batch's distinct header sets) instead of a :class:`Message` each: for
        readers that build columnar data. A batch is delivered once it is full, holds the stop
        offset, or the subscription ends; a subscription that never ends delivers only full batches.

        Same positions, resubscription and errors as :meth:`subscribe`.

        :raises InvalidArgumentError: ``rows`` is not an int >= 1 (when iteration starts).
        """
        return self._transport.drive(
            column_subscription.subscribe_columns(
                self._core,
                stream,
                partition=partition,
                start_at=start_at,
                stop_at=stop_at,
                rows=rows,
                read_isr_replica=read_isr_replica,
                resume=resume,
            )
        )

    def fetch_metadata(self, streams: Sequence[str] | None = None) -> Metadata:
        """Ask the cluster for its brokers and streams (all streams, or only ``streams``); always goes
        to the server and refreshes the client's cache. Streams that do not exist are absent from the
        result.

        :raises UnavailableError: no broker could be reached.
        """
        return self._transport.run(operations.fetch_metadata(self._core, streams))

    def fetch_partition_metadata(self, stream: str, partition: int = 0) -> PartitionInfo:
        """Ask the partition's leader for the partition's state (offsets, ISR, paused, read-only).

        :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist.
        :raises PartitionPausedError: the partition is paused (the server does not answer for it).
        :raises UnavailableError: no broker could be reached.
        """
        return self._transport.run(operations.fetch_partition_metadata(self._core, stream, partition))

    def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        """Store ``offset`` as the position of cursor ``cursor_id`` on ``stream``/``partition``.

        Sent to the leader of the cursors-stream partition that owns the cursor (any broker when the
        cluster's metadata shows no cursors stream).

        :raises InvalidArgumentError: an empty cursor id or stream.
        :raises NotLeaderError: the owning partition's leader could not be found in time.
        :raises UnavailableError: no broker could be reached.
        """
        return self._transport.run(cursors.set_cursor(self._core, cursor_id, stream, partition, offset))

    def fetch_cursor(self, cursor_id: str, stream: str, partition: int) -> int:
        """The offset stored for cursor ``cursor_id`` on ``stream``/``partition``; -1 if never set.

        Read only once the owning cursors partition's leader has committed what it
        holds: asked before, Liftbridge can answer an older position and keep answering it (see
        docs/reading-positions.md). Routed like :func:`set_cursor`.

        :raises InvalidArgumentError: an empty cursor id or stream.
        :raises NotLeaderError: the owning partition's leader could not be found in time.
        :raises UnavailableError: no broker could be reached.
        :raises UnsettledCursorError: that leader did not commit what it holds within
            ``CURSORS_SETTLE_WAIT`` (30 s); nothing was read.
        """
        return self._transport.run(cursors.fetch_cursor(self._core, cursor_id, stream, partition))

    def fetch_group_metadata(self, group_ids: Sequence[str]) -> dict[str, group_roster.GroupInfo | None]:
        """Each consumer group's coordinator and epoch (a :class:`~.group_roster.GroupInfo`), or
        ``None`` for a group the cluster does not know (no members). Liftbridge lists neither the
        groups nor their members: see :mod:`.group_roster` for the members.

        :raises UnavailableError: no broker could be reached.
        """
        return self._transport.run(group_roster.fetch_group_metadata(self._core, group_ids))

    def close(self) -> None:
        """Close every channel and the NATS connection; idempotent. Open subscriptions end with an error."""
        self._transport.close()

    def __enter__(self) -> LiftbridgeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
