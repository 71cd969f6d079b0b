"""Fuzzing the decoder: random and mutated bytes may only ever raise the codec's own errors.

The default run feeds a few thousand inputs; ``python -m tests.codec.fuzz_long`` runs a million.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_liftbridge import codec
from airflow_provider_liftbridge._proto import api_pb2

SEEDS = [
    codec.new_message(b"value", key=b"k", headers={"h": b"1"}, correlation_id="c1"),
    codec.new_message(b"", crc=False),
    codec.encode_ack(api_pb2.Ack(stream="s", offset=7, correlationId="c")),
    codec.encode_ack(api_pb2.Ack(stream="s", offset=7), crc=True),
]


def decode_any(data: bytes) -> None:
    """Feed ``data`` to every decoding entry point; only EnvelopeError may escape."""
    for fn in (codec.decode, codec.unmarshal_message, codec.unmarshal_ack, _ACK_DECODER):
        try:
            fn(data)
        except codec.EnvelopeError:
            pass


_ACK_DECODER = codec.AckDecoder()  # reused across inputs, as the bulk path reuses it across acks


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        if op == 0 and buf:
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        elif op == 1 and buf:
            del buf[rng.randrange(len(buf)) :]
        elif op == 2:
            buf.insert(rng.randrange(len(buf) + 1), rng.randrange(256))
        else:
            buf += rng.randbytes(rng.randint(1, 8))
    return bytes(buf)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_raise_only_codec_errors(data: bytes) -> None:
    decode_any(data)
    decode_any(codec.MAGIC + data)  # past the magic check, into the header fields


def test_mutated_frames_raise_only_codec_errors() -> None:
    rng = random.Random(20261122)
    for i in range(20_000):
        decode_any(mutate(rng, SEEDS[i % len(SEEDS)]))
