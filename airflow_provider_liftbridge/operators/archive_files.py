"""The archiver's files as named things: which formats it writes, the name of the file holding an
offset range (fixed by the range, so a retry writes the same name), the temporary name it is
written under (carrying the offsets it may hold, so a cleanup can tell whose it is), the prefixes
a partition's files share, and what a completed file holds. No Airflow, no pyarrow."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NO_END",
    "WRITE_FORMATS",
    "ArchivedFile",
    "file_name",
    "partition_prefix",
    "temporary_name",
    "temporary_prefix",
    "temporary_range",
]

#: File formats the archiver writes, with their suffixes.
WRITE_FORMATS: dict[str, str] = {"jsonl": ".jsonl", "csv": ".csv", "parquet": ".parquet"}
#: Digits of the offsets in file names: any int64 offset, names sort in offset order.
_OFFSET_DIGITS = 20
#: Characters kept as they are when a stream name becomes part of a file name.
_NAME_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
#: The end of a temporary name's range when the writer was given none: any offset from the first on.
NO_END = 10**_OFFSET_DIGITS - 1
#: What follows a partition's temporary prefix: first offset, exclusive end, random part.
_TEMPORARY_REST = re.compile(r"(\d{20})-(\d{20})-[0-9a-f]{12}\.tmp")


@dataclass(frozen=True)
class ArchivedFile:
    """A file the archiver completed: where, and which messages it holds."""

    path: str
    stream: str
    partition: int
    first_offset: int
    last_offset: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        """The XCom form."""
        return {
            "path": self.path,
            "stream": self.stream,
            "partition": self.partition,
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "rows": self.rows,
        }


def file_name(stream: str, partition: int, first: int, last: int, fmt: str) -> str:
    """The name of the file holding offsets ``first``..``last`` of a partition: fixed by them, so a
    retry writes the same name. Characters of the stream name outside ``[A-Za-z0-9._-]`` become
    ``_``; offsets are zero-padded so names sort in offset order."""
    safe = "".join(ch if ch in _NAME_SAFE else "_" for ch in stream).lstrip(".") or "_"
    return f"{safe}-{partition}-{first:0{_OFFSET_DIGITS}d}-{last:0{_OFFSET_DIGITS}d}{WRITE_FORMATS[fmt]}"


def partition_prefix(stream: str, partition: int) -> str:
    """The start every file name of a partition shares (:func:`file_name` up to the offsets)."""
    return file_name(stream, partition, 0, 0, "jsonl").rsplit("-", 2)[0] + "-"


def temporary_prefix(stream: str, partition: int) -> str:
    """The start of the temporary names of a partition's files. The leading dot hides them from
    Spark and Hive-style readers while they are written."""
    return "." + partition_prefix(stream, partition)


def temporary_name(stream: str, partition: int, first: int, end: int) -> str:
    """A fresh temporary name for a file of the partition that holds offsets from ``first`` to
    before ``end`` (the plan's end: the file holds fewer when it is complete):
    ``.<stream>-<partition>-<first>-<end>-<random>.tmp``. The range lets a try remove only the
    temporary files that overlap its own plan, never those of a run of another range writing
    beside it; the random part keeps two writers of one range apart."""
    digits = _OFFSET_DIGITS
    return f"{temporary_prefix(stream, partition)}{first:0{digits}d}-{end:0{digits}d}-{uuid.uuid4().hex[:12]}.tmp"


def temporary_range(stream: str, partition: int, name: str) -> tuple[int, int] | None:
    """``(first, end)`` of a :func:`temporary_name` of the partition; ``None`` for any other name
    (another stream's or partition's, a final file, a temporary name without a range)."""
    prefix = temporary_prefix(stream, partition)
    if not name.startswith(prefix):
        return None
    match = _TEMPORARY_REST.fullmatch(name[len(prefix) :])
    return (int(match.group(1)), int(match.group(2))) if match else None
