"""Codec micro-benchmark: envelope framing + CRC-32C, and full Ack/Message encode + decode.

    python bench/codec_bench.py

Prints a markdown table of microseconds per operation (best of 5 runs) and the machine.
"""

from __future__ import annotations

import os
import platform
import timeit

from airflow_provider_liftbridge import codec
from airflow_provider_liftbridge._proto import api_pb2

VALUE = os.urandom(100)
ACK = api_pb2.Ack(
    stream="bench",
    partitionSubject="bench",
    msgSubject="bench",
    offset=123456,
    ackInbox="_INBOX.abcdefghijklmnop",
    correlationId="0123456789abcdef",
    receptionTimestamp=1_700_000_000_000_000_000,
    commitTimestamp=1_700_000_000_000_000_001,
)
PAYLOAD = api_pb2.Message(value=VALUE, correlationId="0123456789abcdef").SerializeToString()
FRAME = codec.encode(PAYLOAD)
ACK_FRAME = codec.encode_ack(ACK, crc=True)
ACK_FRAME_NO_CRC = codec.encode_ack(ACK)  # what a broker sends to an ack inbox
ENCODER = codec.PublishEncoder(ack_inbox="_INBOX.abcdefghijklmnop")
DECODER = codec.AckDecoder()


def per_op_us(stmt: object, number: int = 50_000) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    rows = [
        ("frame + CRC-32C (encode), 100-byte value", per_op_us(lambda: codec.encode(PAYLOAD)), 1.0),
        ("unframe + CRC-32C check (decode)", per_op_us(lambda: codec.decode(FRAME)), 1.0),
        ("frame without CRC (encode)", per_op_us(lambda: codec.encode(PAYLOAD, crc=False)), None),
        ("new_message (protobuf + frame + CRC)", per_op_us(lambda: codec.new_message(VALUE, correlation_id="c")), None),
        ("Ack encode + decode with CRC", per_op_us(lambda: codec.unmarshal_ack(codec.encode_ack(ACK, crc=True))), None),
        ("Ack decode with CRC", per_op_us(lambda: codec.unmarshal_ack(ACK_FRAME)), None),
        (
            "PublishEncoder.encode_value (same bytes as new_message)",
            per_op_us(lambda: ENCODER.encode_value(VALUE, b"c")),
            None,
        ),
        ("AckDecoder, broker-style ack (no CRC)", per_op_us(lambda: DECODER(ACK_FRAME_NO_CRC)), None),
        ("unmarshal_ack, broker-style ack (no CRC)", per_op_us(lambda: codec.unmarshal_ack(ACK_FRAME_NO_CRC)), None),
    ]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print()
    print("| operation | µs/op | target |")
    print("|---|---:|---:|")
    for name, us, target in rows:
        bound = f"≤ {target:.1f}" if target else ""
        print(f"| {name} | {us:.2f} | {bound} |")


if __name__ == "__main__":
    main()
