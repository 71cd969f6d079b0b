"""Errors raised by the envelope codec: one family, one subclass per way a frame can be wrong."""

from __future__ import annotations


class EnvelopeError(ValueError):
    """Base class of every error the codec raises. Each message names what was wrong."""


class TruncatedEnvelopeError(EnvelopeError):
    """The buffer is shorter than the header it claims to have."""


class BadMagicError(EnvelopeError):
    """The first four bytes are not the Liftbridge magic number ``B9 0E 43 B4``."""


class UnsupportedVersionError(EnvelopeError):
    """The envelope version byte is not one this codec speaks (only 0 exists)."""


class BadHeaderLengthError(EnvelopeError):
    """The header-length byte does not match the flags (8 without CRC, 12 with)."""


class UnknownFlagsError(EnvelopeError):
    """Flag bits other than bit 0 (CRC-32C present) are set."""


class CrcMismatchError(EnvelopeError):
    """The CRC-32C stored in the header does not match the payload."""


class UnexpectedMessageTypeError(EnvelopeError):
    """The message-type byte is unknown, or not the type the caller asked for."""


class PayloadTooLargeError(EnvelopeError):
    """The payload is larger than the configured maximum."""


class UndecodablePayloadError(EnvelopeError):
    """The payload is not a valid protobuf of the expected message."""
