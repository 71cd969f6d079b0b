"""The sans-I/O core shared by the sync and asyncio clients.

Holds what does not depend on how bytes move: request building, protobuf-to-value conversion,
error mapping, the retry/backoff policy, broker cycling and the metadata cache. The operations
in :mod:`._ops` are written once against it; :mod:`.sync_client` and :mod:`.async_client` only
execute their effects.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .errors import (
    AckTimeoutError,
    EncryptionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeError,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    PermissionDeniedError,
    ReadonlyPartitionError,
    RequestTimeoutError,
    ServerError,
    StreamExistsError,
    UnavailableError,
)
from .partitioners import partition_for_key
from .types import (
    EMPTY_HEADERS,
    Ack,
    AckError,
    AckPolicy,
    BrokerInfo,
    Message,
    Metadata,
    PartitionInfo,
    StartPosition,
    StopPosition,
    StreamInfo,
)

StartAt = StartPosition | int | datetime | timedelta
StopAt = StopPosition | int | datetime | None

#: The internal stream whose partitions hold the cursors; each cursor lives in one of them.
CURSORS_STREAM = "__cursors"

#: How long the client trusts that the cluster has no cursors stream in its metadata before
#: asking again, in seconds (a cluster without one takes cursor calls on any broker).
CURSORS_RECHECK = 30.0

#: Calls whose repetition cannot change the outcome: retried on UNAVAILABLE without a second thought.
IDEMPOTENT = frozenset(
    {"FetchMetadata", "FetchPartitionMetadata", "FetchCursor", "SetCursor", "PauseStream", "SetStreamReadonly"}
)


class RpcFailure(Exception):
    """A failed call as the core sees it: a status code and the server's message.

    Transports raise it (with the transport's own error as ``__cause__``) so the core never
    touches gRPC error objects.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def of(cls, exc: grpc.RpcError) -> RpcFailure:
        """The failure of a gRPC error (sync or asyncio), with the error as its ``__cause__``."""
        failure = cls(exc.code(), exc.details() or "")
        failure.__cause__ = exc
        return failure


class ReadTimeout(Exception):
    """A read on a stream did not produce anything within its timeout."""


# ---------------------------------------------------------------------------------------------
# Addresses, TLS-free config, retry policy
# ---------------------------------------------------------------------------------------------


def parse_brokers(brokers: str | Sequence[str]) -> list[str]:
    """Normalise ``"h:p"``, ``"h1:p1,h2:p2"`` or a list of those into a list of ``host:port``.

    :raises InvalidArgumentError: no address, or one without a numeric port.
    """
    items = brokers.split(",") if isinstance(brokers, str) else [b for part in brokers for b in part.split(",")]
    out: list[str] = []
    for raw in items:
        addr = raw.strip()
        if not addr:
            continue
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgumentError(f"broker address {addr!r} is not host:port; write it like '127.0.0.1:9292'")
        if addr not in out:
            out.append(addr)
    if not out:
        raise InvalidArgumentError(f"no broker address in {brokers!r}; give at least one 'host:port'")
    return out


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently UNAVAILABLE calls are retried.

    :param max_retries: retries after the first attempt (0: no retry).
    :param backoff_base: the first wait, in seconds; doubled per retry.
    :param backoff_max: the longest wait, in seconds.
    """

    max_retries: int = 5
    backoff_base: float = 0.05
    backoff_max: float = 2.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """The wait before retry number ``attempt`` (1-based): exponential, with jitter in [50%, 100%]."""
        cap = min(self.backoff_max, self.backoff_base * 2.0 ** max(0, attempt - 1))
        return cap * (0.5 + rng.random() / 2)


class MetadataCache:
    """What the client last learned about brokers and streams; thread-safe, replaced wholesale."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._brokers: dict[str, BrokerInfo] = {}
        self._streams: dict[str, StreamInfo] = {}

    def update(self, md: Metadata, requested: Sequence[str] | None) -> None:
        """Merge a FetchMetadata answer. Requested streams absent from it are forgotten."""
        with self._lock:
            self._brokers = {b.id: b for b in md.brokers}
            if not requested:
                self._streams = dict(md.streams)
            else:
                for name in requested:
                    self._streams.pop(name, None)
                self._streams.update(md.streams)

    def forget(self, stream: str) -> None:
        with self._lock:
            self._streams.pop(stream, None)

    def stream(self, name: str) -> StreamInfo | None:
        with self._lock:
            return self._streams.get(name)

    def broker_address(self, broker_id: str) -> str | None:
        with self._lock:
            b = self._brokers.get(broker_id)
        return b.address if b else None

    def addresses(self) -> list[str]:
        with self._lock:
            return [b.address for b in self._brokers.values()]


class ClientCore:
    """Configuration and state shared by both clients; no I/O happens here."""

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        timeout: float,
        max_retries: int,
        ack_policy: AckPolicy,
        resubscribe_wait: float,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        nats_servers: Sequence[str] = (),
    ) -> None:
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be 0 or more, got {max_retries!r}")
        if resubscribe_wait < 0:
            raise InvalidArgumentError(f"resubscribe_wait must be 0 or more seconds, got {resubscribe_wait!r}")
        self.seeds = parse_brokers(brokers)
        self.timeout = float(timeout)
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max)
        self.ack_policy = AckPolicy(ack_policy)
        self.resubscribe_wait = float(resubscribe_wait)
        self.cache = MetadataCache()
        #: NATS URLs: when given, ``publish_many`` takes the NATS-direct bulk path (see ``bulk``).
        self.nats_servers: tuple[str, ...] = tuple(nats_servers)
        self.rng = random.Random()
        #: When metadata last showed no cursors stream (monotonic seconds), or None.
        self.cursors_absent_since: float | None = None
        self._good = 0  # index (in known_addresses()) of the broker that answered last
        self._lock = threading.Lock()

    # --- broker cycling ---------------------------------------------------------------------

    def known_addresses(self) -> list[str]:
        """Seed brokers first, then brokers learned from metadata."""
        out = list(self.seeds)
        out.extend(a for a in self.cache.addresses() if a not in out)
        return out

    def address_for_attempt(self, attempt: int, preferred: str | None = None) -> str:
        """The broker to try on attempt ``attempt`` (0-based): the preferred one first (e.g. a
        leader), then the last broker that answered, then the others in turn."""
        addrs = self.known_addresses()
        if preferred is not None:
            if attempt == 0:
                return preferred
            attempt -= 1
        with self._lock:
            start = self._good
        return addrs[(start + attempt) % len(addrs)]

    def mark_good(self, address: str) -> None:
        addrs = self.known_addresses()
        if address in addrs:
            with self._lock:
                self._good = addrs.index(address)

    def backoff(self, attempt: int) -> float:
        return self.retry.backoff(attempt, self.rng)

    def call_timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.timeout
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return float(timeout)

    def resolve_ack_policy(self, ack_policy: AckPolicy | None) -> AckPolicy:
        return self.ack_policy if ack_policy is None else AckPolicy(ack_policy)

    # --- routing ----------------------------------------------------------------------------

    def partition_info(self, stream: str, partition: int) -> PartitionInfo | None:
        info = self.cache.stream(stream)
        return info.partitions.get(partition) if info else None

    def cursors_partition(self, cursor_id: str, stream: str, partition: int) -> int | None:
        """The partition of the cursors stream that owns cursor (``cursor_id``, ``stream``,
        ``partition``), as the server and the Go client compute it: CRC-32 (IEEE) of
        ``"<cursor_id>,<stream>,<partition>"`` modulo the cursors stream's partition count.
        ``None`` when the cache does not know the cursors stream."""
        info = self.cache.stream(CURSORS_STREAM)
        if info is None or not info.partitions:
            return None
        return partition_for_key(f"{cursor_id},{stream},{partition}".encode(), len(info.partitions))

    def cursors_unknown(self) -> bool:
        """True when the cursors stream should be looked up: not cached, and not found absent
        within the last :data:`CURSORS_RECHECK` seconds."""
        if self.cache.stream(CURSORS_STREAM) is not None:
            return False
        absent = self.cursors_absent_since
        return absent is None or time.monotonic() - absent >= CURSORS_RECHECK

    def route(self, stream: str, partition: int, *, read_isr_replica: bool = False) -> str | None:
        """The address serving ``stream``/``partition``: its leader, or a random in-sync replica
        when ``read_isr_replica``; ``None`` when the cache cannot tell."""
        part = self.partition_info(stream, partition)
        if part is None:
            return None
        candidates = [part.leader]
        if read_isr_replica and part.isr:
            candidates = [self.rng.choice(part.isr)]
        for broker_id in candidates:
            addr = self.cache.broker_address(broker_id)
            if addr:
                return addr
        return None


# ---------------------------------------------------------------------------------------------
# Request building
# ---------------------------------------------------------------------------------------------


def _check_name(what: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {value!r}")


def _check_partition(partition: int) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
        raise InvalidArgumentError(f"partition must be an int >= 0, got {partition!r}")
    return partition


def _ms(what: str, value: timedelta | None) -> api_pb2.NullableInt64 | None:
    # The server takes these durations in milliseconds (the Go client sends Duration.Milliseconds()).
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise InvalidArgumentError(f"{what} must be a datetime.timedelta, got {value!r}")
    return api_pb2.NullableInt64(value=value // timedelta(milliseconds=1))


def build_create_stream(
    subject: str,
    name: str,
    *,
    partitions: int,
    replication_factor: int,
    group: str | None,
    retention_max_bytes: int | None,
    retention_max_messages: int | None,
    retention_max_age: timedelta | None,
    cleaner_interval: timedelta | None,
    segment_max_bytes: int | None,
    segment_max_age: timedelta | None,
    compact_enabled: bool | None,
    compact_max_goroutines: int | None,
    auto_pause_time: timedelta | None,
    auto_pause_disable_if_subscribers: bool | None,
    min_isr: int | None,
    optimistic_concurrency_control: bool | None,
    encryption: bool | None,
) -> api_pb2.CreateStreamRequest:
    """Build a ``CreateStreamRequest``; unset options stay unset so the server's defaults apply.

    :raises InvalidArgumentError: an empty name or subject, a negative partition count.
    """
    _check_name("subject", subject)
    _check_name("name", name)
    if partitions < 0:
        raise InvalidArgumentError(f"partitions must be 0 or more (0 means 1), got {partitions}")
    i64, i32, flag = api_pb2.NullableInt64, api_pb2.NullableInt32, api_pb2.NullableBool
    return api_pb2.CreateStreamRequest(
        subject=subject,
        name=name,
        group=group or "",
        replicationFactor=replication_factor,
        partitions=partitions,
        retentionMaxBytes=None if retention_max_bytes is None else i64(value=retention_max_bytes),
        retentionMaxMessages=None if retention_max_messages is None else i64(value=retention_max_messages),
        retentionMaxAge=_ms("retention_max_age", retention_max_age),
        cleanerInterval=_ms("cleaner_interval", cleaner_interval),
        segmentMaxBytes=None if segment_max_bytes is None else i64(value=segment_max_bytes),
        segmentMaxAge=_ms("segment_max_age", segment_max_age),
        compactMaxGoroutines=None if compact_max_goroutines is None else i32(value=compact_max_goroutines),
        compactEnabled=None if compact_enabled is None else flag(value=compact_enabled),
        autoPauseTime=_ms("auto_pause_time", auto_pause_time),
        autoPauseDisableIfSubscribers=(
            None if auto_pause_disable_if_subscribers is None else flag(value=auto_pause_disable_if_subscribers)
        ),
        minIsr=None if min_isr is None else i32(value=min_isr),
        optimisticConcurrencyControl=(
            None if optimistic_concurrency_control is None else flag(value=optimistic_concurrency_control)
        ),
        encryption=None if encryption is None else flag(value=encryption),
    )


def _headers(headers: Mapping[str, bytes] | None) -> dict[str, bytes] | None:
    if not headers:
        return None
    for k, v in headers.items():
        if not isinstance(k, str) or not isinstance(v, bytes | bytearray):
            raise InvalidArgumentError(f"headers must map str to bytes; {k!r} maps to {type(v).__name__}")
    return {k: bytes(v) for k, v in headers.items()}


def _value(what: str, value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgumentError(f"{what} must be bytes, got {type(value).__name__}; encode it first")
    return bytes(value)


def _message_fields(
    value: bytes,
    key: bytes | None,
    headers: Mapping[str, bytes] | None,
    ack_policy: AckPolicy,
    ack_inbox: str | None,
    correlation_id: str | None,
) -> dict[str, Any]:
    """The fields Publish and PublishToSubject requests share, validated."""
    return {
        "key": b"" if key is None else _value("key", key),
        "value": _value("value", value),
        "headers": _headers(headers),
        "ackInbox": ack_inbox or "",
        "correlationId": correlation_id or "",
        "ackPolicy": int(ack_policy),
    }


def build_publish(
    stream: str,
    value: bytes,
    *,
    partition: int,
    key: bytes | None,
    headers: Mapping[str, bytes] | None,
    ack_policy: AckPolicy,
    expected_offset: int | None,
    ack_inbox: str | None,
    correlation_id: str | None,
) -> api_pb2.PublishRequest:
    """Build a ``PublishRequest`` (also used on the PublishAsync stream).

    ``expected_offset=None`` sends -1, "no expectation", as the Go client does.
    """
    _check_name("stream", stream)
    return api_pb2.PublishRequest(
        stream=stream,
        partition=_check_partition(partition),
        expectedOffset=-1 if expected_offset is None else expected_offset,
        **_message_fields(value, key, headers, ack_policy, ack_inbox, correlation_id),
    )


def build_publish_to_subject(
    subject: str,
    value: bytes,
    *,
    key: bytes | None,
    headers: Mapping[str, bytes] | None,
    ack_policy: AckPolicy,
    ack_inbox: str | None,
    correlation_id: str | None,
) -> api_pb2.PublishToSubjectRequest:
    _check_name("subject", subject)
    return api_pb2.PublishToSubjectRequest(
        subject=subject, **_message_fields(value, key, headers, ack_policy, ack_inbox, correlation_id)
    )


def _ns(what: str, when: datetime) -> int:
    if when.tzinfo is None:
        raise InvalidArgumentError(
            f"{what} {when!r} has no time zone; pass an aware datetime, e.g. datetime.now(timezone.utc)"
        )
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return delta // timedelta(microseconds=1) * 1000


def start_fields(start_at: StartAt, now: datetime | None = None) -> dict[str, Any]:
    """The ``SubscribeRequest`` fields of a start position.

    :raises InvalidArgumentError: not one of the accepted kinds of start position.
    """
    if isinstance(start_at, StartPosition):
        pos = {
            StartPosition.EARLIEST: api_pb2.EARLIEST,
            StartPosition.LATEST: api_pb2.LATEST,
            StartPosition.NEW_ONLY: api_pb2.NEW_ONLY,
        }[start_at]
        return {"startPosition": pos}
    if isinstance(start_at, bool):
        pass  # a bool is an int to Python, never an offset to a caller
    elif isinstance(start_at, int):
        return {"startPosition": api_pb2.OFFSET, "startOffset": start_at}
    elif isinstance(start_at, datetime):
        return {"startPosition": api_pb2.TIMESTAMP, "startTimestamp": _ns("start_at", start_at)}
    elif isinstance(start_at, timedelta):
        ref = now or datetime.now(UTC)
        return {"startPosition": api_pb2.TIMESTAMP, "startTimestamp": _ns("start_at", ref - start_at)}
    raise InvalidArgumentError(
        f"start_at must be a StartPosition, an int offset, a datetime or a timedelta ago, got {start_at!r}"
    )


def stop_fields(stop_at: StopAt) -> dict[str, Any]:
    """The ``SubscribeRequest`` fields of a stop position (``None``: read until cancelled).

    :raises InvalidArgumentError: not one of the accepted kinds of stop position.
    """
    if stop_at is None:
        return {"stopPosition": api_pb2.STOP_ON_CANCEL}
    if stop_at is StopPosition.LATEST:
        return {"stopPosition": api_pb2.STOP_LATEST}
    if isinstance(stop_at, int) and not isinstance(stop_at, bool):
        if stop_at < 0:
            raise InvalidArgumentError(f"stop_at offset must be >= 0, got {stop_at}")
        return {"stopPosition": api_pb2.STOP_OFFSET, "stopOffset": stop_at}
    if isinstance(stop_at, datetime):
        return {"stopPosition": api_pb2.STOP_TIMESTAMP, "stopTimestamp": _ns("stop_at", stop_at)}
    raise InvalidArgumentError(
        f"stop_at must be None, an int offset, StopPosition.LATEST or a datetime, got {stop_at!r}"
    )


class SubscriptionState:
    """Where a subscription is: builds each (re)subscribe request, tracks delivered offsets and
    turns delivered protobuf messages into :class:`Message` values (the :class:`~._effects.Pump`
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
        _check_name("stream", stream)
        self.stream = stream
        self.partition = _check_partition(partition)
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
    def take(self, pb: api_pb2.Message) -> Message | None:
        """Convert a message after the handshake; ``None`` for a repeat of a delivered offset."""
        offset = pb.offset
        if offset < self._next_offset:
            return None
        self._next_offset = offset + 1
        self.last_offset = offset
        if offset >= self._stop_offset:
            self.done = True
        stream, partition, offset_, key, value, timestamp, subject, reply_subject, headers = _MESSAGE_SETTERS
        message: Message = _new_object(Message)
        stream(message, self.stream)
        partition(message, self.partition)
        offset_(message, offset)
        key(message, pb.key or None)
        value(message, pb.value)
        timestamp(message, pb.timestamp)
        subject(message, pb.subject)
        reply_subject(message, pb.replySubject)
        pb_headers = pb.headers
        headers(message, _Headers(pb_headers) if pb_headers else EMPTY_HEADERS)
        return message


class _Headers(Mapping[str, bytes]):
    """A subscribed message's headers: a read-only mapping, copied out of the protobuf's map the
    first time it is used (and the protobuf released then). Copying every message's headers at
    once was the dearest part of the conversion, and most readers never look at them."""

    __slots__ = ("_copy", "_source")

    def __init__(self, source: Mapping[str, bytes]) -> None:
        self._source: Mapping[str, bytes] | None = source
        self._copy: dict[str, bytes] | None = None

    def _dict(self) -> dict[str, bytes]:
        copy = self._copy
        if copy is None:
            assert self._source is not None
            copy = self._copy = dict(self._source.items())
            self._source = None
        return copy

    def __getitem__(self, name: str) -> bytes:
        return self._dict()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())

    def __contains__(self, name: object) -> bool:
        return name in self._dict()

    def get(self, name: str, default: Any = None) -> Any:
        return self._dict().get(name, default)

    def __eq__(self, other: object) -> bool:
        return self._dict() == (dict(other.items()) if isinstance(other, Mapping) else other)

    __hash__ = None  # type: ignore[assignment]  # like a dict's

    def __repr__(self) -> str:
        return f"mappingproxy({self._dict()!r})"  # as an eagerly copied message's headers print


# ---------------------------------------------------------------------------------------------
# Conversions (protobuf -> value types)
# ---------------------------------------------------------------------------------------------


def _partition_of(partition_subject: str, msg_subject: str) -> int:
    if msg_subject.startswith(partition_subject + "."):
        suffix = msg_subject[len(partition_subject) + 1 :]
        if suffix.isdigit():
            return int(suffix)
    return 0


# The NATS bulk path converts tens of thousands of acks per second, so this is written for speed:
# dict lookups instead of calling the enum classes (several times dearer), and the frozen
# dataclass's slots set directly — what its generated __init__ does through object.__setattr__,
# at two thirds of the cost. The setters follow the field order of Ack.
_ACK_ERRORS: dict[int, AckError] = {e.value: e for e in AckError}
_ACK_POLICIES: dict[int, AckPolicy] = {p.value: p for p in AckPolicy}
_ACK_SETTERS = tuple(getattr(Ack, f.name).__set__ for f in fields(Ack))
_MESSAGE_SETTERS = tuple(getattr(Message, f.name).__set__ for f in fields(Message))
_NO_OFFSET_LIMIT = 1 << 64  # beyond any int64 offset
_new_object = object.__new__


def ack_from_pb(pb: api_pb2.Ack) -> Ack:
    """Convert an ``Ack`` protobuf (gRPC or ack-inbox) into :class:`Ack`."""
    (stream, partition, partition_subject, msg_subject, offset, ack_inbox, correlation_id, ack_policy,
     reception, commit, ack_error) = _ACK_SETTERS  # fmt: skip
    ack: Ack = _new_object(Ack)
    ps, ms = pb.partitionSubject, pb.msgSubject
    stream(ack, pb.stream)
    partition(ack, 0 if ps == ms else _partition_of(ps, ms))
    partition_subject(ack, ps)
    msg_subject(ack, ms)
    offset(ack, pb.offset)
    ack_inbox(ack, pb.ackInbox)
    correlation_id(ack, pb.correlationId)
    ack_policy(ack, _ACK_POLICIES.get(pb.ackPolicy, AckPolicy.LEADER))
    reception(ack, pb.receptionTimestamp)
    commit(ack, pb.commitTimestamp)
    ack_error(ack, _ACK_ERRORS.get(pb.ackError, AckError.UNKNOWN))
    return ack


def partition_from_pb(stream: str, pb: api_pb2.PartitionMetadata) -> PartitionInfo:
    ts = pb.messagesReceivedTimestamps
    return PartitionInfo(
        stream=stream,
        id=pb.id,
        leader=pb.leader,
        replicas=tuple(pb.replicas),
        isr=tuple(pb.isr),
        high_watermark=pb.highWatermark,
        newest_offset=pb.newestOffset,
        paused=pb.paused,
        readonly=pb.readonly,
        first_message_timestamp=ts.firstTimestamp,
        latest_message_timestamp=ts.latestTimestamp,
    )


def metadata_from_pb(pb: api_pb2.FetchMetadataResponse) -> Metadata:
    brokers = tuple(
        BrokerInfo(id=b.id, host=b.host, port=b.port, partition_count=b.partitionCount, leader_count=b.leaderCount)
        for b in pb.brokers
    )
    streams: dict[str, StreamInfo] = {}
    for sm in pb.streamMetadata:
        if sm.error != api_pb2.StreamMetadata.OK:
            continue  # UNKNOWN_STREAM: the caller sees it as absent
        parts = {pid: partition_from_pb(sm.name, p) for pid, p in sm.partitions.items()}
        streams[sm.name] = StreamInfo(sm.name, sm.subject, sm.creationTimestamp, parts)
    return Metadata(brokers=brokers, streams=streams)


# ---------------------------------------------------------------------------------------------
# Error mapping
# ---------------------------------------------------------------------------------------------

_PUBLISH_METHODS = frozenset({"Publish", "PublishAsync", "PublishToSubject"})


def _what(stream: str | None, partition: int | None) -> str:
    if stream is None:
        return "the request"
    return f"stream {stream!r}" if partition is None else f"stream {stream!r} partition {partition}"


def _not_found(stream: str | None, partition: int | None, said: str, partition_named: bool) -> LiftbridgeError:
    if partition_named and partition is not None:
        return NoSuchPartitionError(
            f"{_what(stream, partition)} does not exist{said}; check the stream's partition count."
        )
    return NoSuchStreamError(f"{_what(stream, None)} does not exist{said}; create it first or check the name.")


def _incorrect_offset(what: str, said: str = "") -> IncorrectOffsetError:
    return IncorrectOffsetError(
        f"{what} refused the message: expected_offset is not the next offset{said}; fetch the partition's "
        "newest_offset and publish with newest_offset + 1."
    )


def map_rpc_error(
    method: str,
    failure: RpcFailure,
    *,
    stream: str | None = None,
    partition: int | None = None,
    attempts: int = 1,
    tried: Sequence[str] = (),
    timeout: float | None = None,
) -> LiftbridgeError:
    """Turn a failed call into the typed error a caller should see.

    The server's own message is quoted; the status code only chooses the class.

    :param timeout: the deadline the call had, in seconds, quoted in timeout errors.
    """
    code, said = failure.code, failure.details
    low = said.lower()
    what = _what(stream, partition)
    server = f' (server said: "{said}")' if said else ""
    within = f"within {timeout:g} s" if timeout is not None else "within the timeout"
    C = grpc.StatusCode
    if code == C.ALREADY_EXISTS:
        return StreamExistsError(f"{what} already exists{server}; choose another name or delete it first.")
    if code == C.NOT_FOUND:
        return _not_found(stream, partition, server, "partition" in low and "stream" not in low)
    if code == C.FAILED_PRECONDITION:
        if "pause" in low:
            return PartitionPausedError(f"{what} is paused{server}; publish to it or subscribe with resume=True.")
        if "readonly" in low or "read-only" in low or (method in _PUBLISH_METHODS and "leader" not in low):
            return ReadonlyPartitionError(
                f"{what} is read-only{server}; it accepts no more messages (set_stream_readonly(..., readonly=False)"
                " to reopen it)."
            )
        return NotLeaderError(f"no leader found for {what}{server}; the cluster may be electing one: retry later.")
    if code == C.UNKNOWN and "offset" in low:
        return _incorrect_offset(what, server)
    if code == C.DEADLINE_EXCEEDED:
        if "deadline exceeded" in low:
            server = ""  # gRPC's own client-side text ("Stream removed (Deadline Exceeded)"), not the server's
        if method in ("Publish", "PublishToSubject"):
            return AckTimeoutError(
                f"no ack for the message to {what} {within}{server}; it may or may not be stored. Raise"
                " timeout=, or publish again only if a duplicate is acceptable."
            )
        return RequestTimeoutError(f"{method} on {what} did not finish {within}{server}; raise timeout=.")
    if code == C.RESOURCE_EXHAUSTED and "larger than max" in low:
        # gRPC's own message-size limit (client or server side), not a Liftbridge status.
        return MessageTooLargeError(
            f"{method} to {what} refused: the message is over gRPC's size limit{server}; split the record, or"
            " publish over NATS with a larger max_payload."
        )
    if code == C.UNAVAILABLE:
        brokers = ", ".join(tried) if tried else "the known brokers"
        return UnavailableError(
            f"{method} failed: no broker reachable after {attempts} attempt(s) ({brokers}); check that the"
            " brokers are running and the addresses are right, or raise max_retries."
        )
    if code == C.INVALID_ARGUMENT:
        return InvalidArgumentError(f"{method} on {what} refused an argument as invalid{server}; fix the argument.")
    if code in (C.PERMISSION_DENIED, C.UNAUTHENTICATED):
        return PermissionDeniedError(f"{method} on {what} was refused{server}; check credentials and permissions.")
    return ServerError(f"{method} on {what} failed{server}; check the broker's logs.")


def map_async_error(code: int, message: str, *, stream: str, partition: int) -> LiftbridgeError:
    """Map a PublishAsync ``asyncError`` to a typed error."""
    E = api_pb2.PublishAsyncError
    said = f' (server said: "{message}")' if message else ""
    what = _what(stream, partition)
    if code == E.NOT_FOUND:
        low = message.lower()
        return _not_found(stream, partition, said, "partition" in low and "stream" not in low)
    if code == E.READONLY:
        return ReadonlyPartitionError(f"{what} is read-only{said}; it accepts no more messages.")
    if code == E.INCORRECT_OFFSET:
        return _incorrect_offset(what, said)
    if code == E.BAD_REQUEST:
        return InvalidArgumentError(f"{what} refused the message as invalid{said}; fix the record.")
    if code == E.ENCRYPTION_FAILED:
        return EncryptionError(f"{what} could not encrypt the message{said}; check the broker's encryption keys.")
    if code == E.PERMISSION_DENIED:
        return PermissionDeniedError(f"publishing to {what} was refused{said}; check permissions.")
    return ServerError(f"publishing to {what} failed{said}; check the broker's logs.")


def check_ack(ack: Ack) -> Ack:
    """Return ``ack`` or raise the typed error for its ``ack_error``."""
    if ack.ack_error == AckError.OK:
        return ack
    what = _what(ack.stream, ack.partition)
    if ack.ack_error == AckError.INCORRECT_OFFSET:
        raise _incorrect_offset(what)
    if ack.ack_error == AckError.TOO_LARGE:
        raise MessageTooLargeError(f"{what} refused the message as too large; split it or raise the server's limit.")
    if ack.ack_error == AckError.ENCRYPTION:
        raise EncryptionError(f"{what} could not encrypt the message; check the broker's encryption keys.")
    raise ServerError(f"{what} refused the message for an unknown reason; check the broker's logs.")


def is_end_of_stream(failure: RpcFailure) -> bool:
    """RESOURCE_EXHAUSTED on Subscribe: the stop position or the end of a read-only partition."""
    return bool(failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED)


def is_transient(failure: RpcFailure) -> bool:
    """A lost connection or a broker going away: worth retrying on another broker.

    A broker stopped mid-call shows up as UNAVAILABLE, CANCELLED, INTERNAL ("Internal error from
    Core", RST_STREAM) or UNKNOWN ("Stream removed"), depending on the moment and the transport.
    """
    C = grpc.StatusCode
    if failure.code in (C.UNAVAILABLE, C.CANCELLED, C.INTERNAL):
        return True
    low = failure.details.lower()
    return bool(failure.code == C.UNKNOWN and ("rst_stream" in low or "stream removed" in low or "eof" in low))


def now_monotonic() -> float:
    return time.monotonic()
