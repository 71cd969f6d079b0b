"""The bulk encoders: ``PublishEncoder`` frames are byte for byte ``new_message``'s, ``AckDecoder``
decodes what ``unmarshal_ack`` decodes and refuses what it refuses, ``framer`` frames as
``encode`` does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_liftbridge import codec
from airflow_provider_liftbridge._proto import api_pb2

ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
header_maps = st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=4)


@settings(max_examples=300, deadline=None)
@given(
    value=st.binary(max_size=300) | st.sampled_from([b"", b"x" * 127, b"x" * 128, b"y" * 20_000]),
    cid=ids,
    inbox=st.text(max_size=40),
    policy=st.sampled_from([api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE]),
    crc=st.booleans(),
)
def test_value_frames_are_new_message_bytes(value: bytes, cid: str, inbox: str, policy: int, crc: bool) -> None:
    enc = codec.PublishEncoder(ack_inbox=inbox, ack_policy=policy, crc=crc)
    frame = enc.encode_value(value, cid.encode())
    assert frame == codec.new_message(value, ack_inbox=inbox, correlation_id=cid, ack_policy=policy, crc=crc)
    # And the general method, with nothing but a value, gives the same bytes.
    assert enc.encode(value, cid.encode()) == frame


@settings(max_examples=300, deadline=None)
@given(
    value=st.binary(max_size=200),
    cid=ids,
    key=st.binary(max_size=20),
    headers=header_maps,
    offset=st.sampled_from([-1, 0, 1, 127, 128, 2**40]) | st.integers(-(2**63), 2**63 - 1),
    crc=st.booleans(),
)
def test_record_frames_decode_as_new_message_frames(
    value: bytes, cid: str, key: bytes, headers: dict[str, bytes], offset: int, crc: bool
) -> None:
    enc = codec.PublishEncoder(ack_inbox="_INBOX.x", ack_policy=api_pb2.ALL, crc=crc)
    frame = enc.encode(value, cid.encode(), key=key, headers=headers, expected_offset=offset)
    reference = codec.new_message(
        value,
        key=key,
        headers=headers,
        ack_inbox="_INBOX.x",
        correlation_id=cid,
        ack_policy=api_pb2.ALL,
        expected_offset=offset,
        crc=crc,
    )
    assert codec.unmarshal_message(frame) == codec.unmarshal_message(reference)
    if len(headers) <= 1:  # map entries have no defined order; with at most one, bytes agree too
        assert frame == reference


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=200), value=st.binary(max_size=300) | st.just(b"v" * 20_000))
def test_header_field_is_protobufs_map_entry(name: str, value: bytes) -> None:
    assert codec.header_field(name, value) == api_pb2.Message(headers={name: value}).SerializeToString()


@settings(max_examples=200, deadline=None)
@given(value=st.binary(max_size=200), cid=ids, headers=header_maps, offset=st.integers(-1, 2**40))
def test_encoded_headers_give_the_frame_of_the_plain_headers(
    value: bytes, cid: str, headers: dict[str, bytes], offset: int
) -> None:
    """Headers that carry their encoding (an exactly-once producer's) frame as the same headers in a dict."""
    enc = codec.PublishEncoder(ack_inbox="_INBOX.x")
    wire = b"".join(codec.header_field(k, v) for k, v in headers.items())
    carried = codec.EncodedHeaders(dict(headers), wire)
    assert carried == headers
    frame = enc.encode(value, cid.encode(), headers=carried, expected_offset=offset)
    assert frame == enc.encode(value, cid.encode(), headers=headers, expected_offset=offset)


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.binary(max_size=200),
            ids,
            header_maps,
            st.sampled_from([-1, 0, 1, 127, 128, 2**40]) | st.integers(-(2**63), 2**63 - 1),
            st.none() | st.binary(max_size=20),
        ),
        max_size=6,
    ),
    keyed=st.booleans(),
    crc=st.booleans(),
)
def test_encode_many_is_encode_per_record(
    records: list[tuple[bytes, str, dict[str, bytes], int, bytes | None]], keyed: bool, crc: bool
) -> None:
    """Columns (an exactly-once batch) frame byte for byte as each record alone through ``encode``."""
    enc = codec.PublishEncoder(ack_inbox="_INBOX.x", ack_policy=api_pb2.ALL, crc=crc)
    wires = [b"".join(codec.header_field(k, v) for k, v in headers.items()) for _, _, headers, _, _ in records]
    keys = [key if keyed else None for *_, key in records]
    frames = enc.encode_many(
        [r[0] for r in records],
        [r[1].encode() for r in records],
        wires,
        [r[3] for r in records],
        keys if keyed else None,
    )
    assert frames == [
        enc.encode(value, cid.encode(), key=key or b"", headers=headers, expected_offset=offset)
        for (value, cid, headers, offset, _), key in zip(records, keys, strict=True)
    ]


@settings(max_examples=200, deadline=None)
@given(headers=header_maps)
def test_decode_header_fields_inverts_header_field(headers: dict[str, bytes]) -> None:
    wire = b"".join(codec.header_field(k, v) for k, v in headers.items())
    assert codec.decode_header_fields(wire) == headers


def test_decode_header_fields_names_bytes_that_are_not_headers() -> None:
    with pytest.raises(codec.UndecodablePayloadError, match="3 bytes are not encoded message headers"):
        codec.decode_header_fields(b"\x4a\x09\x0a")


def test_encode_many_refuses_a_too_large_record_with_the_codec_error() -> None:
    enc = codec.PublishEncoder(max_payload=100)
    with pytest.raises(codec.PayloadTooLargeError, match="over the limit of 100 bytes"):
        enc.encode_many([b"x", b"x" * 200], [b"a", b"b"], [b"", b""], [-1, -1])


def test_encode_values_is_encode_value_per_pair() -> None:
    enc = codec.PublishEncoder(ack_inbox="in")
    values = [b"a", b"", b"c" * 300]
    cids = [b"p-0", b"p-1", b"p-22"]
    assert enc.encode_values(values, cids) == [enc.encode_value(v, c) for v, c in zip(values, cids, strict=True)]


def test_too_large_message_is_refused_with_the_codec_error() -> None:
    enc = codec.PublishEncoder(max_payload=100)
    assert enc.encode_value(b"x" * 50, b"c")  # fits
    with pytest.raises(codec.PayloadTooLargeError, match="over the limit of 100 bytes"):
        enc.encode_value(b"x" * 200, b"c")
    with pytest.raises(codec.PayloadTooLargeError):
        enc.encode(b"x" * 200, b"c", key=b"k")


def test_framer_frames_as_encode() -> None:
    for msg_type in (codec.MsgType.PUBLISH, codec.MsgType.ACK, codec.MsgType.PARTITION_NOTIFICATION):
        for crc in (True, False):
            frame = codec.framer(msg_type, crc=crc)
            for payload in (b"", b"p", b"q" * 1000):
                assert frame(payload) == codec.encode(payload, msg_type, crc=crc)
    with pytest.raises(codec.UnexpectedMessageTypeError):
        codec.framer(15)
    with pytest.raises(codec.PayloadTooLargeError):
        codec.framer(max_payload=3)(b"four")
    assert codec.header_of(codec.MsgType.ACK, crc=False) == bytes.fromhex("b9 0e 43 b4 00 08 00 01")


ACK = api_pb2.Ack(
    stream="s",
    partitionSubject="s",
    msgSubject="s.2",
    offset=41,
    ackInbox="_INBOX.a",
    correlationId="c-9",
    ackPolicy=api_pb2.ALL,
    receptionTimestamp=1,
    commitTimestamp=2,
    ackError=api_pb2.Ack.INCORRECT_OFFSET,
)


@pytest.mark.parametrize("crc", [False, True])
def test_ack_decoder_reads_what_unmarshal_ack_reads(crc: bool) -> None:
    decode = codec.AckDecoder()
    frame = codec.encode_ack(ACK, crc=crc)
    assert decode(frame) == codec.unmarshal_ack(frame) == ACK
    # One reused object: the next call overwrites it, fields absent from the next ack included.
    first = decode(frame)
    second = decode(codec.encode_ack(api_pb2.Ack(stream="t")))
    assert first is second and second.stream == "t" and second.offset == 0 and second.correlationId == ""


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (b"\xb9\x0e\x43", codec.TruncatedEnvelopeError),
        (b"\x00\x0e\x43\xb4\x00\x08\x00\x01" + ACK.SerializeToString(), codec.BadMagicError),
        (codec.new_message(b"v"), codec.UnexpectedMessageTypeError),
        (codec.header_of(codec.MsgType.ACK, crc=False) + b"\xff\xff\xff", codec.UndecodablePayloadError),
        (bytes.fromhex("b9 0e 43 b4 00 0c 01 01 00 00 00 00") + ACK.SerializeToString(), codec.CrcMismatchError),
    ],
)
def test_ack_decoder_refuses_what_unmarshal_ack_refuses(frame: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        codec.unmarshal_ack(frame)
    with pytest.raises(error):
        codec.AckDecoder()(frame)


def test_ack_decoder_size_limit() -> None:
    frame = codec.encode_ack(ACK)
    size = len(frame) - codec.HEADER_LEN
    assert codec.AckDecoder(max_payload=size)(frame).offset == 41
    with pytest.raises(codec.PayloadTooLargeError):
        codec.AckDecoder(max_payload=size - 1)(frame)
