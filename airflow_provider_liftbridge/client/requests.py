"""Request building: the protobuf requests of every call, from validated arguments."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow_provider_liftbridge._proto import api_pb2

from .errors import InvalidArgumentError
from .stream_options import StreamOptions
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


def _wire_name(option: str) -> str:
    """The ``CreateStreamRequest`` field of a :class:`StreamOptions` field: ``min_isr`` -> ``minIsr``."""
    head, *rest = option.split("_")
    return head + "".join(part.title() for part in rest)


def build_create_stream(subject: str, name: str, options: StreamOptions) -> api_pb2.CreateStreamRequest:
    """Build a ``CreateStreamRequest``; unset options stay unset so the server's defaults apply.

    Each option goes to the request field of its camel-cased name (``NullableInt64`` and the like
    for the optional ones); durations are sent in milliseconds (the Go client sends
    ``Duration.Milliseconds()``, which truncates).

    :raises InvalidArgumentError: an empty name or subject.
    """
    check_name("subject", subject)
    check_name("name", name)
    request = api_pb2.CreateStreamRequest(subject=subject, name=name)
    for option in dataclasses.fields(options):
        value = getattr(options, option.name)
        if value is None:
            continue
        if isinstance(value, timedelta):
            value = value // timedelta(milliseconds=1)
        target = _wire_name(option.name)
        if request.DESCRIPTOR.fields_by_name[target].message_type is None:
            setattr(request, target, value)
        else:  # a Nullable* wrapper: set means "given"
            getattr(request, target).value = value
    return request


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
