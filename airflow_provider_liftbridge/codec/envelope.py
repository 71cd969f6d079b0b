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
from collections.abc import Callable
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
#: The CRC-32C field of an envelope (big-endian uint32), and the checksum itself.
CRC_FIELD = struct.Struct(">I")
crc32c = google_crc32c.value


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
_VALID_HEADERS: dict[bytes, tuple[MsgType, bool]] = {
    _HEAD.pack(MAGIC, VERSION, HEADER_LEN_WITH_CRC if crc else HEADER_LEN, FLAG_CRC32C if crc else 0, t): (t, crc)
    for t in MsgType
    for crc in (False, True)
}


class Envelope(NamedTuple):
    """A decoded frame. ``payload`` is a zero-copy view into the input buffer."""

    msg_type: MsgType
    flags: int
    crc: int | None
    payload: memoryview


# NamedTuple's generated __new__ is Python code; building the tuple directly halves the cost.
_new_envelope = tuple.__new__


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
        return _HEAD_CRC.pack(MAGIC, VERSION, HEADER_LEN_WITH_CRC, FLAG_CRC32C, msg_type, crc32c(payload)) + payload
    return _HEAD.pack(MAGIC, VERSION, HEADER_LEN, 0, msg_type) + payload


def header_of(msg_type: MsgType | int, *, crc: bool) -> bytes:
    """The fixed 8 first bytes of every well-formed envelope of ``msg_type`` with or without a
    CRC (with one, the CRC-32C of the payload follows them).

    :raises UnexpectedMessageTypeError: ``msg_type`` is not one of the 15 envelope types.
    """
    if not 0 <= msg_type <= _MAX_TYPE:
        raise UnexpectedMessageTypeError(f"message type {msg_type} is not an envelope type (0..{_MAX_TYPE})")
    return _HEAD.pack(MAGIC, VERSION, HEADER_LEN_WITH_CRC if crc else HEADER_LEN, FLAG_CRC32C if crc else 0, msg_type)


def framer(
    msg_type: MsgType | int = MsgType.PUBLISH,
    *,
    crc: bool = True,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Callable[[bytes], bytes]:
    """A framing function for one message type and CRC setting: ``framer(t, crc=c)(payload)``
    returns the same bytes as ``encode(payload, t, crc=c)``, with the header built once rather
    than on every call (for encoders that frame many payloads of one kind).

    :raises UnexpectedMessageTypeError: ``msg_type`` is not one of the 15 envelope types.
    :raises PayloadTooLargeError: (from the returned function) the payload is longer than
        ``max_payload``.
    """
    head = header_of(msg_type, crc=crc)
    pack_crc = CRC_FIELD.pack

    def too_large(payload: bytes) -> bytes:
        return encode(payload, msg_type, crc=crc, max_payload=max_payload)  # raises, with the one message

    if crc:

        def frame_crc(payload: bytes) -> bytes:
            if len(payload) > max_payload:
                return too_large(payload)
            return head + pack_crc(crc32c(payload)) + payload

        return frame_crc

    def frame(payload: bytes) -> bytes:
        if len(payload) > max_payload:
            return too_large(payload)
        return head + payload

    return frame


def decode(
    data: bytes | bytearray | memoryview,
    expected_type: MsgType | int | None = None,
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> Envelope:
    """Validate the envelope header of ``data`` and return its parts.

    Without a CRC the payload is a zero-copy view into ``data``; with one, the payload is copied
    once (google-crc32c hashes only ``bytes``) and the view points at that copy.

    :param expected_type: when given, any other message type is refused.
    :raises TruncatedEnvelopeError: fewer bytes than the header needs.
    :raises BadMagicError, UnsupportedVersionError, BadHeaderLengthError, UnknownFlagsError:
        a malformed header field.
    :raises UnexpectedMessageTypeError: unknown type, or not ``expected_type``.
    :raises PayloadTooLargeError: the payload is longer than ``max_payload``.
    :raises CrcMismatchError: the stored CRC-32C does not match the payload.
    """
    # Fast path: a well-formed header is one of 30 byte strings; anything else goes through
    # the field-by-field checks, which exist to name what is wrong.
    head = data[:HEADER_LEN]
    known = _VALID_HEADERS.get(head if type(head) is bytes else bytes(head))
    if known is None:
        _raise_header_error(data)
    msg_type, has_crc = known  # type: ignore[misc]
    if expected_type is not None and msg_type != expected_type:
        raise UnexpectedMessageTypeError(
            f"message type is {msg_type.name} ({int(msg_type)}), expected {MsgType(expected_type).name}"
        )
    if not has_crc:
        payload = memoryview(data)[HEADER_LEN:]
        _check_size(len(payload), max_payload)
        return _new_envelope(Envelope, (msg_type, 0, None, payload))
    if len(data) < HEADER_LEN_WITH_CRC:
        raise TruncatedEnvelopeError(f"envelope is {len(data)} bytes, shorter than its 12-byte header")
    body = data[HEADER_LEN_WITH_CRC:]
    if type(body) is not bytes:
        body = bytes(body)
    _check_size(len(body), max_payload)
    (stored,) = CRC_FIELD.unpack_from(data, HEADER_LEN)
    actual = crc32c(body)
    if actual != stored:
        raise CrcMismatchError(
            f"CRC-32C mismatch: header says 0x{stored:08x}, payload hashes to 0x{actual:08x} "
            "(the message was corrupted or is not a Liftbridge envelope)"
        )
    return _new_envelope(Envelope, (msg_type, FLAG_CRC32C, stored, memoryview(body)))


def _check_size(size: int, max_payload: int) -> None:
    if size > max_payload:
        raise PayloadTooLargeError(f"payload is {size} bytes, over the limit of {max_payload} bytes")


def _raise_header_error(data: bytes | bytearray | memoryview) -> None:
    """Name the first thing wrong with a header that is not one of the valid ones."""
    size = len(data)
    if size < HEADER_LEN:
        raise TruncatedEnvelopeError(f"envelope is {size} bytes, shorter than the {HEADER_LEN}-byte header")
    magic, version, header_len, flags, msg_type = _HEAD.unpack_from(data)
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
    raise UnexpectedMessageTypeError(f"message type {msg_type} is not an envelope type (0..{_MAX_TYPE})")


def is_envelope(data: bytes | bytearray | memoryview) -> bool:
    """Cheap check: does ``data`` start with the envelope magic number?"""
    return len(data) >= HEADER_LEN and bytes(data[:4]) == MAGIC
