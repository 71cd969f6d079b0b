"""Payload compression: ``gzip`` or ``zstd`` values, marked by a ``content-encoding`` header.

A publisher asked for ``compression="gzip"`` (or ``"zstd"``) compresses each record's value before
the record is enveloped (so the envelope's CRC and the max-payload check see the compressed bytes)
and adds the header ``content-encoding: gzip``. A subscription of this client sees the header,
decompresses the value and drops the header, so the caller gets the original record. Any other
reader (another client, a plain NATS subscriber) gets the compressed bytes and the header saying
how to read them. A value that does not decompress is delivered as stored, header included.

``zstd`` needs the ``zstandard`` package (the ``zstd`` extra); ``gzip`` is in the standard library.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Mapping
from typing import Any, Literal

from airflow_provider_liftbridge.extras import MissingExtraError, needs_extra

from .errors import InvalidArgumentError

__all__ = [
    "CODECS",
    "COMPRESSION_HEADER",
    "Compression",
    "check_compression",
    "compress_record",
    "compressor",
    "decompress_value",
]

#: The header that names a value's codec.
COMPRESSION_HEADER = "content-encoding"
#: What ``compression=`` accepts besides ``None``.
CODECS = ("gzip", "zstd")
Compression = Literal["gzip", "zstd"] | None
#: gzip level: 6 is zlib's default balance of speed and size.
GZIP_LEVEL = 6
#: zstd level: 3 is zstandard's default.
ZSTD_LEVEL = 3


def check_compression(value: Any) -> Compression:
    """``value`` if it is ``None``, ``"gzip"`` or ``"zstd"`` (``"none"`` and ``""`` mean ``None``).

    :raises InvalidArgumentError: anything else, or ``"zstd"`` without the ``zstandard`` package.
    """
    if value is None or value == "" or (isinstance(value, str) and value.lower() == "none"):
        return None
    if not isinstance(value, str) or value.lower() not in CODECS:
        raise InvalidArgumentError(f"compression must be 'gzip', 'zstd' or None, got {value!r}")
    codec = value.lower()
    if codec == "zstd":
        _zstandard()
    return codec  # type: ignore[return-value]


def _zstandard() -> Any:
    try:
        with needs_extra("zstd", "compression='zstd'"):
            import zstandard
    except MissingExtraError as exc:
        raise InvalidArgumentError(f"{exc} (or use compression='gzip')") from None
    return zstandard


def compressor(codec: Compression) -> Callable[[bytes], bytes] | None:
    """A function compressing one value with ``codec`` (``None`` for no compression).

    :raises InvalidArgumentError: see :func:`check_compression`.
    """
    codec = check_compression(codec)
    if codec is None:
        return None
    if codec == "gzip":
        # mtime=0: the same value always compresses to the same bytes.
        return lambda value: gzip.compress(value, compresslevel=GZIP_LEVEL, mtime=0)
    zc = _zstandard().ZstdCompressor(level=ZSTD_LEVEL)
    return zc.compress  # type: ignore[no-any-return]


def _decompress(codec: bytes, value: bytes) -> bytes | None:
    try:
        if codec == b"gzip":
            return zlib.decompress(value, wbits=31)
        if codec == b"zstd":
            return _zstandard().ZstdDecompressor().decompress(value)  # type: ignore[no-any-return]
    except Exception:  # a foreign or broken value (or no zstandard) is delivered as stored
        return None
    return None


def decompress_value(value: bytes, headers: Mapping[str, bytes]) -> tuple[bytes, dict[str, bytes]] | None:
    """``(original value, headers without the codec header)`` of a value published with compression,
    or ``None`` when it cannot be read back (unknown codec, corrupt data, zstd not installed)."""
    original = _decompress(headers[COMPRESSION_HEADER], value)
    if original is None:
        return None
    return original, {k: v for k, v in headers.items() if k != COMPRESSION_HEADER}


def compress_record(record: Any, compress: Callable[[bytes], bytes], codec: str) -> Any:
    """A copy of a :class:`~.types.Record` with its value compressed and the codec header added.

    The header is set last, so a record that already carried a ``content-encoding`` header is
    marked with the codec actually used.
    """
    from .types import Record

    headers = dict(record.headers or {})
    headers[COMPRESSION_HEADER] = codec.encode()
    return Record(
        compress(bytes(record.value)),
        key=record.key,
        headers=headers,
        partition=record.partition,
        expected_offset=record.expected_offset,
        correlation_id=record.correlation_id,
    )
