"""The Liftbridge NATS envelope codec: framing, CRC-32C, and Message/Ack payloads.

The single core every NATS-facing part of the provider uses (client bulk publishing,
ack inboxes, the subscriber trigger, the dev server). Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

from .envelope import (
    DEFAULT_MAX_PAYLOAD,
    FLAG_CRC32C,
    HEADER_LEN,
    HEADER_LEN_WITH_CRC,
    MAGIC,
    VERSION,
    Envelope,
    MsgType,
    decode,
    encode,
    framer,
    header_of,
    is_envelope,
)
from .errors import (
    BadHeaderLengthError,
    BadMagicError,
    CrcMismatchError,
    EnvelopeError,
    PayloadTooLargeError,
    TruncatedEnvelopeError,
    UndecodablePayloadError,
    UnexpectedMessageTypeError,
    UnknownFlagsError,
    UnsupportedVersionError,
)
from .messages import (
    NO_EXPECTED_OFFSET,
    AckDecoder,
    PublishEncoder,
    encode_ack,
    encode_message,
    new_message,
    unmarshal_ack,
    unmarshal_message,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "FLAG_CRC32C",
    "HEADER_LEN",
    "HEADER_LEN_WITH_CRC",
    "MAGIC",
    "NO_EXPECTED_OFFSET",
    "VERSION",
    "AckDecoder",
    "BadHeaderLengthError",
    "BadMagicError",
    "CrcMismatchError",
    "Envelope",
    "EnvelopeError",
    "MsgType",
    "PayloadTooLargeError",
    "PublishEncoder",
    "TruncatedEnvelopeError",
    "UndecodablePayloadError",
    "UnexpectedMessageTypeError",
    "UnknownFlagsError",
    "UnsupportedVersionError",
    "decode",
    "encode",
    "encode_ack",
    "encode_message",
    "framer",
    "header_of",
    "is_envelope",
    "new_message",
    "unmarshal_ack",
    "unmarshal_message",
]
