"""Immutable value types and enums of the client's public API.

Nothing here is a protobuf or gRPC object: the client converts every server answer into these
frozen dataclasses before it reaches the caller, so callers never depend on generated code.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from airflow_provider_liftbridge.codec import EncodedHeaders

__all__ = [
    "Ack",
    "AckError",
    "AckPolicy",
    "BrokerInfo",
    "Message",
    "Metadata",
    "PartitionInfo",
    "Record",
    "StartPosition",
    "StopPosition",
    "StreamInfo",
    "TlsConfig",
]

#: The headers of every message that has none (shared: it is read-only).
EMPTY_HEADERS: Mapping[str, bytes] = MappingProxyType({})


def _frozen_map(value: Mapping[str, bytes] | None) -> Mapping[str, bytes]:
    """Copy a mapping into a read-only view so a frozen dataclass stays immutable (headers that
    carry their encoding are read-only already, and kept as they are so the encoding travels)."""
    if value.__class__ is EncodedHeaders:
        return value  # not None: checked just above
    return MappingProxyType(dict(value)) if value else EMPTY_HEADERS


class AckPolicy(enum.IntEnum):
    """When the server acknowledges a publish (values are the wire values)."""

    #: Once the partition leader has written the message to its log (the server's default).
    LEADER = 0
    #: Once every in-sync replica has written it.
    ALL = 1
    #: Never: fire and forget, no ack comes back.
    NONE = 2


class AckError(enum.IntEnum):
    """``Ack.ack_error``: why a partition refused a message (``OK`` when it did not)."""

    OK = 0
    UNKNOWN = 1
    INCORRECT_OFFSET = 2
    TOO_LARGE = 3
    ENCRYPTION = 4


class StartPosition(enum.Enum):
    """Named start positions of :meth:`LiftbridgeClient.subscribe` (an ``int`` offset, a
    ``datetime`` or a ``timedelta`` ago are the other ways to say where to start)."""

    #: The oldest message still in the partition.
    EARLIEST = "earliest"
    #: The newest message in the partition (it is delivered).
    LATEST = "latest"
    #: Only messages published after the subscription started.
    NEW_ONLY = "new_only"


class StopPosition(enum.Enum):
    """Named stop positions of :meth:`LiftbridgeClient.subscribe` (an ``int`` offset or a
    ``datetime`` are the other ways to say where to stop)."""

    #: The newest message at the time the subscription starts.
    LATEST = "latest"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """TLS settings of the gRPC channels.

    :param ca_file: PEM file of the certificate authority that signed the brokers' certificates
        (``None``: the system's roots).
    :param cert_file: PEM client certificate, for mutual TLS (needs ``key_file``).
    :param key_file: PEM private key of ``cert_file``.
    :param server_name: the name to check the broker certificate against, when it differs from
        the host the client connects to (e.g. connecting by IP address).
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class Record:
    """One message to publish with :meth:`LiftbridgeClient.publish_many`.

    :param value: the payload.
    :param key: the message key (used by key partitioning and log compaction).
    :param headers: message headers.
    :param partition: the partition; when set it wins over the call's partition and partitioner.
    :param expected_offset: the offset this message must get, on streams created with optimistic
        concurrency control (``-1``: no check for this message).
    :param correlation_id: echoed in the ack; must be unique within one ``publish_many`` call.
    """

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] | None = None
    partition: int | None = None
    expected_offset: int | None = None
    correlation_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", _frozen_map(self.headers) if self.headers else None)

    @classmethod
    def of_read_only(
        cls,
        value: bytes,
        key: bytes | None,
        headers: Mapping[str, bytes] | None,
        partition: int | None,
        expected_offset: int | None = None,
    ) -> Record:
        """A record whose ``headers`` are read-only already and not empty
        (:class:`~airflow_provider_liftbridge.codec.EncodedHeaders`, a ``MappingProxyType`` nobody
        else can change) or ``None``: kept as they are, where the constructor copies them. For
        publishers that build a record per input record (exactly-once)."""
        set_value, set_key, set_headers, set_partition, set_offset, set_correlation_id = _RECORD_SETTERS
        record: Record = object.__new__(Record)
        set_value(record, value)
        set_key(record, key)
        set_headers(record, headers)
        set_partition(record, partition)
        set_offset(record, expected_offset)
        set_correlation_id(record, None)
        return record


# Slot setters of Record (its frozen __setattr__ refuses plain assignment), for of_read_only.
_RECORD_SETTERS = tuple(getattr(Record, f.name).__set__ for f in fields(Record))


@dataclass(frozen=True, slots=True)
class Ack:
    """The server's acknowledgement of a published message.

    Timestamps are nanoseconds since the epoch. ``partition`` is parsed from ``msg_subject``
    (``subject`` is partition 0, ``subject.N`` is partition N).
    """

    stream: str
    partition: int
    partition_subject: str
    msg_subject: str
    offset: int
    ack_inbox: str
    correlation_id: str
    ack_policy: AckPolicy
    reception_timestamp: int
    commit_timestamp: int
    ack_error: AckError = AckError.OK


@dataclass(frozen=True, slots=True)
class Message:
    """A message delivered by a subscription. ``timestamp`` is nanoseconds since the epoch."""

    stream: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp: int
    subject: str
    reply_subject: str
    headers: Mapping[str, bytes] = field(default_factory=lambda: EMPTY_HEADERS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", _frozen_map(self.headers))


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """State of one partition. ``high_watermark`` and ``newest_offset`` are ``-1`` when it is
    empty; they are offsets of the last committed / last written message, not counts."""

    stream: str
    id: int
    leader: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    high_watermark: int
    newest_offset: int
    paused: bool
    readonly: bool
    first_message_timestamp: int
    latest_message_timestamp: int


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """A stream and its partitions (keyed by partition id)."""

    name: str
    subject: str
    creation_timestamp: int
    partitions: Mapping[int, PartitionInfo]

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", MappingProxyType(dict(self.partitions)))


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """One broker of the cluster."""

    id: str
    host: str
    port: int
    partition_count: int
    leader_count: int

    @property
    def address(self) -> str:
        """``host:port``, as the client dials it."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Metadata:
    """The cluster's brokers and the requested streams (streams that do not exist are absent)."""

    brokers: tuple[BrokerInfo, ...]
    streams: Mapping[str, StreamInfo]

    def __post_init__(self) -> None:
        object.__setattr__(self, "streams", MappingProxyType(dict(self.streams)))
