"""Cursors of the dev server: kept in an append-only log of ``SetCursorRequest``s, compacted when opened."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from airflow_provider_liftbridge._proto import api_pb2

from .log import PartitionLog

_CURSOR_COMPACT_MIN = 10_000


class CursorStore:
    """Cursors keyed by (cursor id, stream, partition), kept in an append-only log of ``SetCursorRequest``s."""

    def __init__(self, directory: Path, *, fsync: bool = False) -> None:
        self._dir = directory
        self._fsync = fsync
        fresh = directory.with_name(directory.name + ".new")
        if not directory.exists() and fresh.exists():
            fresh.rename(directory)  # a compaction finished writing but not renaming
        shutil.rmtree(fresh, ignore_errors=True)
        self._log = PartitionLog(directory, fsync=fsync)
        self._cursors: dict[tuple[str, str, int], int] = {}
        for body in self._read_all(self._log):
            req = api_pb2.SetCursorRequest.FromString(body)
            self._cursors[(req.cursorId, req.stream, req.partition)] = req.offset
        records = self._log.newest_offset + 1 - self._log.oldest_offset
        if records > _CURSOR_COMPACT_MIN and records > 4 * len(self._cursors):
            self._compact(fresh)

    @staticmethod
    def _read_all(log_: PartitionLog) -> Iterable[bytes]:
        offset = log_.oldest_offset
        while offset <= log_.newest_offset:
            batch = log_.read(offset, 4096)
            yield from batch
            offset += len(batch)

    def _compact(self, fresh: Path) -> None:
        new_log = PartitionLog(fresh, fsync=True)
        now = time.time_ns()
        for (cid, stream, part), offset in self._cursors.items():
            req = api_pb2.SetCursorRequest(cursorId=cid, stream=stream, partition=part, offset=offset)
            new_log.append(req.SerializeToString(), now)
        new_log.flush()
        new_log.close()
        self._log.close()
        old = self._dir.with_name(self._dir.name + ".old")
        self._dir.rename(old)
        fresh.rename(self._dir)
        shutil.rmtree(old, ignore_errors=True)
        self._log = PartitionLog(self._dir, fsync=self._fsync)

    def set(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        """Record a cursor durably (written before this returns)."""
        req = api_pb2.SetCursorRequest(cursorId=cursor_id, stream=stream, partition=partition, offset=offset)
        self._log.append(req.SerializeToString(), time.time_ns())
        self._log.flush()
        self._cursors[(cursor_id, stream, partition)] = offset

    def get(self, cursor_id: str, stream: str, partition: int) -> int:
        """The cursor's offset, -1 when it was never set."""
        return self._cursors.get((cursor_id, stream, partition), -1)

    def close(self) -> None:
        self._log.close()
