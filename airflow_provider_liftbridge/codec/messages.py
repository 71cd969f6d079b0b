"""Publish messages and acks in envelopes: the Python counterparts of the Go client's
``NewMessage``, ``UnmarshalMessage`` and ``UnmarshalAck``, plus the encoders a server needs.

Protobuf objects stay inside this package's users (client, dev server); the client turns
them into its own value types before anything reaches a caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from google.protobuf.message import DecodeError

from airflow_provider_liftbridge._proto import api_pb2

from .envelope import DEFAULT_MAX_PAYLOAD, MsgType, decode, encode
from .errors import UndecodablePayloadError

_T = TypeVar("_T", api_pb2.Message, api_pb2.Ack)

#: The Go client sends -1 ("no expectation") unless the caller sets an expected offset.
NO_EXPECTED_OFFSET = -1


def new_message(
    value: bytes,
    *,
    key: bytes = b"",
    headers: Mapping[str, bytes] | None = None,
    ack_inbox: str = "",
    correlation_id: str = "",
    ack_policy: int = api_pb2.LEADER,
    expected_offset: int = NO_EXPECTED_OFFSET,
    crc: bool = True,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> bytes:
    """Build an enveloped ``Message`` ready to publish on a stream's NATS subject.

    ``expected_offset`` travels in the ``offset`` field, as the Go client sends it; the server
    uses it only on streams with optimistic concurrency control.

    :raises PayloadTooLargeError: the encoded message exceeds ``max_payload``.
    """
    msg = api_pb2.Message(
        key=key,
        value=value,
        headers=headers,
        ackInbox=ack_inbox,
        correlationId=correlation_id,
        ackPolicy=ack_policy,  # type: ignore[arg-type]
        offset=expected_offset,
    )
    return encode(msg.SerializeToString(), MsgType.PUBLISH, crc=crc, max_payload=max_payload)


def encode_message(msg: api_pb2.Message, *, crc: bool = True, max_payload: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    """Envelope an already-built ``Message`` protobuf as a Publish frame."""
    return encode(msg.SerializeToString(), MsgType.PUBLISH, crc=crc, max_payload=max_payload)


def encode_ack(ack: api_pb2.Ack, *, crc: bool = False, max_payload: int = DEFAULT_MAX_PAYLOAD) -> bytes:
    """Envelope an ``Ack`` the way the server sends it to an ack inbox (no CRC by default)."""
    return encode(ack.SerializeToString(), MsgType.ACK, crc=crc, max_payload=max_payload)


def unmarshal_message(
    data: bytes | bytearray | memoryview, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> api_pb2.Message:
    """Decode an enveloped Publish frame into a ``Message`` protobuf.

    :raises EnvelopeError: any subclass, naming what was wrong with the frame.
    """
    return _parse(api_pb2.Message(), decode(data, MsgType.PUBLISH, max_payload=max_payload).payload, "Message")


def unmarshal_ack(data: bytes | bytearray | memoryview, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> api_pb2.Ack:
    """Decode an enveloped Ack frame (as received on an ack inbox) into an ``Ack`` protobuf.

    :raises EnvelopeError: any subclass, naming what was wrong with the frame.
    """
    return _parse(api_pb2.Ack(), decode(data, MsgType.ACK, max_payload=max_payload).payload, "Ack")


def _parse(target: _T, payload: memoryview, what: str) -> _T:
    try:
        target.ParseFromString(payload)  # type: ignore[arg-type]  # upb parses any buffer
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise UndecodablePayloadError(f"payload of {len(payload)} bytes is not a valid {what} protobuf: {exc}") from exc
    return target
