"""Request building: the protobuf requests of every call, from validated arguments."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_liftbridge._proto import api_pb2

from .errors import InvalidArgumentError
from .types import AckPolicy, StartPosition, StopPosition

StartAt = StartPosition | int | datetime | timedelta
StopAt = StopPosition | int | datetime | None


def check_name(what: str, value: str) -> None:
    """:raises InvalidArgumentError: ``value`` is not a non-empty string (``what`` names it)."""
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{what} must be a non-empty string, got {value!r}")


def check_partition(partition: int) -> int:
    """``partition``, checked.

    :raises InvalidArgumentError: not an int >= 0.
    """
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
    check_name("subject", subject)
    check_name("name", name)
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
    check_name("stream", stream)
    return api_pb2.PublishRequest(
        stream=stream,
        partition=check_partition(partition),
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
    check_name("subject", subject)
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
