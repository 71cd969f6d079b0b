"""Cursor positions of the dev server, kept as Liftbridge keeps them: as messages of the internal
``__cursors`` stream (``cursors_stream.py`` routes the calls and writes the messages).

Liftbridge (``server/cursors.go``) writes every SetCursor as a message to the ``__cursors``
partition that owns the cursor: the key is ``"<cursor id>,<stream>,<partition>"``, the value its
internal ``Cursor`` protobuf (stream = 1, partition = 2, cursorId = 3, offset = 4: the fields and
numbers of the API's ``SetCursorRequest``, so a serialized ``SetCursorRequest`` is the same bytes).
The stream is compacted by key, and its newest offset grows with every write.

FetchCursor reads them as Liftbridge's ``GetCursor`` does: each broker keeps an LRU cache of
:data:`CACHE_SIZE` cursor offsets (:class:`CursorCache`); a SetCursor caches its value once its
message is committed; a miss reads the owning partition's log on that broker backwards from the high
watermark that replica knows (:func:`latest_cursor_offset`) and caches what it finds, -1 when the
key is not at or below it, so a miss answered from a stale high watermark stays until the
cursor is set again or the cache is purged (the broker becomes leader of a ``__cursors``
partition, or starts: a new process).

The dev server also keeps :class:`CursorIndex`, the committed offset of every cursor (updated
when a write commits, rebuilt from the partitions' logs when the server starts): compaction writes
the latest message of every key from it, and moving cursors of an earlier dev server in uses it.
FetchCursor does not read it. Compaction keeps each partition bounded: once it holds more than
:data:`COMPACT_MIN` records and more than twice as many as it has live keys, the latest message of
every key is written again and everything before those copies is discarded
(:func:`compaction_due`; how it differs from Liftbridge's compaction: ``docs/devserver.md``).
"""

from __future__ import annotations

import logging
import shutil
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError

from airflow_provider_liftbridge._proto import api_pb2

from .log import PartitionLog

log = logging.getLogger(__name__)

#: A ``__cursors`` partition is compacted only past this many records (and twice its live keys).
COMPACT_MIN = 256
#: Entries of a broker's cursor cache (Liftbridge's ``cursorCacheSize``).
CACHE_SIZE = 512
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


def _range(log_: PartitionLog, first: int, last: int) -> list[bytes]:
    """The bodies of offsets ``first`` to ``last`` of ``log_``, oldest first."""
    out: list[bytes] = []
    offset = first
    while offset <= last:
        batch = log_.read(offset, last + 1 - offset)
        if not batch:
            break
        out += batch
        offset += len(batch)
    return out


def latest_cursor_offset(log_: PartitionLog, key: bytes, hw: int) -> int:
    """The cursor offset a FetchCursor miss finds for ``key`` in a ``__cursors`` log: as
    Liftbridge's ``getLatestCursorOffset`` (v1.9.0-72, the measured build), the offset in the
    newest message of the key, read backwards from ``hw`` to the oldest record; -1 when ``hw`` is
    -1 or no message of the key is at or below it. (v1.9.0 itself read forwards and took the
    largest offset.)"""
    oldest = log_.oldest_offset
    if hw < 0 or log_.is_empty:
        return -1
    end = min(hw, log_.newest_offset)
    while end >= oldest:
        start = max(oldest, end - 4095)
        for body in reversed(_range(log_, start, end)):
            msg = api_pb2.Message.FromString(body)
            if msg.key != key:
                continue
            parsed = parse_cursor(msg.value)
            if parsed is None:
                log.warning("invalid cursor message in __cursors (key %r)", msg.key)
                continue
            return parsed[1]
        end = start - 1
    return -1


class CursorCache:
    """One broker's LRU cache of cursor offsets (:data:`CACHE_SIZE` entries), keyed by cursor key."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, int] = OrderedDict()

    def get(self, key: bytes) -> int | None:
        offset = self._entries.get(key)
        if offset is not None:
            self._entries.move_to_end(key)
        return offset

    def add(self, key: bytes, offset: int) -> None:
        self._entries[key] = offset
        self._entries.move_to_end(key)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class CursorIndex:
    """The committed offset of every cursor, in step with the ``__cursors`` messages, and every
    broker's cursor cache (what FetchCursor answers from)."""

    def __init__(self) -> None:
        self._offsets: dict[CursorId, int] = {}
        #: Per ``__cursors`` partition, the last compaction's copies (first offset, end): every
        #: replica's log that holds them all may discard what lies before them.
        self.trims: dict[int, tuple[int, int]] = {}
        self._caches: dict[str, CursorCache] = {}

    def cache(self, broker_id: str) -> CursorCache:
        """``broker_id``'s cursor cache."""
        cache = self._caches.get(broker_id)
        if cache is None:
            cache = self._caches[broker_id] = CursorCache()
        return cache

    def purge(self, broker_id: str) -> None:
        """Empty ``broker_id``'s cursor cache (it became leader of a ``__cursors`` partition, or it
        is a new process)."""
        self._caches.pop(broker_id, None)

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
