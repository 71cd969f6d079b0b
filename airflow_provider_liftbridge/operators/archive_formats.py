"""The archiver's file formats as values: ``format=Parquet(compression="zstd")``, ``Csv()``,
``JsonLines()`` on :class:`~.stream_to_file.LiftbridgeStreamToFileOperator`, each holding only the
settings its format uses. A name (``"parquet"``, ``"csv"``, ``"jsonl"``, templated) means that
format with its defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_liftbridge.validation import bad_argument, check_positive_int

from .archive_files import WRITE_FORMATS
from .file_writers import WriteOptions

__all__ = ["PARQUET", "ArchiveFormat", "Csv", "JsonLines", "Parquet", "check_format", "write_options"]

#: Rows converted and written at a time unless a format value says otherwise.
DEFAULT_ROW_GROUP_ROWS = 10_000


@dataclass(frozen=True)
class JsonLines:
    """JSON lines files (``.jsonl``), one message per line.

    :param row_group_rows: rows converted and written at a time (bounds memory).
    """

    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    name = "jsonl"


@dataclass(frozen=True)
class Csv:
    """CSV files (``.csv``).

    :param json_schema: with ``value_format="json"``: the value fields to write as columns
        (default: those of each file's first rows).
    :param row_group_rows: rows converted and written at a time (bounds memory).
    """

    json_schema: Mapping[str, str] | None = None
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    name = "csv"


@dataclass(frozen=True)
class Parquet:
    """Parquet files (``.parquet``), the default.

    :param compression: ``snappy`` (default), ``zstd``, ``gzip`` or ``none``.
    :param json_schema: with ``value_format="json"``: the value fields and their pyarrow type
        names (``{"id": "string", "amount": "float64"}``; default: those of each file's first rows).
    :param row_group_rows: rows converted and written at a time: a row group at most.
    """

    compression: str = "snappy"
    json_schema: Mapping[str, str] | None = None
    row_group_rows: int = DEFAULT_ROW_GROUP_ROWS
    name = "parquet"


ArchiveFormat = Parquet | Csv | JsonLines
#: The default format: Parquet with its defaults.
PARQUET = Parquet()
_BY_NAME: dict[str, ArchiveFormat] = {"parquet": PARQUET, "csv": Csv(), "jsonl": JsonLines()}


def check_format(value: Any, name: str = "format") -> ArchiveFormat:
    """``format``: a :class:`Parquet`, :class:`Csv` or :class:`JsonLines` value, or one's name.

    :raises LiftbridgeArgumentError: anything else.
    """
    if isinstance(value, Parquet | Csv | JsonLines):
        check_positive_int(value.row_group_rows, f"{name}.row_group_rows")
        return value
    if isinstance(value, str) and value.strip() in _BY_NAME:
        return _BY_NAME[value.strip()]
    raise bad_argument(
        name,
        value,
        f"Parquet(...), Csv(...), JsonLines(...) or one of {', '.join(WRITE_FORMATS)}",
        f"e.g. {name}=Parquet(compression='zstd') or {name}='jsonl'",
    )


def write_options(value: Any, value_format: str) -> WriteOptions:
    """How to write files in the format ``value`` with values as ``value_format``.

    :raises LiftbridgeArgumentError: a bad format, value format or format setting.
    """
    chosen = check_format(value)
    return WriteOptions(
        format=chosen.name,
        value_format=value_format,
        json_schema=dict(chosen.json_schema) if getattr(chosen, "json_schema", None) else None,
        batch_rows=chosen.row_group_rows,
        parquet_compression=getattr(chosen, "compression", "snappy"),
    )
