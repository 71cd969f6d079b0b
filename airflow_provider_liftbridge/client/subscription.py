"""Subscriptions: where a subscription is (:class:`SubscriptionState`) and the ``subscribe``
operation that (re)subscribes to a partition's leader after a transient failure."""

from __future__ import annotations

import time
from types import MappingProxyType
from typing import TYPE_CHECKING

from airflow_provider_liftbridge._proto import api_pb2

from .compression import COMPRESSION_HEADER, decompress_value
from .conversion import MESSAGE_SETTERS, LazyHeaders
from .effects import END, Cancel, Emit, Op, OpenStream, Pump, Read, ReadTimeout, RpcFailure, Sleep
from .error_mapping import map_rpc_error
from .errors import NoSuchPartitionError, NoSuchStreamError, NotLeaderError, PartitionPausedError, UnavailableError
from .operations import ROUTING_ERRORS, ensure_partition, fetch_partition_metadata, missing_confirmed_op
from .requests import StartAt, StopAt, check_name, check_partition, start_fields, stop_fields
from .retry import is_end_of_stream, is_transient
from .routing import ClientCore
from .types import EMPTY_HEADERS, Message, StartPosition

if TYPE_CHECKING:
    from collections.abc import Mapping

_NO_OFFSET_LIMIT = 1 << 64  # beyond any int64 offset
_new_object = object.__new__


class SubscriptionState:
    """Where a subscription is: builds each (re)subscribe request, tracks delivered offsets and
    turns delivered protobuf messages into :class:`Message` values (the :class:`~.effects.Pump`
    sink of a subscription).

    After a failure the next request starts at the last delivered offset + 1, so a resubscription
    neither skips nor repeats a message.
    """

    def __init__(
        self,
        stream: str,
        partition: int,
        start_at: StartAt,
        stop_at: StopAt,
        *,
        read_isr_replica: bool,
        resume: bool,
    ) -> None:
        check_name("stream", stream)
        self.stream = stream
        self.partition = check_partition(partition)
        self._start = start_fields(start_at)  # a timedelta is resolved once, now
        self._stop = stop_fields(stop_at)
        stop_offset: int | None = self._stop.get("stopOffset")
        # Plain ints, so the per-message checks in take() are single comparisons.
        self._stop_offset = _NO_OFFSET_LIMIT if stop_offset is None else stop_offset
        self._next_offset = -_NO_OFFSET_LIMIT  # the lowest offset not delivered yet
        self.read_isr_replica = read_isr_replica
        self.resume = resume
        self.last_offset: int | None = None
        #: True once the stop offset has been delivered (no need to resubscribe).
        self.done = False
        # (subject, reply subject, their headers) of the last message that carried only the server's
        # two headers, checked entry by entry (see take).
        self._server_headers: tuple[str, str, Mapping[str, bytes]] = ("", "", EMPTY_HEADERS)

    def request(self) -> api_pb2.SubscribeRequest:
        start = (
            self._start
            if self.last_offset is None
            else {"startPosition": api_pb2.OFFSET, "startOffset": self.last_offset + 1}
        )
        return api_pb2.SubscribeRequest(
            stream=self.stream,
            partition=self.partition,
            readISRReplica=self.read_isr_replica,
            resume=self.resume,
            **start,
            **self._stop,
        )

    @property
    def stops_at_latest(self) -> bool:
        """True while the stop is ``StopPosition.LATEST`` with no offset known for it yet."""
        return self._stop_offset == _NO_OFFSET_LIMIT and self._stop.get("stopPosition") == api_pb2.STOP_LATEST

    def pin_latest(self, newest_offset: int) -> None:
        """End at the first message past ``newest_offset``, the partition's newest offset read just
        before subscribing (-1, an empty partition: the server's "Stream is empty" answers).

        The request keeps ``STOP_LATEST``: a stop offset sent instead would be refused as before the
        start when a record lands between this read and the subscription on an emptied log (EARLIEST
        is then that record). The server's LATEST is never below this offset, so the server ends
        the subscription at this one or the client does, at the first message past it."""
        if newest_offset >= 0:
            self._stop_offset = newest_offset

    @property
    def finished(self) -> bool:
        """True once the stop offset has been delivered (no need to resubscribe)."""
        return self.done

    def on_message(self, pb: api_pb2.Message, *, first: bool) -> Message | None:
        """Convert a delivered message; ``None`` for the empty handshake that opens every
        subscription (``first``: this is the stream's first message) and for a repeat of an
        offset already delivered, which a resubscription to a lagging replica could send."""
        if first and pb.ByteSize() == 0:
            return None
        return self.take(pb)

    # Every subscribed message passes through here, so it is written for speed (see ack_from_pb):
    # the Message's slots are set directly, the stream and partition are the subscription's own,
    # and messages without headers share one empty mapping.
    #
    # Liftbridge stores every message with the headers ``subject`` and ``reply`` (its own, replacing
    # any the publisher sent) and fills the Message's ``subject`` / ``replySubject`` fields from them
    # (server/partition.go). So a message with exactly two headers and the same two fields as one
    # whose two headers were checked to be just ``subject`` and ``reply`` with those values carries
    # the same headers: such messages share one read-only mapping. That is almost every message, and
    # sharing keeps no protobuf alive per message (a LazyHeaders does, until it is read): against a
    # real Liftbridge, a batch of 1,000 held messages cost ~0.9 µs per message more than one without
    # headers (bench/RESULTS.md, issue 43).
    def take(self, pb: api_pb2.Message) -> Message | None:
        """Convert a message after the handshake; ``None`` for a repeat of a delivered offset."""
        offset = pb.offset
        if offset < self._next_offset:
            return None
        if offset > self._stop_offset:
            # Past the stop offset: the server never sent that one (retention removed it) and reads
            # on, as Liftbridge does. Nothing more is in the range.
            self.done = True
            return None
        self._next_offset = offset + 1
        self.last_offset = offset
        if offset == self._stop_offset:
            self.done = True
        stream, partition, offset_, key, value, timestamp, subject, reply_subject, headers = MESSAGE_SETTERS
        message: Message = _new_object(Message)
        stream(message, self.stream)
        partition(message, self.partition)
        offset_(message, offset)
        key(message, pb.key or None)
        value(message, pb.value)
        timestamp(message, pb.timestamp)
        msg_subject, msg_reply = pb.subject, pb.replySubject
        subject(message, msg_subject)
        reply_subject(message, msg_reply)
        pb_headers = pb.headers
        if not pb_headers:
            headers(message, EMPTY_HEADERS)
            return message
        if len(pb_headers) == 2:
            known_subject, known_reply, shared = self._server_headers
            if msg_subject == known_subject and msg_reply == known_reply and shared is not EMPTY_HEADERS:
                headers(message, shared)
                return message
            learned = self._learn_server_headers(pb)
            if learned is not None:
                headers(message, learned)
                return message
        headers(message, LazyHeaders(pb_headers))
        if COMPRESSION_HEADER in pb_headers:
            # Published with compression (compression.py): hand over the original value.
            original = decompress_value(pb.value, pb_headers)
            if original is not None:
                value(message, original[0])
                headers(message, LazyHeaders(original[1]) if original[1] else EMPTY_HEADERS)
        return message

    def _learn_server_headers(self, pb: api_pb2.Message) -> Mapping[str, bytes] | None:
        """The headers of ``pb`` as a mapping to share with the next messages of the same subject and
        reply subject, when they are just the server's ``subject`` and ``reply`` with the values of
        those fields; ``None`` otherwise (``pb`` gets headers of its own)."""
        subject, reply = pb.subject, pb.replySubject
        expected = {"subject": subject.encode(), "reply": reply.encode()}
        if {name: pb.headers[name] for name in pb.headers} != expected:
            return None
        shared: Mapping[str, bytes] = MappingProxyType(expected)
        self._server_headers = (subject, reply, shared)
        return shared


def _creation_timestamp(core: ClientCore, stream: str) -> int | None:
    info = core.cache.stream(stream)
    return info.creation_timestamp if info is not None and info.creation_timestamp else None


def _check_same_stream(core: ClientCore, stream: str, incarnation: int | None) -> None:
    """A resubscription continues the same stream only: one deleted and re-created under the
    same name (another creation timestamp) has offsets of its own.

    :raises NoSuchStreamError: the stream now in metadata is another incarnation.
    """
    now = _creation_timestamp(core, stream)
    if incarnation is not None and now is not None and now != incarnation:
        raise NoSuchStreamError(
            f"stream {stream!r} was deleted and re-created while subscribed (creation timestamp {incarnation} -> "
            f"{now}); the subscription ends instead of continuing in the new stream: subscribe to it again"
        )


def subscribe(
    core: ClientCore,
    stream: str,
    *,
    partition: int = 0,
    start_at: StartAt = StartPosition.EARLIEST,
    stop_at: StopAt = None,
    read_isr_replica: bool = False,
    resume: bool = False,
) -> Op[None]:
    """The operation of ``LiftbridgeClient.subscribe`` (documented there)."""
    state = SubscriptionState(stream, partition, start_at, stop_at, read_isr_replica=read_isr_replica, resume=resume)
    return (yield from follow(core, state))


def follow(core: ClientCore, state: SubscriptionState) -> Op[None]:
    """Subscribe as ``state`` asks and deliver what its ``take`` makes of each message, resubscribing
    after a transient failure (the loop of ``subscribe``, shared with :mod:`.column_subscription`)."""
    stream, partition, read_isr_replica = state.stream, state.partition, state.read_isr_replica
    give_up_at: float | None = None  # set at the first failure after a working subscription
    attempt = 0
    connected = False  # has any (re)subscription got its handshake?
    incarnation: int | None = None  # the stream's creation timestamp when the subscription first worked
    if state.stops_at_latest:
        # Liftbridge ends a subscription only on the record at its stop offset. On a log that
        # retention emptied, LATEST is an offset no record has any more and the server reads on for
        # good; with the offset known here, take() ends at the first record past it. A
        # resubscription also keeps this stop instead of asking for a later LATEST.
        info = yield from fetch_partition_metadata(core, stream, partition)
        state.pin_latest(info.newest_offset)
    while True:
        try:
            # The cache will do: on a resubscription the end of this loop has just refreshed it.
            yield from ensure_partition(core, stream, partition, refresh=False)
        except (NoSuchStreamError, NoSuchPartitionError):
            if give_up_at is None:  # only a resubscription waits for a missing stream
                raise
        address = core.route(stream, partition, read_isr_replica=read_isr_replica)
        address = address or core.address_for_attempt(attempt)
        handle = yield OpenStream(address, "Subscribe", state.request(), long_lived=True)
        try:
            pb = yield Read(handle)  # the handshake (an empty message): the subscription is on
            if pb is END:
                return
            connected, give_up_at, attempt = True, None, 0
            if incarnation is None:
                incarnation = _creation_timestamp(core, stream)
            message = state.on_message(pb, first=True)
            if message is not None:
                yield Emit(message)
            if not state.done:
                yield Pump(handle, state)  # every further message, until the stop or the stream's end
            return
        except RpcFailure as failure:
            yield Cancel(handle)
            if is_end_of_stream(failure) or state.done:
                return
            mapped = map_rpc_error("Subscribe", failure, stream=stream, partition=partition, attempts=attempt + 1)
            retryable = is_transient(failure) or isinstance(mapped, ROUTING_ERRORS)
            if not retryable:
                raise mapped from failure.__cause__
            now = time.monotonic()
            if connected and give_up_at is None:
                give_up_at = now + core.resubscribe_wait
            attempt += 1
            out_of_time = give_up_at is not None and now >= give_up_at
            out_of_tries = give_up_at is None and attempt > core.retry.max_retries
            if out_of_time or out_of_tries:
                if isinstance(mapped, UnavailableError | NotLeaderError | NoSuchStreamError | NoSuchPartitionError):
                    why = f"within {core.resubscribe_wait:g} s" if out_of_time else f"after {attempt} attempts"
                    raise type(mapped)(
                        f"subscription to stream {stream!r} partition {partition} could not be re-established {why}; "
                        f"last offset delivered: {state.last_offset}. {mapped}"
                    ) from failure.__cause__
                raise mapped from failure.__cause__
            if isinstance(mapped, PartitionPausedError):
                raise mapped from failure.__cause__
            delay = core.backoff(attempt)
            if give_up_at is not None:
                delay = max(0.0, min(delay, give_up_at - now))
            yield Sleep(delay)
            try:
                yield from ensure_partition(core, stream, partition, refresh=True)
            except (NoSuchStreamError, NoSuchPartitionError):
                # Right after a full-cluster restart the stream is missing for a while (presence.py).
                if not connected or (yield from missing_confirmed_op(core, stream, partition)):
                    raise
            except UnavailableError:
                pass  # no broker answered metadata yet: keep trying within the wait
            _check_same_stream(core, stream, incarnation)
            # Not "NotLeaderError and metadata says paused": the flag stays set after a resume
            # (Liftbridge v1.9). A paused partition answers Subscribe in words of its own, which
            # map_rpc_error turns into PartitionPausedError above.


def read_committed(
    core: ClientCore, stream: str, partition: int, first: int, last: int, wait: float
) -> Op[list[api_pb2.Message]]:
    """The committed messages of offsets ``first`` to ``last`` of a partition, as delivered
    (raw, undecoded), read once from its leader; fewer when ``wait`` seconds pass without a
    message (the rest is not committed yet) or the partition ends sooner.

    For checks that must see what a partition holds exactly as it was stored, such as which
    records of a batch without acks were stored (:mod:`.publishing.timeout_recovery`).

    :raises LiftbridgeError: the subscription failed (mapped as ``subscribe`` maps it).
    """
    address = core.route(stream, partition) or core.address_for_attempt(0)
    request = api_pb2.SubscribeRequest(stream=stream, partition=partition, **start_fields(first), **stop_fields(last))
    handle = yield OpenStream(address, "Subscribe", request)
    messages: list[api_pb2.Message] = []
    try:
        pb = yield Read(handle, wait)  # the handshake
        while pb is not END:
            if pb.ByteSize():
                messages.append(pb)
                if pb.offset >= last:
                    break
            pb = yield Read(handle, wait)
    except ReadTimeout:
        return messages  # the transport cancelled the call
    except RpcFailure as failure:
        yield Cancel(handle)
        if is_end_of_stream(failure):
            return messages
        raise map_rpc_error("Subscribe", failure, stream=stream, partition=partition) from failure.__cause__
    if pb is not END:
        yield Cancel(handle)
    return messages
