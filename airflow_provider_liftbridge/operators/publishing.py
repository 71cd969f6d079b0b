"""What every publishing operator shares: turning user values into records, publishing them in
bounded windows, checking every ack, and summarising acks into a small JSON-safe XCom value.

The summary shape (also read by ``LiftbridgeAckSensor`` and ``LiftbridgeOffsetSensor``)::

    {"stream": "orders", "count": 3, "acknowledged": 3, "ack_policy": "LEADER",
     "partitions": {"0": {"first_offset": 10, "last_offset": 12, "count": 3}}}

Partition numbers are strings because XCom values travel as JSON.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import decimal
import itertools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_liftbridge.client import (
    Ack,
    AckError,
    AckPolicy,
    KeyPartitioner,
    LiftbridgeClient,
    NoSuchStreamError,
    Partitioner,
    PublishError,
    Record,
    RoundRobinPartitioner,
    StreamInfo,
)
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.hooks.exceptions import (
    LiftbridgeArgumentError,
    LiftbridgePublishNotAcknowledgedError,
)

__all__ = [
    "PARTITIONERS",
    "PUBLISH_PATHS",
    "BatchSender",
    "NatsBatchSender",
    "PartitionRange",
    "PublishSummary",
    "build_record",
    "json_default",
    "make_partitioner",
    "open_sender",
    "publish_in_windows",
    "to_bytes",
]

#: Names accepted by the ``partitioner`` argument of the publishing operators.
PARTITIONERS: dict[str, Callable[[], Partitioner]] = {"key": KeyPartitioner, "round_robin": RoundRobinPartitioner}


def make_partitioner(name: str | None) -> Partitioner | None:
    """Build the partitioner named ``"key"`` or ``"round_robin"`` (``None``: the client's default).

    :raises LiftbridgeArgumentError: unknown name.
    """
    if name is None or name == "":
        return None
    try:
        return PARTITIONERS[name]()
    except KeyError:
        raise LiftbridgeArgumentError(
            f"partitioner {name!r} is unknown; use one of {', '.join(PARTITIONERS)} (or leave it unset)"
        ) from None


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback for the values tables and Python code commonly hold: datetimes and
    dates as ISO 8601, decimals and UUIDs as strings, bytes as base64, sets as lists."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"a value of type {type(value).__name__} cannot be published as JSON")


def to_bytes(value: Any, *, what: str = "value") -> bytes:
    """Encode a value to publish: bytes as they are, ``str`` as UTF-8, anything else as compact JSON.

    :raises LiftbridgeArgumentError: the value cannot be encoded as JSON.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=json_default).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise LiftbridgeArgumentError(f"cannot encode {what}: {exc}") from None


def _key_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    return str(value).encode("utf-8")


def build_record(
    item: Any,
    *,
    key: Any = None,
    key_field: str | None = None,
    headers: Mapping[str, Any] | None = None,
    extra_headers: Mapping[str, Any] | None = None,
) -> Record:
    """Turn one user value into a :class:`Record`.

    A :class:`Record` is taken as it is, with ``headers``/``extra_headers`` added to its own.
    Anything else becomes the value (see :func:`to_bytes`); the key is ``key`` or, for mappings,
    the value of ``key_field``.

    :param item: the value, or a ready :class:`Record`.
    :param key: a key for every record (str or bytes).
    :param key_field: the field of a mapping value to use as its key (wins over ``key``).
    :param headers: headers for every record (values str or bytes).
    :param extra_headers: per-record headers (file name, record number, ...).
    :raises LiftbridgeArgumentError: ``key_field`` is set but the value is not a mapping or lacks it.
    """
    merged: dict[str, bytes] = {}
    for source in (headers, extra_headers):
        if source:
            merged.update({str(k): _key_bytes(v) or b"" for k, v in source.items()})
    if isinstance(item, Record):
        if not merged:
            return item
        own = dict(item.headers or {})
        return Record(
            value=item.value,
            key=item.key,
            headers=merged | own,
            partition=item.partition,
            expected_offset=item.expected_offset,
            correlation_id=item.correlation_id,
        )
    record_key = _key_bytes(key)
    if key_field:
        if not isinstance(item, Mapping):
            raise LiftbridgeArgumentError(
                f"key_field {key_field!r} needs records that are mappings, got a {type(item).__name__}"
            )
        if key_field not in item:
            raise LiftbridgeArgumentError(f"key_field {key_field!r} is missing from record with fields {list(item)}")
        record_key = _key_bytes(item[key_field])
    return Record(value=to_bytes(item), key=record_key, headers=merged or None)


@dataclass
class PartitionRange:
    """First and last acknowledged offsets of one partition, and how many acks it got."""

    first_offset: int
    last_offset: int
    count: int = 1

    def add(self, offset: int) -> None:
        self.first_offset = min(self.first_offset, offset)
        self.last_offset = max(self.last_offset, offset)
        self.count += 1

    def merge(self, other: PartitionRange) -> None:
        self.first_offset = min(self.first_offset, other.first_offset)
        self.last_offset = max(self.last_offset, other.last_offset)
        self.count += other.count


@dataclass
class PublishSummary:
    """Running totals of one publish (kept small: never the acks themselves).

    :param stream: the stream published to.
    :param ack_policy: the policy used; with ``NONE`` nothing is acknowledged and offsets are unknown.
    :param producer_id: set by exactly-once publishing; ``written`` / ``skipped`` then count the
        records this try put into the stream / found there already (``count`` is their sum).
    """

    stream: str
    ack_policy: AckPolicy
    count: int = 0
    acknowledged: int = 0
    partitions: dict[int, PartitionRange] = field(default_factory=dict)
    producer_id: str | None = None
    written: int = 0
    skipped: int = 0

    def add_acks(self, acks: Sequence[Ack | None], sent: int) -> None:
        """Account for one window of ``sent`` records and the acks that came back for it.

        :raises LiftbridgePublishNotAcknowledgedError: a record has no ack (unless the policy is
            ``NONE``) or its ack reports an error.
        """
        if self.ack_policy is not AckPolicy.NONE:
            if len(acks) != sent:
                raise LiftbridgePublishNotAcknowledgedError(
                    self.stream, self.acknowledged, f"{sent} record(s) sent but {len(acks)} ack(s) came back"
                )
            for index, ack in enumerate(acks):
                if ack is None:
                    raise LiftbridgePublishNotAcknowledgedError(
                        self.stream, self.acknowledged, f"record #{self.count + index} was not acknowledged"
                    )
                if ack.ack_error != AckError.OK:
                    raise LiftbridgePublishNotAcknowledgedError(
                        self.stream,
                        self.acknowledged,
                        f"record #{self.count + index} was refused by partition {ack.partition}: "
                        f"{AckError(ack.ack_error).name}",
                    )
                self._note(ack)
        self.count += sent

    def _note(self, ack: Ack) -> None:
        self.acknowledged += 1
        current = self.partitions.get(ack.partition)
        if current is None:
            self.partitions[ack.partition] = PartitionRange(ack.offset, ack.offset)
        else:
            current.add(ack.offset)

    def merge(self, other: PublishSummary) -> None:
        """Add another summary of the same stream (e.g. one file's) to this one."""
        self.count += other.count
        self.acknowledged += other.acknowledged
        self.producer_id = self.producer_id or other.producer_id
        self.written += other.written
        self.skipped += other.skipped
        for partition, span in other.partitions.items():
            if partition in self.partitions:
                self.partitions[partition].merge(span)
            else:
                self.partitions[partition] = PartitionRange(span.first_offset, span.last_offset, span.count)

    def to_xcom(self) -> dict[str, Any]:
        """The JSON-safe summary (shape in the module docstring; exactly-once publishing adds
        ``producer_id``, ``written`` and ``skipped``)."""
        extra = (
            {"producer_id": self.producer_id, "written": self.written, "skipped": self.skipped}
            if self.producer_id is not None
            else {}
        )
        return extra | {
            "stream": self.stream,
            "count": self.count,
            "acknowledged": self.acknowledged,
            "ack_policy": self.ack_policy.name,
            "partitions": {
                str(p): {"first_offset": r.first_offset, "last_offset": r.last_offset, "count": r.count}
                for p, r in sorted(self.partitions.items())
            },
        }


def _windows(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    iterator = iter(records)
    while window := list(itertools.islice(iterator, size)):
        yield window


#: Ack wait of the NATS path when neither the operator nor the connection gives one, seconds.
DEFAULT_ACK_TIMEOUT = 10.0
#: Values of the operators' ``publish_path`` argument.
PUBLISH_PATHS = ("auto", "grpc", "nats")


class BatchSender:
    """Sends one window of records and returns their acks in input order (``[]`` with ack policy
    ``NONE``); raises ``PublishError`` like ``LiftbridgeClient.publish_many``. A context manager.

    :ivar path: ``"grpc"`` or ``"nats"``, for the log.
    """

    path = "grpc"
    #: Why the gRPC path was taken although NATS servers are known (``None``: it was not).
    fallback_reason: str | None = None

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        *,
        ack_policy: AckPolicy,
        window: int,
        partition: int | None,
        partitioner: Partitioner | None,
        timeout: float | None,
    ) -> None:
        self.client = client
        self.stream = stream
        self.ack_policy = ack_policy
        self.window = window
        self.partition = partition
        self.partitioner = partitioner
        self.timeout = timeout

    def send(self, batch: list[Record]) -> list[Ack]:
        # path="grpc": this is the gRPC sender; without it a client that knows NATS servers would
        # take the NATS path while the task log says gRPC.
        return self.client.publish_many(
            self.stream,
            batch,
            path="grpc",
            partition=self.partition,
            partitioner=self.partitioner,
            ack_policy=self.ack_policy,
            window=self.window,
            timeout=self.timeout,
        )

    def close(self) -> None:
        """Release what the sender holds (nothing for gRPC: the client is the hook's)."""

    def __enter__(self) -> BatchSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NatsBatchSender(BatchSender):
    """Sends windows as enveloped messages straight to the stream's NATS subjects, acks on an ack
    inbox (the bulk path of ADR 1). Partitions are chosen here, as ``publish_many`` would: a
    record's own partition, else ``partition``, else the partitioner, else 0.

    :param info: the stream's metadata (subject and partitions).
    :raises UnavailableError: NATS cannot be reached.
    """

    path = "nats"

    def __init__(
        self, client: LiftbridgeClient, stream: str, *, info: StreamInfo, nats_servers: Sequence[str], **options: Any
    ) -> None:
        super().__init__(client, stream, **options)
        self.subject = info.subject
        self.partition_count = max(len(info.partitions), 1)
        self.ack_timeout = float(self.timeout if self.timeout is not None else DEFAULT_ACK_TIMEOUT)
        self._loop = asyncio.new_event_loop()
        try:
            self._publisher = self._loop.run_until_complete(
                NatsPublisher.connect(nats_servers, connect_timeout=self.ack_timeout, security=client.nats_security)
            )
        except BaseException:
            self._loop.close()
            raise

    def _route(self, record: Record) -> Record:
        if record.partition is not None:
            return record
        chosen = self.partition
        if chosen is None:
            chosen = (
                self.partitioner(self.stream, record.key, record.value, self.partition_count) if self.partitioner else 0
            )
        return dataclasses.replace(record, partition=chosen)

    def send(self, batch: list[Record]) -> list[Ack]:
        routed = [self._route(record) for record in batch]
        return self._loop.run_until_complete(
            self._publisher.publish_many(
                self.subject, routed, ack_policy=self.ack_policy, window=self.window, timeout=self.ack_timeout
            )
        )

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._loop.run_until_complete(self._publisher.close())
        finally:
            self._loop.close()


def open_sender(
    client: LiftbridgeClient,
    stream: str,
    *,
    path: str,
    nats_servers: Sequence[str],
    ack_policy: AckPolicy,
    window: int,
    partition: int | None = None,
    partitioner: Partitioner | None = None,
    timeout: float | None = None,
) -> BatchSender:
    """Open the sender of ``path``: ``"grpc"`` (PublishAsync), ``"nats"`` (NATS-direct), or
    ``"auto"`` (NATS when ``nats_servers`` is not empty, else gRPC).

    :raises LiftbridgeArgumentError: unknown path, or ``"nats"`` without NATS servers.
    """
    if path not in PUBLISH_PATHS:
        raise LiftbridgeArgumentError(f"publish_path {path!r} is unknown; use one of {', '.join(PUBLISH_PATHS)}")
    if path == "nats" and not nats_servers:
        raise LiftbridgeArgumentError("publish_path 'nats' needs NATS servers: fill in the connection's 'NATS servers'")
    options: dict[str, Any] = {
        "ack_policy": ack_policy,
        "window": window,
        "partition": partition,
        "partitioner": partitioner,
        "timeout": timeout,
    }
    if path == "nats" or (path == "auto" and nats_servers):
        # NATS alone cannot tell a missing stream, a paused or a read-only partition from a slow
        # one (the broker drops such messages without an ack), so look first.
        info = client.fetch_metadata([stream]).streams.get(stream)
        if info is None:
            raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first")
        blocked = sorted(p for p, part in info.partitions.items() if part.paused or part.readonly)
        if not blocked:
            return NatsBatchSender(client, stream, info=info, nats_servers=nats_servers, **options)
        reason = (
            f"partition(s) {blocked} of stream {stream!r} are paused or read-only; the broker drops NATS-direct "
            "publishes to them without an ack"
        )
        if path == "nats":
            raise LiftbridgeArgumentError(f"{reason}: use publish_path 'grpc' (it resumes paused partitions)")
        sender = BatchSender(client, stream, **options)
        sender.fallback_reason = f"{reason}, so gRPC is used"
        return sender
    return BatchSender(client, stream, **options)


def publish_in_windows(
    sender: BatchSender,
    records: Iterable[Record],
    *,
    window: int = 1000,
    summary: PublishSummary | None = None,
    on_window: Callable[[PublishSummary], None] | None = None,
) -> PublishSummary:
    """Publish records ``window`` at a time through ``sender``, checking every ack before the next
    window.

    At most ``window`` records are held in memory at once (plus the sender's in-flight window), so
    a lazy ``records`` iterable of any length publishes in bounded memory.

    :param on_window: called with the running summary after each window (progress logging).
    :raises LiftbridgePublishNotAcknowledgedError: a record was not acknowledged, or refused.
    :raises LiftbridgeArgumentError: ``window`` is not positive.
    """
    if window < 1:
        raise LiftbridgeArgumentError(f"window must be at least 1, got {window}")
    stream = sender.stream
    summary = summary or PublishSummary(stream, sender.ack_policy)
    for batch in _windows(records, window):
        try:
            acks = sender.send(batch)
        except PublishError as exc:
            before = summary.count
            received = [a for a in exc.acks if a is not None]
            summary.add_acks(received, len(received))
            failed = f"record #{before + exc.index}" if exc.index is not None else "a record"
            raise LiftbridgePublishNotAcknowledgedError(stream, summary.acknowledged, f"{failed}: {exc}") from exc
        summary.add_acks(acks, len(batch))
        if on_window is not None:
            on_window(summary)
    return summary
