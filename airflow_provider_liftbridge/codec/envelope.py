"""Framing of the Liftbridge NATS envelope.

Layout (all multi-byte integers big-endian)::

    0..3   magic   B9 0E 43 B4
    4      version 0
    5      header length = offset of the payload (8, or 12 with CRC)
    6      flags   bit 0: CRC-32C present
    7      message type (see :class:`MsgType`)
    8..11  CRC-32C (Castagnoli) of the payload, only when flag bit 0 is set
    ...    payload (a protobuf)

This module knows nothing about protobuf; :mod:`.messages` builds on it.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import google_crc32c

from .errors import (
    BadHeaderLengthError,
    BadMagicError,
    CrcMismatchError,
    PayloadTooLargeError,
    TruncatedEnvelopeError,
    UnexpectedMessageTypeError,
    UnknownFlagsError,
    UnsupportedVersionError,
)

MAGIC = b"\xb9\x0e\x43\xb4"
VERSION = 0
FLAG_CRC32C = 0x01
HEADER_LEN = 8
HEADER_LEN_WITH_CRC = 12
#: NATS' default ``max_payload`` is 1 MiB for the whole message; the envelope
#: header takes up to 12 bytes of it.
DEFAULT_MAX_PAYLOAD = 1024 * 1024 - HEADER_LEN_WITH_CRC

_HEAD = struct.Struct(">4sBBBB")
_HEAD_CRC = struct.Struct(">4sBBBBI")
_CRC = struct.Struct(">I")
_crc32c = google_crc32c.value


class MsgType(enum.IntEnum):
    """Message types of the envelope (0 and 1 are client-facing, the rest are server-internal)."""

    PUBLISH = 0
    ACK = 1
    REPLICATION_REQUEST = 2
    REPLICATION_RESPONSE = 3
    RAFT_JOIN_REQUEST = 4
    RAFT_JOIN_RESPONSE = 5
    LEADER_EPOCH_OFFSET_REQUEST = 6
    LEADER_EPOCH_OFFSET_RESPONSE = 7
    PROPAGATED_REQUEST = 8
    PROPAGATED_RESPONSE = 9
    SERVER_INFO_REQUEST = 10
    SERVER_INFO_RESPONSE = 11
    PARTITION_STATUS_REQUEST = 12
    PARTITION_STATUS_RESPONSE = 13
    PARTITION_NOTIFICATION = 14


_MAX_TYPE = max(MsgType)


class Envelope(NamedTuple):
    """A decoded frame. ``payload`` is a zero-copy view into the input buffer."""

    msg_type: MsgType
    flags: int
    crc: int | None
    payload: memoryview


def encode(
    payload: bytes,
    msg_type: MsgType | int = MsgType.PUBLISH,
    *,
    crc: bool = True,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> bytes:
    """Frame ``payload`` as an envelope of ``msg_type``, writing a CRC-32C when ``crc`` is true.

    :raises PayloadTooLargeError: the payload is longer than ``max_payload``.
    :raises UnexpectedMessageTypeError: ``msg_type`` is not one of the 15 envelope types.
    """
    if len(payload) > max_payload:
        raise PayloadTooLargeError(
            f"payload is {len(payload)} bytes, over the limit of {max_payload} bytes; "
            "split the record or raise max_payload (and the NATS server's max_payload)"
        )
    if not 0 <= msg_type <= _MAX_TYPE:
        raise UnexpectedMessageTypeError(f"message type {msg_type} is not an envelope type (0..{_MAX_TYPE})")
    if crc:
        return _HEAD_CRC.pack(MAGIC, VERSION, HEADER_LEN_WITH_CRC, FLAG_CRC32C, msg_type, _crc32c(payload)) + payload
    return _HEAD.pack(MAGIC, VERSION, HEADER_LEN, 0, msg_type) + payload


def decode(
    data: bytes | bytearray | memoryview,
    expected_type: MsgType | int | None = None,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Envelope:
    """Validate the envelope header of ``data`` and return its parts without copying the payload.

    :param expected_type: when given, any other message type is refused.
    :raises TruncatedEnvelopeError: fewer bytes than the header needs.
    :raises BadMagicError, UnsupportedVersionError, BadHeaderLengthError, UnknownFlagsError:
        a malformed header field.
    :raises UnexpectedMessageTypeError: unknown type, or not ``expected_type``.
    :raises PayloadTooLargeError: the payload is longer than ``max_payload``.
    :raises CrcMismatchError: the stored CRC-32C does not match the payload.
    """
    view = memoryview(data)
    size = len(view)
    if size < HEADER_LEN:
        raise TruncatedEnvelopeError(f"envelope is {size} bytes, shorter than the {HEADER_LEN}-byte header")
    magic, version, header_len, flags, msg_type = _HEAD.unpack_from(view)
    if magic != MAGIC:
        raise BadMagicError(f"magic number is {magic.hex(' ')}, expected b9 0e 43 b4: not a Liftbridge envelope")
    if version != VERSION:
        raise UnsupportedVersionError(f"envelope version {version} is not supported (only version 0 exists)")
    if flags & ~FLAG_CRC32C:
        raise UnknownFlagsError(f"unknown flag bits 0x{flags & ~FLAG_CRC32C:02x} set (only bit 0, CRC-32C, is defined)")
    has_crc = bool(flags & FLAG_CRC32C)
    want_len = HEADER_LEN_WITH_CRC if has_crc else HEADER_LEN
    if header_len != want_len:
        raise BadHeaderLengthError(
            f"header length is {header_len}, expected {want_len} for an envelope "
            f"{'with' if has_crc else 'without'} CRC-32C"
        )
    if size < header_len:
        raise TruncatedEnvelopeError(f"envelope is {size} bytes, shorter than its {header_len}-byte header")
    if msg_type > _MAX_TYPE:
        raise UnexpectedMessageTypeError(f"message type {msg_type} is not an envelope type (0..{_MAX_TYPE})")
    if expected_type is not None and msg_type != expected_type:
        raise UnexpectedMessageTypeError(
            f"message type is {MsgType(msg_type).name} ({msg_type}), expected {MsgType(expected_type).name}"
        )
    payload = view[header_len:]
    if len(payload) > max_payload:
        raise PayloadTooLargeError(f"payload is {len(payload)} bytes, over the limit of {max_payload} bytes")
    stored: int | None = None
    if has_crc:
        (stored,) = _CRC.unpack_from(view, HEADER_LEN)
        # google-crc32c's C API takes only bytes: this is the one copy decoding makes,
        # and the parser reuses it, so the payload is copied at most once.
        payload = memoryview(bytes(payload))
        actual = _crc32c(payload.obj)
        if actual != stored:
            raise CrcMismatchError(
                f"CRC-32C mismatch: header says 0x{stored:08x}, payload hashes to 0x{actual:08x} "
                "(the message was corrupted or is not a Liftbridge envelope)"
            )
    return Envelope(MsgType(msg_type), flags, stored, payload)


def is_envelope(data: bytes | bytearray | memoryview) -> bool:
    """Cheap check: does ``data`` start with the envelope magic number?"""
    return len(data) >= HEADER_LEN and bytes(data[:4]) == MAGIC
