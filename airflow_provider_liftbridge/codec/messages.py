"""Publish messages and acks in envelopes: the Python counterparts of the Go client's
``NewMessage``, ``UnmarshalMessage`` and ``UnmarshalAck``, plus the encoders a server needs.

Protobuf objects stay inside this package's users (client, dev server); the client turns
them into its own value types before anything reaches a caller.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from google.protobuf.message import DecodeError

from airflow_provider_liftbridge._proto import api_pb2

from .envelope import CRC_FIELD, DEFAULT_MAX_PAYLOAD, MsgType, crc32c, decode, encode, framer, header_of
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


# Field heads (tag + length) are cached for values up to this size; larger values are rare in
# bulk loads and their own copy dwarfs serializing the head again.
_HEAD_CACHE_LIMIT = 16 * 1024


SMALL_VARINTS = [bytes((i,)) for i in range(128)]
# The low 14 bits of a longer varint: two bytes, both with the continuation bit (offsets, lengths and
# timestamps are encoded per message, and table lookups beat a byte-by-byte loop in Python).
_LOW14 = [bytes((i & 0x7F | 0x80, i >> 7 | 0x80)) for i in range(1 << 14)]
_LOW7 = [bytes((i | 0x80,)) for i in range(128)]
_MASK64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """Protobuf base-128 varint of an integer (a negative one as 64-bit two's complement, as int64 is sent)."""
    if 0 <= n < 128:
        return SMALL_VARINTS[n]
    if 0 < n < 16_384:
        return _LOW7[n & 0x7F] + SMALL_VARINTS[n >> 7]
    if 0 < n < 2_097_152:
        return _LOW14[n & 0x3FFF] + SMALL_VARINTS[n >> 14]
    n &= _MASK64
    parts = []
    while n >= 16_384:
        parts.append(_LOW14[n & 0x3FFF])
        n >>= 14
    parts.append(SMALL_VARINTS[n] if n < 128 else _LOW7[n & 0x7F] + SMALL_VARINTS[n >> 7])
    return b"".join(parts)


def header_field(name: str, value: bytes) -> bytes:
    """One entry of ``Message.headers`` (field 9, a map<string, bytes>) encoded as protobuf writes it."""
    return header_field_head(name, len(value)) + value


_FIELD_HEADS: dict[tuple[str, int], bytes] = {}


def header_field_head(name: str, size: int) -> bytes:
    """:func:`header_field` up to its value (tag, entry length, key field, value tag and length) for
    a value of ``size`` bytes; remembered per name and size."""
    head = _FIELD_HEADS.get((name, size))
    if head is None:
        key = name.encode()
        entry = b"\x0a" + varint(len(key)) + key + b"\x12" + varint(size)
        head = b"\x4a" + varint(len(entry) + size) + entry
        if len(_FIELD_HEADS) < _HEAD_CACHE_LIMIT:
            _FIELD_HEADS[(name, size)] = head
    return head


def decode_header_fields(wire: bytes) -> dict[str, bytes]:
    """The headers that ``Message.headers`` entries encode (what :func:`header_field` writes,
    concatenated): the inverse of encoding them.

    :raises UndecodablePayloadError: ``wire`` is not a sequence of such entries.
    """
    try:
        return dict(api_pb2.Message.FromString(wire).headers)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise UndecodablePayloadError(f"{len(wire)} bytes are not encoded message headers: {exc}") from exc


class EncodedHeaders(Mapping[str, bytes]):
    """Read-only message headers that carry their own encoding, which :meth:`PublishEncoder.encode`
    writes as it is instead of encoding the headers again (a record rebuilt from encoded headers,
    see :func:`decode_header_fields`).

    :param headers: the headers (kept, not copied: do not change the dict afterwards).
    :param wire: their ``Message.headers`` entries, as :func:`header_field` writes them (in any
        order: a protobuf map has none).
    """

    __slots__ = ("_headers", "wire")

    def __init__(self, headers: dict[str, bytes], wire: bytes) -> None:
        self._headers = headers
        #: The encoded entries.
        self.wire = wire

    def __getitem__(self, name: str) -> bytes:
        return self._headers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)

    def __repr__(self) -> str:
        return f"EncodedHeaders({self._headers!r})"


class PublishEncoder:
    """Builds many Publish frames that share an ack inbox, an ack policy and the CRC setting, the
    way a bulk publisher sends them: every frame is byte for byte what :func:`new_message` returns
    for the same arguments, at a fraction of its cost.

    Protobuf wire format lets a message be the concatenation of its fields' encodings, in any
    order; :func:`new_message` writes them in field-number order, and so does this encoder: the
    per-record fields (offset, key, value, headers), the shared ack inbox, the correlation id,
    the shared ack policy. The shared fields are serialized once by protobuf; the tag and length
    of a value or correlation id are serialized by protobuf once per length and cached.

    :param ack_inbox: the ``ackInbox`` of every frame.
    :param ack_policy: the ``ackPolicy`` of every frame (wire value).
    :param crc: write a CRC-32C in each envelope.
    :param max_payload: the largest ``Message`` protobuf accepted.
    """

    def __init__(
        self,
        *,
        ack_inbox: str = "",
        ack_policy: int = api_pb2.LEADER,
        crc: bool = True,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self._inbox = api_pb2.Message(ackInbox=ack_inbox).SerializeToString()
        self._policy = api_pb2.Message(ackPolicy=ack_policy).SerializeToString()  # type: ignore[arg-type]
        self._no_offset = api_pb2.Message(offset=NO_EXPECTED_OFFSET).SerializeToString()
        self._value_heads: dict[int, bytes] = {0: b""}
        self._id_heads: dict[int, bytes] = {0: b""}
        self._frame = framer(MsgType.PUBLISH, crc=crc, max_payload=max_payload)
        self._encode_value = self._value_encoder(crc, max_payload)
        self._encode_record = self._record_encoder()

    def _value_encoder(self, crc: bool, max_payload: int) -> Callable[[bytes, bytes], bytes]:
        # encode_value as a closure over its constants, framing included: the hot loop of a
        # bulk publish, where each attribute load and call shows.
        value_heads, id_heads = self._value_heads, self._id_heads
        no_offset, inbox, policy, frame = self._no_offset, self._inbox, self._policy, self._frame
        value_head, id_head = self._value_head, self._id_head
        head, pack_crc, join = header_of(MsgType.PUBLISH, crc=crc), CRC_FIELD.pack, b"".join

        def encode_value(value: bytes, correlation_id: bytes) -> bytes:
            vh = value_heads.get(len(value))
            ih = id_heads.get(len(correlation_id))
            body = join(
                (
                    no_offset,
                    value_head(len(value)) if vh is None else vh,
                    value,
                    inbox,
                    id_head(len(correlation_id)) if ih is None else ih,
                    correlation_id,
                    policy,
                )
            )
            if not crc or len(body) > max_payload:
                return frame(body)  # raises if too large
            return head + pack_crc(crc32c(body)) + body

        return encode_value

    def encode_value(self, value: bytes, correlation_id: bytes) -> bytes:
        """The frame of a record that is only a value: no key, no headers, no expected offset.

        :param correlation_id: UTF-8 bytes of the correlation id (``b""`` for none).
        :raises PayloadTooLargeError: the encoded message exceeds ``max_payload``.
        """
        return self._encode_value(value, correlation_id)

    def encode_values(self, values: Sequence[bytes], correlation_ids: Sequence[bytes]) -> list[bytes]:
        """:meth:`encode_value` of each pair, in one call (a burst of a bulk publish).

        :raises PayloadTooLargeError: an encoded message exceeds ``max_payload``.
        """
        return list(map(self._encode_value, values, correlation_ids))

    def encode_many(
        self,
        values: Sequence[bytes],
        correlation_ids: Sequence[bytes],
        header_wires: Sequence[bytes],
        expected_offsets: Sequence[int],
        keys: Sequence[bytes | None] | None = None,
    ) -> list[bytes]:
        """The frames of records given as columns (each as long as ``values``), byte for byte
        what :meth:`encode` makes of each record: for a publisher whose every record has headers
        and an expected offset (exactly-once), without a mapping or a keyword call per record.

        :param header_wires: each record's ``Message.headers`` entries as :func:`header_field`
            writes them (``b""`` for none).
        :param expected_offsets: each record's expected offset (:data:`NO_EXPECTED_OFFSET` for none).
        :param keys: each record's key (``None`` or ``b""`` for none), or ``None`` for no keys at all.
        :raises PayloadTooLargeError: an encoded message exceeds ``max_payload``.
        """
        no_keys = itertools.repeat(None, len(values))
        return list(map(self._encode_record, values, correlation_ids, header_wires, expected_offsets, keys or no_keys))

    def encode(
        self,
        value: bytes,
        correlation_id: bytes,
        *,
        key: bytes = b"",
        headers: Mapping[str, bytes] | None = None,
        expected_offset: int = NO_EXPECTED_OFFSET,
    ) -> bytes:
        """The frame of any record (see :meth:`encode_value` for the common case).

        :param correlation_id: UTF-8 bytes of the correlation id (``b""`` for none).
        :raises PayloadTooLargeError: the encoded message exceeds ``max_payload``.
        """
        if expected_offset == NO_EXPECTED_OFFSET and not key and not headers:
            return self._encode_value(value, correlation_id)
        if headers.__class__ is EncodedHeaders:
            wire = headers.wire  # checked just above
        elif headers:
            wire = b"".join([header_field_head(name, len(data)) + data for name, data in headers.items()])
        else:
            wire = b""
        return self._encode_record(value, correlation_id, wire, expected_offset, key)

    def _record_encoder(self) -> Callable[[bytes, bytes, bytes, int, bytes | None], bytes]:
        # The frame of any record from its encoded headers, written by hand in field-number order
        # (offset 1, key 2, value 3, headers 9, then the shared fields): building a Message with a
        # headers map cost several times the rest of the frame, and exactly-once publishing puts
        # two headers on every record. A closure over its constants, like encode_value.
        value_heads, id_heads, value_head, id_head = self._value_heads, self._id_heads, self._value_head, self._id_head
        inbox, policy, frame, join = self._inbox, self._policy, self._frame, b"".join

        def encode_record(value: bytes, cid: bytes, wire: bytes, offset: int, key: bytes | None) -> bytes:
            vh = value_heads.get(len(value))
            ih = id_heads.get(len(cid))
            return frame(
                join(
                    (
                        # offset (int64): absent when 0 (proto3), two's complement when negative
                        b"" if offset == 0 else b"\x08" + varint(offset),
                        b"\x12" + varint(len(key)) + key if key else b"",
                        value_head(len(value)) if vh is None else vh,
                        value,
                        wire,
                        inbox,
                        id_head(len(cid)) if ih is None else ih,
                        cid,
                        policy,
                    )
                )
            )

        return encode_record

    def _value_head(self, size: int) -> bytes:
        if size > _HEAD_CACHE_LIMIT:
            # Only the head is wanted; serialize a value of the same size once, uncached.
            return api_pb2.Message(value=bytes(size)).SerializeToString()[:-size]
        head = self._value_heads[size] = api_pb2.Message(value=bytes(size)).SerializeToString()[:-size]
        return head

    def _id_head(self, size: int) -> bytes:
        head = api_pb2.Message(correlationId="0" * size).SerializeToString()[:-size]
        if size <= _HEAD_CACHE_LIMIT:
            self._id_heads[size] = head
        return head


class AckDecoder:
    """Decodes the Ack frames arriving on an ack inbox into one reused ``Ack`` protobuf: the
    same checks as :func:`unmarshal_ack`, with a short path for the frames a broker sends (no
    CRC) and no new protobuf object per ack.

    The returned object is the same on every call and is overwritten by the next one: read what
    you need from it first.

    :param max_payload: the largest payload accepted.
    """

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        pb = api_pb2.Ack()
        head = header_of(MsgType.ACK, crc=False)
        limit = max_payload + len(head)
        parse = pb.ParseFromString

        # A closure over its constants: called once per ack of a bulk publish.
        def decode_ack(data: bytes) -> api_pb2.Ack:
            if data[:8] == head and len(data) <= limit:
                try:
                    parse(data[8:])
                except (DecodeError, RuntimeError, ValueError) as exc:
                    raise UndecodablePayloadError(
                        f"payload of {len(data) - 8} bytes is not a valid Ack protobuf: {exc}"
                    ) from exc
                return pb
            return _parse(pb, decode(data, MsgType.ACK, max_payload=max_payload).payload, "Ack")

        #: Decode one enveloped Ack (the same as calling the decoder).
        #: :raises EnvelopeError: any subclass, naming what was wrong with the frame.
        self.decode: Callable[[bytes], api_pb2.Ack] = decode_ack

    def __call__(self, data: bytes) -> api_pb2.Ack:
        """Decode one enveloped Ack.

        :raises EnvelopeError: any subclass, naming what was wrong with the frame.
        """
        return self.decode(data)


def _parse(target: _T, payload: memoryview, what: str) -> _T:
    try:
        target.ParseFromString(payload)  # type: ignore[arg-type]  # upb parses any buffer
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise UndecodablePayloadError(f"payload of {len(payload)} bytes is not a valid {what} protobuf: {exc}") from exc
    return target
