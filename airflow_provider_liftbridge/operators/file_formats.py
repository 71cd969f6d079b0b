"""Read files as streams of rows without loading them whole.

Each reader takes an open binary file object and yields ``(value, key_source)`` pairs one record
at a time: ``value`` is what is published, ``key_source`` the mapping a ``key_field`` is looked up
in (``None`` for formats without fields). Parquet is read one record batch at a time.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeFileError
from airflow_provider_liftbridge.extras import MissingExtraError, needs_extra
from airflow_provider_liftbridge.validation import check_choice

from .records import to_bytes

__all__ = ["FORMATS", "FileFormat", "ReadOptions", "check_file_format", "detect_format", "read_rows"]

Row = tuple[bytes, Mapping[str, Any] | None]

#: Formats by name, with the file suffixes ``format="auto"`` maps to them.
FORMATS: dict[str, tuple[str, ...]] = {
    "lines": (".txt", ".log"),
    "jsonl": (".jsonl", ".ndjson"),
    "csv": (".csv", ".tsv"),
    "parquet": (".parquet", ".pq"),
    "whole": (),
}


class ReadOptions:
    """How to read the rows of a file.

    :param encoding: text encoding of lines/CSV files (values are re-encoded as UTF-8 JSON for CSV).
    :param skip_empty_lines: skip blank lines in ``lines`` and ``jsonl`` files.
    :param csv_delimiter: field delimiter of CSV files (``"\\t"`` for TSV).
    :param csv_header: the first CSV row names the fields (rows publish as JSON objects); without
        it rows publish as JSON arrays and ``key_field`` is a column number.
    :param batch_rows: Parquet rows read per batch (bounds memory).
    :param max_whole_file_bytes: largest file ``whole`` publishes as one message.
    """

    def __init__(
        self,
        *,
        encoding: str = "utf-8",
        skip_empty_lines: bool = True,
        csv_delimiter: str = ",",
        csv_header: bool = True,
        batch_rows: int = 1000,
        max_whole_file_bytes: int = 1024 * 1024,
    ) -> None:
        self.encoding = encoding
        self.skip_empty_lines = skip_empty_lines
        self.csv_delimiter = csv_delimiter
        self.csv_header = csv_header
        self.batch_rows = batch_rows
        self.max_whole_file_bytes = max_whole_file_bytes


@dataclass(frozen=True)
class FileFormat:
    """How ``LiftbridgePublishFileOperator`` reads its files: the format and the reading options,
    one value (``format="csv"`` is ``FileFormat("csv")``).

    :param name: ``"auto"`` (by suffix, unknown suffixes read as ``lines``), ``"lines"``,
        ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"whole"``.
    :param encoding: text encoding of lines/JSONL/CSV files (CSV values are re-encoded as UTF-8 JSON).
    :param skip_empty_lines: skip blank lines in ``lines`` and ``jsonl`` files.
    :param csv_delimiter: field delimiter of CSV files (``"\\t"`` for TSV).
    :param csv_header: the first CSV row names the fields (rows publish as JSON objects); without
        it rows publish as JSON arrays.
    :param max_whole_file_bytes: largest file ``whole`` publishes as one message.
    :raises LiftbridgeArgumentError: an unknown format name or a bad option (names it and the fix).
    """

    name: str = "auto"
    encoding: str = "utf-8"
    skip_empty_lines: bool = True
    csv_delimiter: str = ","
    csv_header: bool = True
    max_whole_file_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.name != "auto" and self.name not in FORMATS:
            raise LiftbridgeArgumentError(f"format {self.name!r} is unknown; use auto or one of {', '.join(FORMATS)}")
        if not isinstance(self.csv_delimiter, str) or len(self.csv_delimiter) != 1:
            raise LiftbridgeArgumentError(f"csv_delimiter must be one character, got {self.csv_delimiter!r}")
        if not isinstance(self.max_whole_file_bytes, int) or self.max_whole_file_bytes < 1:
            raise LiftbridgeArgumentError(
                f"max_whole_file_bytes must be a positive number of bytes, got {self.max_whole_file_bytes!r}"
            )

    def read_options(self, batch_rows: int) -> ReadOptions:
        """The reading options of this format, reading Parquet ``batch_rows`` rows at a time."""
        return ReadOptions(
            encoding=self.encoding,
            skip_empty_lines=self.skip_empty_lines,
            csv_delimiter=self.csv_delimiter,
            csv_header=self.csv_header,
            batch_rows=batch_rows,
            max_whole_file_bytes=self.max_whole_file_bytes,
        )


def check_file_format(value: Any, name: str = "format") -> FileFormat:
    """``value`` as a :class:`FileFormat`: a format name, or a ``FileFormat``.

    :raises LiftbridgeArgumentError: anything else, or an unknown name.
    """
    if isinstance(value, FileFormat):
        return value
    if isinstance(value, str):
        return FileFormat(check_choice(("auto", *FORMATS))(value, name))
    raise LiftbridgeArgumentError(
        f"{name}={value!r} is not valid: give a format name or a FileFormat, e.g. {name}=FileFormat('csv', "
        "csv_delimiter=';')"
    )


def detect_format(name: str, requested: str) -> str:
    """The format to read ``name`` with: ``requested``, or by suffix when it is ``"auto"``
    (unknown suffixes read as ``lines``).

    :raises LiftbridgeArgumentError: ``requested`` is not a known format.
    """
    if requested != "auto":
        if requested not in FORMATS:
            raise LiftbridgeArgumentError(f"format {requested!r} is unknown; use auto or one of {', '.join(FORMATS)}")
        return requested
    lowered = name.lower()
    for fmt, suffixes in FORMATS.items():
        if lowered.endswith(suffixes):
            return fmt
    return "lines"


def _strip_eol(line: bytes) -> bytes:
    return line[:-2] if line.endswith(b"\r\n") else line[:-1] if line.endswith(b"\n") else line


def _lines(handle: IO[bytes], name: str, options: ReadOptions) -> Iterator[Row]:
    for line in handle:
        value = _strip_eol(line)
        if options.skip_empty_lines and not value.strip():
            continue
        if options.encoding.lower().replace("-", "") not in ("utf8", "ascii"):
            value = value.decode(options.encoding).encode("utf-8")
        yield value, None


def _jsonl(handle: IO[bytes], name: str, options: ReadOptions) -> Iterator[Row]:
    for number, line in enumerate(handle, start=1):
        value = _strip_eol(line).strip()
        if not value:
            if options.skip_empty_lines:
                continue
            raise LiftbridgeFileError(f"{name}: line {number} is empty, not JSON")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise LiftbridgeFileError(f"{name}: line {number} is not JSON: {exc.msg}") from None
        # The line is published as written (no re-encoding); the parse gives the key.
        yield value, parsed if isinstance(parsed, Mapping) else None


def _csv(handle: IO[bytes], name: str, options: ReadOptions) -> Iterator[Row]:
    text = io.TextIOWrapper(handle, encoding=options.encoding, newline="")
    try:
        reader = csv.reader(text, delimiter=options.csv_delimiter)
        header: list[str] | None = None
        for row in reader:
            if options.csv_header and header is None:
                header = row
                continue
            if header is not None:
                if len(row) != len(header):
                    raise LiftbridgeFileError(
                        f"{name}: CSV line {reader.line_num} has {len(row)} field(s), the header has {len(header)}"
                    )
                record = dict(zip(header, row, strict=True))
                yield to_bytes(record), record
            else:
                yield to_bytes(row), {str(i): v for i, v in enumerate(row)}
    finally:
        text.detach()  # leave the underlying file to its owner


def _parquet(handle: IO[bytes], name: str, options: ReadOptions) -> Iterator[Row]:
    try:
        with needs_extra("files", "format 'parquet'"):
            import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except MissingExtraError as exc:
        raise LiftbridgeArgumentError(str(exc)) from None
    try:
        parquet = pq.ParquetFile(handle)
    except Exception as exc:  # pyarrow raises its own error types for corrupt files
        raise LiftbridgeFileError(f"{name}: not a readable Parquet file: {exc}") from None
    for batch in parquet.iter_batches(batch_size=options.batch_rows):
        for row in batch.to_pylist():
            yield to_bytes(row), row


def _whole(handle: IO[bytes], name: str, options: ReadOptions) -> Iterator[Row]:
    data = handle.read(options.max_whole_file_bytes + 1)
    if len(data) > options.max_whole_file_bytes:
        raise LiftbridgeFileError(
            f"{name}: larger than max_whole_file_bytes ({options.max_whole_file_bytes}); "
            "publish it as rows (lines, jsonl, csv, parquet) or raise the limit"
        )
    yield data, None


_READERS: dict[str, Callable[[IO[bytes], str, ReadOptions], Iterator[Row]]] = {
    "lines": _lines,
    "jsonl": _jsonl,
    "csv": _csv,
    "parquet": _parquet,
    "whole": _whole,
}


def read_rows(handle: IO[bytes], name: str, fmt: str, options: ReadOptions) -> Iterator[Row]:
    """Yield the rows of an open binary file in format ``fmt`` (see :data:`FORMATS`).

    :raises LiftbridgeFileError: a row is malformed (the message names the file and line).
    :raises UnicodeDecodeError: the text does not match ``encoding``.
    """
    return _READERS[fmt](handle, name, options)
