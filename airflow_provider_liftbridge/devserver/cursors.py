"""Cursor positions of the dev server, kept as Liftbridge keeps them: as messages of the internal
``__cursors`` stream (``cursors_stream.py`` routes the calls and writes the messages).

Liftbridge (``server/cursors.go``) writes every SetCursor as a message to the ``__cursors``
partition that owns the cursor: the key is ``"<cursor id>,<stream>,<partition>"``, the value its
internal ``Cursor`` protobuf (stream = 1, partition = 2, cursorId = 3, offset = 4: the fields and
numbers of the API's ``SetCursorRequest``, so a serialized ``SetCursorRequest`` is the same bytes).
The stream is compacted by key, and its newest offset grows with every write.

The dev server stores the same messages and keeps :class:`CursorIndex` in step with them (updated
when a write commits, rebuilt from the partitions' logs when the server starts), so FetchCursor
reads no log. Compaction keeps each partition bounded: once it holds more than
:data:`COMPACT_MIN` records and more than twice as many as it has live keys, the latest message of
every key is written again and everything before those copies is discarded
(:func:`compaction_due`; how it differs from Liftbridge's compaction: ``docs/devserver.md``).
"""

from __future__ import annotations

import logging
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError

from airflow_provider_liftbridge._proto import api_pb2

from .log import PartitionLog

log = logging.getLogger(__name__)

#: A ``__cursors`` partition is compacted only past this many records (and twice its live keys).
COMPACT_MIN = 256
#: Where dev servers before cursors-as-messages kept cursors (read once, then removed).
LEGACY_DIR = "cursors"

CursorId = tuple[str, str, int]


def cursor_partition(cursor_id: str, stream: str, partition: int, partitions: int) -> int:
    """The ``__cursors`` partition owning cursor (``cursor_id``, ``stream``, ``partition``):
    ``crc32_ieee(key) % partitions``, as Liftbridge and go-liftbridge compute it."""
    return zlib.crc32(cursor_key(cursor_id, stream, partition)) % partitions


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    """The key of a cursor's messages in ``__cursors`` (Liftbridge's ``getCursorKey``)."""
    return f"{cursor_id},{stream},{partition}".encode()


def cursor_value(cursor_id: str, stream: str, partition: int, offset: int) -> bytes:
    """The value of a cursor's message: Liftbridge's internal ``Cursor`` protobuf."""
    return api_pb2.SetCursorRequest(
        cursorId=cursor_id, stream=stream, partition=partition, offset=offset
    ).SerializeToString()


def parse_cursor(value: bytes) -> tuple[CursorId, int] | None:
    """A cursor message's value as ((cursor id, stream, partition), offset); ``None`` when it is
    not a cursor (Liftbridge logs and skips such messages too)."""
    try:
        req = api_pb2.SetCursorRequest.FromString(value)
    except DecodeError:
        return None
    if not req.cursorId or not req.stream:
        return None
    return (req.cursorId, req.stream, req.partition), req.offset


def compaction_due(records: int, live_keys: int) -> bool:
    """Whether a ``__cursors`` partition holding ``records`` records for ``live_keys`` cursors
    should be compacted (it then holds one record per cursor again)."""
    return records > COMPACT_MIN and records > 2 * live_keys


def _bodies(log_: PartitionLog) -> Iterator[bytes]:
    offset = log_.oldest_offset
    while offset <= log_.newest_offset:
        batch = log_.read(offset, 4096)
        if not batch:
            return
        yield from batch
        offset += len(batch)


class CursorIndex:
    """The committed offset of every cursor, in step with the ``__cursors`` messages."""

    def __init__(self) -> None:
        self._offsets: dict[CursorId, int] = {}
        #: Per ``__cursors`` partition, the last compaction's copies (first offset, end): every
        #: replica's log that holds them all may discard what lies before them.
        self.trims: dict[int, tuple[int, int]] = {}

    def get(self, cursor_id: str, stream: str, partition: int) -> int:
        """The cursor's offset, -1 when it was never set."""
        return self._offsets.get((cursor_id, stream, partition), -1)

    def record(self, cursor: CursorId, offset: int) -> None:
        """A write of ``cursor`` committed."""
        self._offsets[cursor] = offset

    def load(self, log_: PartitionLog) -> int:
        """Read every cursor message of a ``__cursors`` partition's log, oldest first (the last
        write of a key wins); return how many records the log holds."""
        records = 0
        for body in _bodies(log_):
            records += 1
            msg = api_pb2.Message.FromString(body)
            parsed = parse_cursor(msg.value)
            if parsed is None:
                log.warning("skipping a message of __cursors that is not a cursor (key %r)", msg.key)
                continue
            cursor, offset = parsed
            if cursor_key(*cursor) == msg.key:
                self._offsets[cursor] = offset
        return records

    def owned_by(self, pid: int, partitions: int) -> list[tuple[CursorId, int]]:
        """The cursors (with their offsets) whose messages belong in ``__cursors`` partition ``pid``."""
        return [(c, o) for c, o in self._offsets.items() if cursor_partition(*c, partitions) == pid]


def take_legacy(data_dir: Path) -> dict[CursorId, int]:
    """The cursors an earlier dev server kept in its own log (``DATA_DIR/cursors/``, a log of
    ``SetCursorRequest`` bodies), the last write of each; empty when there is none.
    :func:`drop_legacy` removes it once they are in ``__cursors``."""
    directory = data_dir / LEGACY_DIR
    fresh = data_dir / (LEGACY_DIR + ".new")  # a compaction of that log finished writing, not renaming
    if not directory.exists() and fresh.exists():
        fresh.rename(directory)
    if not directory.exists():
        return {}
    legacy = PartitionLog(directory)
    try:
        found: dict[CursorId, int] = {}
        for body in _bodies(legacy):
            parsed = parse_cursor(body)
            if parsed is not None:
                found[parsed[0]] = parsed[1]
        return found
    finally:
        legacy.close()


def drop_legacy(data_dir: Path) -> None:
    """Remove the cursor log of an earlier dev server (its cursors are in ``__cursors`` now)."""
    for name in (LEGACY_DIR, LEGACY_DIR + ".new", LEGACY_DIR + ".old"):
        shutil.rmtree(data_dir / name, ignore_errors=True)
