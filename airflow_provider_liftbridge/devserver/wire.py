"""The dev server's hand-written protobuf: varints, stored ``Message`` bodies, ``Ack`` bytes,
PublishAsync responses. Shared by the partitions (state), the gRPC API and the NATS ingest.

Everything here writes fields in number order and leaves zero values out, so the bytes are what
``SerializeToString()`` of the generated classes gives (tests/devserver/test_state_body.py and
test_nats_acks.py hold them equal), at a fraction of the cost on the per-message paths.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec.messages import SMALL_VARINTS, header_field_head, varint


def length_delimited(tag: bytes, data: bytes) -> bytes:
    """A length-delimited protobuf field: ``tag``, the length of ``data``, ``data``."""
    return tag + varint(len(data)) + data


def header_entry(key: str, value: bytes) -> bytes:
    """One encoded entry of ``Message.headers`` (field 9, a map<string, bytes>)."""
    return header_field_head(key, len(value)) + value


def header_entries(headers: Mapping[str, bytes]) -> bytes:
    """The encoded entries of ``headers`` except ``subject`` and ``reply`` (the server sets those).

    Exactly-once records carry two headers on every message: the heads of the entries come from
    the codec's cache (per name and value size), and the map is read by key, since iterating
    ``items()`` of a protobuf map goes through the ``Mapping`` mixin in Python and cost twice as much.
    """
    parts = []
    for key in headers:
        if key != "subject" and key != "reply":
            value = headers[key]
            parts += (header_field_head(key, len(value)), value)
    return b"".join(parts)


class TimestampField:
    """Field 4 (``timestamp``) of a stored ``Message``, remembered for the last timestamp seen.

    Messages that arrive together share their reception time, and a nanosecond timestamp is
    a nine-byte varint that costs a loop to encode: once per batch instead of once per message.
    """

    __slots__ = ("encoded", "value")

    def __init__(self) -> None:
        self.value = -1
        self.encoded = b""

    def __call__(self, ts: int) -> bytes:
        if ts != self.value:
            self.encoded = b"\x20" + varint(ts) if ts else b""  # proto3 leaves a zero out
            self.value = ts
        return self.encoded


def message_body(offset: int, key: bytes, value: bytes, ts_field: bytes, tail: bytes) -> bytes:
    """A stored ``Message``: fields 1-3 (offset, key, value), field 4 already encoded
    (:class:`TimestampField`) and fields 5-9 already encoded (``tail``: stream, partition, subject,
    reply, headers)."""
    n = len(value)
    return b"".join(
        (
            (b"\x08" + varint(offset)) if offset else b"",
            (b"\x12" + varint(len(key)) + key) if key else b"",
            (b"\x1a" + (SMALL_VARINTS[n] if n < 128 else varint(n)) + value) if n else b"",
            ts_field,
            tail,
        )
    )


def ack_prefix(stream: str, partition_subject: str, msg_subject: str) -> bytes:
    """Fields 1-3 of an ``Ack``: stream, partitionSubject, msgSubject."""
    return (
        length_delimited(b"\x0a", stream.encode())
        + length_delimited(b"\x12", partition_subject.encode())
        + length_delimited(b"\x1a", msg_subject.encode())
    )


def ack_inbox_field(inbox: str) -> bytes:
    """Field 5 of an ``Ack``: ackInbox."""
    return length_delimited(b"\x2a", inbox.encode())


def ack_times(received: int, commit_field: bytes) -> bytes:
    """Fields 8-9 of an ``Ack``: receptionTimestamp, then ``commit_field`` (:func:`ack_commit_field`)."""
    return b"\x40" + varint(received) + commit_field


def ack_commit_field(commit_ts: int) -> bytes:
    """Field 9 of an ``Ack``: commitTimestamp."""
    return b"\x48" + varint(commit_ts)


def ack_body(prefix: bytes, offset: int, inbox_field: bytes, cid: str, policy: int, times: bytes, error: int) -> bytes:
    """An ``Ack`` from its already encoded parts (:func:`ack_prefix`, :func:`ack_inbox_field`,
    :func:`ack_times`) and the per-message offset, correlation id, ack policy and ackError."""
    c = cid.encode()
    n = len(c)
    return b"".join(
        (
            prefix,
            b"\x20" + varint(offset) if offset else b"",
            inbox_field,
            (b"\x32" + (SMALL_VARINTS[n] if n < 128 else varint(n)) + c) if n else b"",
            b"\x38" + SMALL_VARINTS[policy] if policy else b"",
            times,
            b"\x50" + SMALL_VARINTS[error] if error else b"",
        )
    )


ACK_OK = api_pb2.Ack.OK
ACK_INCORRECT_OFFSET = api_pb2.Ack.INCORRECT_OFFSET


def build_ack(
    stream: str,
    stream_subject: str,
    msg_subject: str,
    offset: int,
    ack_inbox: str,
    correlation_id: str,
    ack_policy: int,
    reception_ts: int,
    commit_ts: int,
    error: int = ACK_OK,
) -> api_pb2.Ack:
    """The ``Ack`` for a message of ``stream`` (``partitionSubject`` is the stream's base subject)."""
    return api_pb2.Ack(
        stream=stream,
        partitionSubject=stream_subject,
        msgSubject=msg_subject,
        offset=offset,
        ackInbox=ack_inbox,
        correlationId=correlation_id,
        ackPolicy=ack_policy,  # type: ignore[arg-type]
        receptionTimestamp=reception_ts,
        commitTimestamp=commit_ts,
        ackError=error,  # type: ignore[arg-type]
    )


def publish_response_bytes(ack_bytes: bytes, correlation_id: str) -> bytes:
    """A serialized ``PublishResponse{ack, correlationId}`` around an already serialized ``Ack``.

    Built by hand because PublishAsync sends one per message; the layout is plain protobuf
    (field 1 length-delimited, field 3 string).
    """
    out = b"\x0a" + varint(len(ack_bytes)) + ack_bytes
    if correlation_id:
        cid = correlation_id.encode()
        out += b"\x1a" + varint(len(cid)) + cid
    return out


def async_error_bytes(correlation_id: str, code: int, message: str) -> bytes:
    """A serialized PublishAsync error response: correlation id, async error and an empty ack."""
    return api_pb2.PublishResponse(
        ack=api_pb2.Ack(),
        asyncError=api_pb2.PublishAsyncError(code=code, message=message),  # type: ignore[arg-type]
        correlationId=correlation_id,
    ).SerializeToString()
