"""Protobuf bytes the dev server builds by hand on its hot paths: acks, PublishAsync responses, headers.

Acks are built as bytes rather than ``Ack`` objects because every message published with an
ack policy costs one, and the fields that do not change per message (stream, subjects) are
encoded once per partition and subject. The layout is plain protobuf, fields in number order,
zero values left out, so the bytes are what ``Ack.SerializeToString()`` gives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_liftbridge._proto import api_pb2

if TYPE_CHECKING:
    from .state import Partition

ACK_OK = api_pb2.Ack.OK
ACK_INCORRECT_OFFSET = api_pb2.Ack.INCORRECT_OFFSET
_SMALL = [bytes([i]) for i in range(128)]
_MASK64 = (1 << 64) - 1
_cache: dict[int, bytes] = {}
_inbox_fields: dict[str, bytes] = {}


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of an integer (negative ones as 64-bit two's complement, like int64)."""
    if 0 <= n < 128:
        return _SMALL[n]
    if 0 < n < 2_097_152:  # offsets and lengths: two or three bytes, no loop
        if n < 16_384:
            return bytes((n & 0x7F | 0x80, n >> 7))
        return bytes((n & 0x7F | 0x80, (n >> 7) & 0x7F | 0x80, n >> 14))
    n &= _MASK64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def varint_cached(n: int) -> bytes:
    """:func:`varint` remembered for repeated values (timestamps shared by a batch of messages)."""
    b = _cache.get(n)
    if b is None:
        if len(_cache) > 256:
            _cache.clear()
        b = _cache[n] = varint(n)
    return b


def length_delimited(tag: bytes, data: bytes) -> bytes:
    """A length-delimited protobuf field: ``tag``, the length, ``data``."""
    return tag + varint(len(data)) + data


def header_entry(key: str, value: bytes) -> bytes:
    """One encoded entry of ``Message.headers`` (field 9, a map<string, bytes>)."""
    k = key.encode()
    entry = b"\x0a" + varint(len(k)) + k + b"\x12" + varint(len(value)) + value
    return b"\x4a" + varint(len(entry)) + entry


def ack_prefix(part: Partition, msg_subject: str) -> bytes:
    """Fields 1-3 of an ``Ack`` for ``part`` (``partitionSubject`` is the stream's base subject)."""
    stream = part.stream
    return (
        length_delimited(b"\x0a", stream.name.encode())
        + length_delimited(b"\x12", stream.subject.encode())
        + length_delimited(b"\x1a", msg_subject.encode())
    )


def ack_bytes(
    prefix: bytes,
    offset: int,
    ack_inbox: str,
    correlation_id: str,
    ack_policy: int,
    reception_ts: int,
    commit_ts: int,
    error: int = ACK_OK,
) -> bytes:
    """A serialized ``Ack``: ``prefix`` from :func:`ack_prefix`, then fields 4-10."""
    parts = [prefix]
    if offset:
        parts += (b"\x20", varint(offset))
    if ack_inbox:
        # Publishers reuse one inbox for many messages: its encoded field is remembered.
        field = _inbox_fields.get(ack_inbox)
        if field is None:
            if len(_inbox_fields) > 4096:
                _inbox_fields.clear()
            field = _inbox_fields[ack_inbox] = length_delimited(b"\x2a", ack_inbox.encode())
        parts.append(field)
    if correlation_id:
        cid = correlation_id.encode()
        parts += (b"\x32", varint(len(cid)), cid)
    if ack_policy:
        parts += (b"\x38", _SMALL[ack_policy])
    if reception_ts:
        parts += (b"\x40", varint_cached(reception_ts))
    if commit_ts:
        parts += (b"\x48", varint_cached(commit_ts))
    if error:
        parts += (b"\x50", varint(error))
    return b"".join(parts)


def publish_response_bytes(ack: bytes, correlation_id: str = "") -> bytes:
    """A serialized ``PublishResponse{ack, correlationId}`` around an already serialized ``Ack``."""
    out = b"\x0a" + varint(len(ack)) + ack
    if correlation_id:
        out += length_delimited(b"\x1a", correlation_id.encode())
    return out


def async_error_bytes(correlation_id: str, code: int, message: str) -> bytes:
    """A serialized PublishAsync error response: correlation id, async error and an empty ack."""
    return api_pb2.PublishResponse(
        ack=api_pb2.Ack(),
        asyncError=api_pb2.PublishAsyncError(code=code, message=message),  # type: ignore[arg-type]
        correlationId=correlation_id,
    ).SerializeToString()
