"""Envelope codec: fixed vectors written from the spec, round trips, and every error."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_liftbridge import codec
from airflow_provider_liftbridge._proto import api_pb2


def reference_crc32c(data: bytes) -> int:
    """Bit-by-bit CRC-32C (Castagnoli, reflected poly 0x82F63B78), independent of google-crc32c."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


# Ack{stream: "s", offset: 5}: field 1 (string) = 0a 01 73, field 4 (varint) = 20 05.
ACK_PAYLOAD = bytes.fromhex("0a 01 73 20 05")
ACK_FRAME_NO_CRC = bytes.fromhex("b9 0e 43 b4 00 08 00 01") + ACK_PAYLOAD
ACK_FRAME_CRC = bytes.fromhex("b9 0e 43 b4 00 0c 01 01 db a5 39 6e") + ACK_PAYLOAD
# Message{offset: -1, value: "hi", ackPolicy: NONE}: 08 + ten-byte varint of -1, 1a 02 "hi", 60 02.
MSG_PAYLOAD = bytes.fromhex("08 ff ff ff ff ff ff ff ff ff 01 1a 02 68 69 60 02")
MSG_FRAME_CRC = bytes.fromhex("b9 0e 43 b4 00 0c 01 00 6b e0 62 9e") + MSG_PAYLOAD


def test_reference_crc_matches_the_standard_check_value() -> None:
    assert reference_crc32c(b"123456789") == 0xE3069283


def test_fixed_vectors_carry_the_reference_crc() -> None:
    assert struct.unpack(">I", ACK_FRAME_CRC[8:12])[0] == reference_crc32c(ACK_PAYLOAD)
    assert struct.unpack(">I", MSG_FRAME_CRC[8:12])[0] == reference_crc32c(MSG_PAYLOAD)


def test_encode_ack_without_crc_matches_the_server_shape() -> None:
    ack = api_pb2.Ack(stream="s", offset=5)
    assert codec.encode_ack(ack) == ACK_FRAME_NO_CRC
    assert codec.encode_ack(ack, crc=True) == ACK_FRAME_CRC


def test_decode_fixed_ack_vectors() -> None:
    for frame in (ACK_FRAME_NO_CRC, ACK_FRAME_CRC):
        ack = codec.unmarshal_ack(frame)
        assert (ack.stream, ack.offset) == ("s", 5)
    env = codec.decode(ACK_FRAME_CRC)
    assert env.msg_type is codec.MsgType.ACK
    assert env.crc == 0xDBA5396E
    assert bytes(env.payload) == ACK_PAYLOAD


def test_new_message_matches_fixed_vector() -> None:
    frame = codec.new_message(b"hi", ack_policy=api_pb2.NONE)
    assert frame == MSG_FRAME_CRC
    msg = codec.unmarshal_message(frame)
    assert (msg.value, msg.offset, msg.ackPolicy) == (b"hi", -1, api_pb2.NONE)


def test_decode_payload_is_a_view_not_a_copy() -> None:
    buf = bytearray(ACK_FRAME_NO_CRC)
    env = codec.decode(buf)
    buf[-1] = 0x07
    assert env.payload[-1] == 0x07


def test_there_are_fifteen_message_types() -> None:
    assert [t.value for t in codec.MsgType] == list(range(15))
    assert codec.MsgType.PARTITION_NOTIFICATION == 14


@settings(max_examples=300, deadline=None)
@given(
    key=st.binary(max_size=64),
    value=st.binary(max_size=2048),
    headers=st.dictionaries(st.text(max_size=16), st.binary(max_size=32), max_size=4),
    ack_inbox=st.text(max_size=32),
    correlation_id=st.text(max_size=32),
    ack_policy=st.sampled_from([api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE]),
    expected_offset=st.integers(min_value=-1, max_value=2**62),
    crc=st.booleans(),
)
def test_message_round_trip(
    key: bytes,
    value: bytes,
    headers: dict[str, bytes],
    ack_inbox: str,
    correlation_id: str,
    ack_policy: int,
    expected_offset: int,
    crc: bool,
) -> None:
    frame = codec.new_message(
        value,
        key=key,
        headers=headers,
        ack_inbox=ack_inbox,
        correlation_id=correlation_id,
        ack_policy=ack_policy,
        expected_offset=expected_offset,
        crc=crc,
    )
    assert frame[5] == (12 if crc else 8) and frame[6] == (1 if crc else 0) and frame[7] == 0
    msg = codec.unmarshal_message(frame)
    assert msg.key == key and msg.value == value and dict(msg.headers) == headers
    assert (msg.ackInbox, msg.correlationId, msg.ackPolicy, msg.offset) == (
        ack_inbox,
        correlation_id,
        ack_policy,
        expected_offset,
    )


@settings(max_examples=200, deadline=None)
@given(
    stream=st.text(max_size=32),
    offset=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    error=st.sampled_from(list(api_pb2.Ack.Error.values())),
    crc=st.booleans(),
    msg_type=st.sampled_from(list(codec.MsgType)),
)
def test_envelope_round_trip_every_type(
    stream: str, offset: int, error: int, crc: bool, msg_type: codec.MsgType
) -> None:
    payload = api_pb2.Ack(stream=stream, offset=offset, ackError=error).SerializeToString()  # type: ignore[arg-type]
    env = codec.decode(codec.encode(payload, msg_type, crc=crc), msg_type)
    assert env.msg_type is msg_type and bytes(env.payload) == payload
    assert (env.crc is not None) == crc


@pytest.mark.parametrize(
    ("frame", "error", "words"),
    [
        (b"", codec.TruncatedEnvelopeError, "shorter than the 8-byte header"),
        (ACK_FRAME_NO_CRC[:7], codec.TruncatedEnvelopeError, "7 bytes"),
        (ACK_FRAME_CRC[:10], codec.TruncatedEnvelopeError, "12-byte header"),
        (b"\x00\x0e\x43\xb4" + ACK_FRAME_NO_CRC[4:], codec.BadMagicError, "00 0e 43 b4"),
        (ACK_FRAME_NO_CRC[:4] + b"\x01" + ACK_FRAME_NO_CRC[5:], codec.UnsupportedVersionError, "version 1"),
        (ACK_FRAME_NO_CRC[:5] + b"\x0c" + ACK_FRAME_NO_CRC[6:], codec.BadHeaderLengthError, "expected 8"),
        (ACK_FRAME_CRC[:5] + b"\x08" + ACK_FRAME_CRC[6:], codec.BadHeaderLengthError, "expected 12"),
        (ACK_FRAME_NO_CRC[:6] + b"\x02" + ACK_FRAME_NO_CRC[7:], codec.UnknownFlagsError, "0x02"),
        (ACK_FRAME_NO_CRC[:7] + b"\x0f" + ACK_FRAME_NO_CRC[8:], codec.UnexpectedMessageTypeError, "type 15"),
        (ACK_FRAME_CRC[:-1] + b"\x06", codec.CrcMismatchError, "0xdba5396e"),
    ],
)
def test_each_malformed_header_raises_its_own_error(frame: bytes, error: type[Exception], words: str) -> None:
    with pytest.raises(error, match=words):
        codec.decode(frame)


def test_unexpected_type_names_both_types() -> None:
    with pytest.raises(codec.UnexpectedMessageTypeError, match="ACK .* expected PUBLISH"):
        codec.unmarshal_message(ACK_FRAME_NO_CRC)


def test_undecodable_protobuf() -> None:
    frame = codec.encode(b"\x0a\xff\x01", codec.MsgType.ACK)  # length 255, 0 bytes follow
    with pytest.raises(codec.UndecodablePayloadError, match="not a valid Ack protobuf"):
        codec.unmarshal_ack(frame)


def test_payload_limit_checked_on_encode_and_decode() -> None:
    with pytest.raises(codec.PayloadTooLargeError, match=r"payload is \d+ bytes, over the limit of 10 bytes"):
        codec.new_message(b"x" * 9, max_payload=10)
    frame = codec.new_message(b"x" * 9)
    with pytest.raises(codec.PayloadTooLargeError):
        codec.unmarshal_message(frame, max_payload=10)
    assert codec.DEFAULT_MAX_PAYLOAD + codec.HEADER_LEN_WITH_CRC == 1024 * 1024


def test_encode_refuses_unknown_type() -> None:
    with pytest.raises(codec.UnexpectedMessageTypeError):
        codec.encode(b"", 15)


def test_every_error_is_an_envelope_error_and_a_value_error() -> None:
    for name in codec.__all__:
        obj = getattr(codec, name)
        if isinstance(obj, type) and name.endswith("Error"):
            assert issubclass(obj, codec.EnvelopeError) and issubclass(obj, ValueError)
