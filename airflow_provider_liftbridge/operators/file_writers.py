"""Write stream messages to JSON lines, CSV or Parquet files, in bounded memory.

The archiver (:mod:`~airflow_provider_liftbridge.operators.stream_to_file`) hands this module the
messages of one offset range; :func:`write_range` writes them to a temporary name beside the target
and renames it into place once complete, so a reader never sees half a file and a retry that writes
the same range replaces the file instead of adding one.

Columns, in order: ``stream``, ``partition``, ``offset``, ``timestamp``, ``key``, ``value``,
``headers``. How a value is written depends on ``value_format``:

- ``text``: UTF-8 text (a value that is not UTF-8 is an error naming its offset);
- ``bytes``: binary in Parquet, base64 text in JSON lines and CSV;
- ``json``: the value must be a JSON object; its fields become columns in place of ``value``
  (a field named like one of the other columns is written as ``value_<name>``). The columns of
  a CSV or Parquet file are those of the range's first rows (or ``json_schema``); a later value
  with another field, or a type that does not fit, is an error naming its offset.

``timestamp`` is a UTC timestamp: microseconds in Parquet (what Spark reads), ISO 8601 text with
nanoseconds in JSON lines and CSV. ``headers`` is a map of bytes in Parquet and a JSON object of
UTF-8 text elsewhere. Keys are UTF-8 text, except with ``value_format="bytes"``.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import datetime as dt
import io
import itertools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.client.reading import VALUE_FORMATS  # how values are written: the reading set
from airflow_provider_liftbridge.extras import needs_extra

with needs_extra("files", "writing stream files (LiftbridgeStreamToFileOperator)"):
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.json as pa_json  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeFileError

from .archive_files import (
    NO_END,
    WRITE_FORMATS,
    ArchivedFile,
    file_name,
    partition_prefix,
    temporary_name,
    temporary_prefix,
)

__all__ = [
    "COLUMNS",
    "VALUE_FORMATS",
    "WRITE_FORMATS",
    "ArchivedFile",
    "ArchiveValueError",
    "WriteOptions",
    "Reject",
    "file_name",
    "partition_prefix",
    "temporary_prefix",
    "write_range",
]

COLUMNS = ("stream", "partition", "offset", "timestamp", "key", "value", "headers")
_META = frozenset(COLUMNS) - {"value"}


class ArchiveValueError(LiftbridgeFileError):
    """A message cannot be written in the archive's format (not UTF-8, not a JSON object, a field
    that does not fit the file's columns). Names the message; nothing was committed past it.

    :ivar message: the message; :ivar problem: what is wrong with it and what to do.
    """

    def __init__(self, message: Message, problem: str) -> None:
        self.message = message
        self.problem = problem
        super().__init__(f"stream {message.stream!r} partition {message.partition} offset {message.offset}: {problem}")


@dataclass(frozen=True)
class WriteOptions:
    """How the archiver writes files.

    :param format: ``jsonl``, ``csv`` or ``parquet``.
    :param value_format: ``text``, ``bytes`` or ``json`` (see the module docstring).
    :param json_schema: with ``value_format="json"``: the value fields (as columns are named:
        ``value_<name>`` for a field named like another column) and their types as pyarrow type
        names (``{"id": "string", "amount": "float64"}``) for Parquet, or just the field names for
        CSV; default: the fields and types of the file's first rows.
    :param batch_rows: rows converted and written at a time (a Parquet row group at most);
        bounds memory.
    :param parquet_compression: Parquet's codec (``snappy``, ``zstd``, ``gzip``, ``none``).
    """

    format: str = "parquet"
    value_format: str = "text"
    json_schema: Mapping[str, str] | None = None
    batch_rows: int = 10_000
    parquet_compression: str = "snappy"

    def __post_init__(self) -> None:
        if self.format not in WRITE_FORMATS:
            raise LiftbridgeArgumentError(f"format {self.format!r} is unknown; use one of {', '.join(WRITE_FORMATS)}")
        if self.value_format not in VALUE_FORMATS:
            raise LiftbridgeArgumentError(
                f"value_format {self.value_format!r} is unknown; use one of {', '.join(VALUE_FORMATS)}"
            )
        if self.json_schema is not None and self.value_format != "json":
            raise LiftbridgeArgumentError("json_schema applies to value_format='json' only")
        if self.batch_rows < 1:
            raise LiftbridgeArgumentError(f"batch_rows must be at least 1, got {self.batch_rows}")
        if self.json_schema and self.format == "parquet":
            for name, type_name in self.json_schema.items():
                try:
                    pa.type_for_alias(type_name)
                except (ValueError, TypeError):
                    raise LiftbridgeArgumentError(
                        f"json_schema field {name!r}: {type_name!r} is not a pyarrow type name "
                        "(string, int64, float64, bool, timestamp[us], ...)"
                    ) from None


# -- converting messages ------------------------------------------------------------------------


def _iso(ns: int) -> str:
    seconds, nanos = divmod(ns, 1_000_000_000)
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{nanos:09d}Z"


def _iso_all(batch: Sequence[Message]) -> list[str]:
    """:func:`_iso` of every message's timestamp; the date and time of each second formatted once
    (a batch's messages share few seconds: 0.8 µs per message instead of 5)."""
    seconds_text: dict[int, str] = {}
    out = []
    for message in batch:
        seconds, nanos = divmod(message.timestamp, 1_000_000_000)
        prefix = seconds_text.get(seconds)
        if prefix is None:
            prefix = seconds_text[seconds] = f"{dt.datetime.fromtimestamp(seconds, dt.UTC):%Y-%m-%dT%H:%M:%S}."
        out.append(f"{prefix}{nanos:09d}Z")
    return out


#: One encoder for every row (``json.dumps`` with options builds a new one per call).
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _text(data: bytes, message: Message, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArchiveValueError(
            message,
            f"the {what} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
            "archive with value_format='bytes' to keep it as it is",
        ) from None


def _text_headers(message: Message) -> dict[str, str]:
    return {name: _text(value, message, f"header {name!r}") for name, value in message.headers.items()}


def _json_fields(message: Message) -> dict[str, Any]:
    try:
        parsed = json.loads(message.value)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArchiveValueError(
            message,
            f"the value is not JSON ({exc}); archive with value_format='text' or 'bytes', or send "
            "such messages to a dead-letter stream (dead_letters=DeadLetterStream(...))",
        ) from None
    if not isinstance(parsed, dict):
        raise ArchiveValueError(
            message,
            f"the value is JSON but not an object ({type(parsed).__name__}); value_format='json' "
            "makes an object's fields columns: archive with value_format='text'",
        )
    if _META.isdisjoint(parsed):
        return parsed
    return {(f"value_{name}" if name in _META else name): v for name, v in parsed.items()}


def _key_text(message: Message) -> str | None:
    return None if message.key is None else _text(message.key, message, "key")


def _first_unwritable(batch: Sequence[Message], value_format: str) -> None:
    """Raise the :class:`ArchiveValueError` of the batch's first message that cannot be written
    (its key, value, then headers), if there is one: the writers convert a batch column by column,
    so the error they met first may be a later message's."""
    for message in batch:
        if value_format != "bytes":
            _key_text(message)
            if value_format == "json":
                _json_fields(message)
            else:
                _text(message.value, message, "value")
        _text_headers(message)


class _Writer(Protocol):
    def write(self, batch: Sequence[Message]) -> None: ...

    def close(self) -> None: ...


class _JsonlWriter:
    """One JSON object per line; JSON values merged into the row object. A batch is converted
    column by column (timestamps, keys, values, headers), then encoded and written at once."""

    def __init__(self, handle: IO[bytes], options: WriteOptions) -> None:
        self._handle = handle
        self._options = options

    def write(self, batch: Sequence[Message]) -> None:
        try:
            rows = self._rows(batch)
        except ArchiveValueError:
            _first_unwritable(batch, self._options.value_format)
            raise
        self._handle.write(("\n".join(map(_ENCODE, rows)) + "\n").encode("utf-8"))

    def _rows(self, batch: Sequence[Message]) -> list[dict[str, Any]]:
        fmt = self._options.value_format
        stamps = _iso_all(batch)
        headers = [_text_headers(m) for m in batch]
        if fmt == "bytes":
            keys = [None if m.key is None else base64.b64encode(m.key).decode("ascii") for m in batch]
        else:
            keys = [None if m.key is None else _text(m.key, m, "key") for m in batch]
        if fmt == "json":
            fields = [_json_fields(m) for m in batch]
            rows = [
                {"stream": m.stream, "partition": m.partition, "offset": m.offset, "timestamp": t, "key": k}
                | f
                | {"headers": h}
                for m, t, k, f, h in zip(batch, stamps, keys, fields, headers, strict=True)
            ]
        else:
            if fmt == "bytes":
                values = [base64.b64encode(m.value).decode("ascii") for m in batch]
            else:
                values = [_text(m.value, m, "value") for m in batch]
            rows = [
                {
                    "stream": m.stream,
                    "partition": m.partition,
                    "offset": m.offset,
                    "timestamp": t,
                    "key": k,
                    "value": v,
                    "headers": h,
                }
                for m, t, k, v, h in zip(batch, stamps, keys, values, headers, strict=True)
            ]
        return rows

    def close(self) -> None:
        pass


def _extra_fields(rows: Sequence[dict[str, Any]], known: Iterable[str], messages: Sequence[Message]) -> None:
    """Raise for the first row with a field outside ``known`` (the file's columns are fixed)."""
    allowed = set(known)
    for row, message in zip(rows, messages, strict=True):
        extra = row.keys() - allowed
        if extra:
            raise ArchiveValueError(
                message,
                f"the value has field(s) {sorted(extra)} that the file's columns (from its first rows: "
                f"{sorted(allowed)}) lack; give json_schema with every field, or archive as jsonl",
            )


class _CsvWriter:
    """A header row, then one row per message; JSON fields, headers and nested values as JSON text."""

    def __init__(self, handle: IO[bytes], options: WriteOptions) -> None:
        self._text = io.TextIOWrapper(handle, encoding="utf-8", newline="", write_through=True)
        self._writer = csv.writer(self._text)
        self._options = options
        self._fields: list[str] | None = list(options.json_schema) if options.json_schema else None

    @staticmethod
    def _cell(value: Any) -> Any:
        if isinstance(value, dict | list):
            return _ENCODE(value)
        return "" if value is None else value

    def write(self, batch: Sequence[Message]) -> None:
        try:
            self._write(batch)
        except ArchiveValueError:
            _first_unwritable(batch, self._options.value_format)
            raise

    def _write(self, batch: Sequence[Message]) -> None:
        fmt = self._options.value_format
        if fmt == "json":
            values = [_json_fields(m) for m in batch]
            if self._fields is None:
                self._fields = list(dict.fromkeys(name for row in values for name in row))
                self._writer.writerow([*COLUMNS[:5], *self._fields, "headers"])
            else:
                _extra_fields(values, self._fields, batch)
        elif self._fields is None:
            self._fields = []
            self._writer.writerow(COLUMNS)
        stamps = _iso_all(batch)
        headers = [_ENCODE(_text_headers(m)) for m in batch]
        if fmt == "bytes":
            keys = ["" if m.key is None else base64.b64encode(m.key).decode("ascii") for m in batch]
            cells = [[base64.b64encode(m.value).decode("ascii")] for m in batch]
        else:
            keys = ["" if m.key is None else _text(m.key, m, "key") for m in batch]
            if fmt == "json":
                cell, names = self._cell, self._fields
                cells = [[cell(row.get(name)) for name in names] for row in values]
            else:
                cells = [[_text(m.value, m, "value")] for m in batch]
        out = [
            [m.stream, m.partition, m.offset, t, k, *c, h]
            for m, t, k, c, h in zip(batch, stamps, keys, cells, headers, strict=True)
        ]
        self._writer.writerows(out)

    def close(self) -> None:
        self._text.flush()
        self._text.detach()  # the handle is closed by its owner


_HEADERS_TYPE = pa.map_(pa.string(), pa.binary())


def _headers_column(batch: Sequence[Message]) -> pa.Array:
    """The headers as a map column, built from flat key and value lists (Arrow's conversion of
    a list of pairs per row costs several times more)."""
    offsets = [0]
    keys: list[str] = []
    values: list[bytes] = []
    # Messages that carry only the server's headers share one mapping (SubscriptionState.take):
    # its entries are listed once, not once per message. A message's headers never change.
    last: Any = None
    names: tuple[str, ...] = ()
    entries: tuple[bytes, ...] = ()
    for message in batch:
        headers = message.headers
        if headers is not last:
            last, names, entries = headers, tuple(headers.keys()), tuple(headers.values())
        keys += names
        values += entries
        offsets.append(len(keys))
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.binary()), type=_HEADERS_TYPE
    )


def _utf8_column(data: list[bytes | None], batch: Sequence[Message], what: str) -> pa.Array:
    """A string column of ``data``, checked as UTF-8 in Arrow (one pass in C, not one decode per
    message); for invalid text, the error names the first message at fault."""
    try:
        return pa.array(data, pa.binary()).cast(pa.string())
    except pa.ArrowInvalid:
        for raw, message in zip(data, batch, strict=True):
            if raw is not None:
                _text(raw, message, what)
        raise


_JSON_READ = pa_json.ReadOptions(use_threads=False)


def _json_table(batch: Sequence[Message], schema: pa.Schema) -> pa.Table | None:
    """The batch's JSON values as a table of ``schema``, parsed by Arrow's JSON reader in one pass
    (about 5× cheaper than ``json.loads`` per value and a conversion of the dicts); ``None`` when
    Arrow cannot say which row is at fault (any value it refuses: not a JSON object, a field or
    type outside ``schema``, a key given twice) or could split a value in two (a line break in a
    value), so the caller converts the batch value by value and names the offset."""
    if any(name.startswith("value_") and name[6:] in _META for name in schema.names):
        return None  # a field renamed for a clash with a column: the reader knows it by its own name
    data = b"\n".join([m.value for m in batch])
    if data.count(b"\n") != len(batch) - 1 or b"\r" in data:
        return None
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error")
    try:
        table = pa_json.read_json(pa.py_buffer(data), read_options=_JSON_READ, parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(batch):  # an empty value is an empty line, which the reader skips
        return None
    return table.select(schema.names)


class _ParquetWriter:
    """Columns built per batch (no row dicts for the fixed columns), one row group per batch."""

    def __init__(self, handle: IO[bytes], options: WriteOptions) -> None:
        self._handle = handle
        self._options = options
        self._writer: pq.ParquetWriter | None = None
        self._value_schema: pa.Schema | None = None
        if options.json_schema:
            self._value_schema = pa.schema([(n, pa.type_for_alias(t)) for n, t in options.json_schema.items()])

    def _value_columns(self, batch: Sequence[Message]) -> list[tuple[str, pa.Array]]:
        fmt = self._options.value_format
        if fmt == "bytes":
            return [("value", pa.array([m.value for m in batch], pa.binary()))]
        if fmt == "text":
            return [("value", _utf8_column([m.value for m in batch], batch, "value"))]
        if self._value_schema is not None:
            # The file's columns are known (json_schema, or the first rows'): Arrow parses the
            # values; what it refuses is converted below, which names the offset at fault.
            parsed = _json_table(batch, self._value_schema)
            if parsed is not None:
                return list(zip(parsed.column_names, parsed.columns, strict=True))
        values = [_json_fields(m) for m in batch]
        if self._value_schema is None:
            try:
                self._value_schema = pa.Table.from_pylist(values).schema
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                self._value_schema = self._first_unfit(values, batch, None)
        else:
            _extra_fields(values, self._value_schema.names, batch)
        try:
            table = pa.Table.from_pylist(values, schema=self._value_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            self._first_unfit(values, batch, self._value_schema)
            raise  # _first_unfit raised unless every row fits alone, which from_pylist contradicts
        return list(zip(table.column_names, table.columns, strict=True))

    @staticmethod
    def _first_unfit(values: list[dict[str, Any]], batch: Sequence[Message], schema: pa.Schema | None) -> pa.Schema:
        """Find the first row whose fields do not fit ``schema`` (or the types of the rows before
        it) and raise naming its offset. A prefix that fails makes every longer one fail, so the
        row is found by bisection: a few conversions, not one per row."""

        def fits(count: int) -> bool:
            try:
                pa.Table.from_pylist(values[:count], schema=schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                return False
            return True

        low, high = 0, len(values)  # values[:low] fits, values[:high] does not
        if fits(high):
            raise AssertionError("unreachable: every row fits")
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        try:
            pa.Table.from_pylist(values[:high], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise ArchiveValueError(
                batch[high - 1],
                f"a field of the value does not fit the file's column type ({exc}); give json_schema "
                "with the types to use, or archive as jsonl",
            ) from None
        raise AssertionError("unreachable: the prefix failed above")

    def write(self, batch: Sequence[Message]) -> None:
        binary_keys = self._options.value_format == "bytes"
        first, count = batch[0], len(batch)
        columns: list[tuple[str, pa.Array]] = [
            # One file holds one partition of one stream: two constant columns.
            ("stream", pa.repeat(pa.scalar(first.stream, pa.string()), count)),
            ("partition", pa.repeat(pa.scalar(first.partition, pa.int32()), count)),
            ("offset", pa.array([m.offset for m in batch], pa.int64())),
            ("timestamp", pa.array([m.timestamp for m in batch], pa.timestamp("ns", tz="UTC"))),
            (
                "key",
                pa.array([m.key for m in batch], pa.binary())
                if binary_keys
                else _utf8_column([m.key for m in batch], batch, "key"),
            ),
            *self._value_columns(batch),
            ("headers", _headers_column(batch)),
        ]
        table = pa.Table.from_arrays([c for _, c in columns], names=[n for n, _ in columns])
        if self._writer is None:
            codec = self._options.parquet_compression
            self._writer = pq.ParquetWriter(
                self._handle,
                table.schema,
                compression=None if codec == "none" else codec,
                coerce_timestamps="us",  # Spark reads no finer than microseconds
                allow_truncated_timestamps=True,
            )
        self._writer.write_table(table, row_group_size=len(batch))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


_WRITERS: dict[str, type[_JsonlWriter] | type[_CsvWriter] | type[_ParquetWriter]] = {
    "jsonl": _JsonlWriter,
    "csv": _CsvWriter,
    "parquet": _ParquetWriter,
}


#: Called with a message that cannot be written and why, instead of failing (e.g. to publish it
#: to a dead-letter stream); the file goes on without it.
Reject = Callable[[Message, ArchiveValueError], None]


def _write_batch(writer: _Writer, batch: list[Message], reject: Reject | None) -> int:
    """Write ``batch``, handing each message that cannot be written to ``reject`` (a writer
    raises before it writes any of a batch); return how many rows were written."""
    while batch:
        try:
            writer.write(batch)
            return len(batch)
        except ArchiveValueError as bad:
            if reject is None:
                raise
            reject(bad.message, bad)
            batch = [m for m in batch if m is not bad.message]
    return 0


def write_range(
    directory: Any,
    stream: str,
    partition: int,
    batches: Iterable[list[Message]],
    options: WriteOptions,
    reject: Reject | None = None,
    end: int | None = None,
) -> ArchivedFile | None:
    """Write consecutive messages of one partition, given as ``batches`` (each written as a unit,
    a Parquet row group), to one file in ``directory``, named by the first and last offset read
    (:func:`file_name`; messages handed to ``reject`` count, so the next file starts after them):
    to a :func:`temporary_name` first (first offset, ``end``), renamed over the final name once
    the writer closed it. ``directory`` is an ``ObjectStoragePath`` (or any path with ``/``,
    ``open``, ``rename`` and ``unlink``).

    :param reject: called for each message that cannot be written (else that is an error).
    :param end: the exclusive end of the offsets the batches may hold (the plan's; default none).
    :return: the file (holding the offsets read, rejected ones included), or ``None`` when no
        message was written (no file is left).
    :raises ArchiveValueError: a message cannot be written and there is no ``reject``.
    :raises LiftbridgeFileError: the file cannot be written or renamed (the message names it).
        Whatever fails (these, ``reject``, or reading ``batches``), the temporary file is removed.
    """
    pending = iter(batches)
    head = next((batch for batch in pending if batch), None)  # its first offset names the temporary file
    if head is None:
        return None
    first, last, rows, target = head[0].offset, -1, 0, None
    temporary = directory / temporary_name(stream, partition, first, NO_END if end is None else end)
    try:
        with temporary.open("wb") as handle:
            writer = _WRITERS[options.format](handle, options)
            try:
                for batch in itertools.chain([head], pending):
                    if not batch:
                        continue
                    last = batch[-1].offset
                    rows += _write_batch(writer, batch, reject)
            except BaseException:
                with contextlib.suppress(Exception):
                    writer.close()  # before the handle closes (a Parquet writer writes its footer)
                raise
            writer.close()
        if rows == 0:
            temporary.unlink()
            return None
        target = directory / file_name(stream, partition, first, last, options.format)
        temporary.rename(target)
    except OSError as exc:
        _remove_quietly(temporary)
        raise LiftbridgeFileError(
            f"cannot write the archive file {target or temporary}: {exc}; give a path the worker can write to "
            "(and storage_conn_id for an object store)"
        ) from exc
    except BaseException:
        _remove_quietly(temporary)  # a value that cannot be written, a failed read: no half file left
        raise
    return ArchivedFile(str(target), stream, partition, first, last, rows)


def _remove_quietly(path: Any) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # the original error is the one to report; a stray temporary name is hidden (dot)
