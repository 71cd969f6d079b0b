"""File-backed, append-only commit log of one partition.

A log is a directory of segment files named by the offset of their first record
(``00000000000000000042.log``). A record on disk is::

    u32 body length | u32 CRC-32C of the rest | i64 offset | i64 timestamp (ns) | body

The body is whatever the caller stores (the dev server stores the ``Message``
protobuf exactly as subscribers receive it, so reads need no re-encoding).

Appends are buffered in memory and written with one ``write`` per segment per
:meth:`PartitionLog.flush`; only flushed records are visible to readers and
count as committed. Opening a log re-reads every segment, verifies each
record's checksum and offset, and cuts the log at the first torn or corrupt
record (what a process killed in the middle of a write leaves behind).
Retention deletes whole segments, never the active one, as Liftbridge's delete cleaner does
(:meth:`PartitionLog.enforce_retention`); the dev server runs it on each stream's cleaner interval.

A segment rolls when it is full or old (:meth:`PartitionLog.check_split`), checked before each
batch is written and by the cleaner, which can leave the newest segment empty; a time lookup
(:meth:`PartitionLog.earliest_offset_after_timestamp`) answers as Liftbridge's does, flaws included
(see ``docs/devserver.md``, "Retention" and "Segments rolled by age").
"""

from __future__ import annotations

import os
import shutil
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from pathlib import Path

import google_crc32c

from .errors import DataDirError

_FRAME = struct.Struct(">II")
_OT = struct.Struct(">qq")
_LEN = struct.Struct(">I")
#: Bytes of framing in front of every body.
RECORD_OVERHEAD = _FRAME.size + _OT.size
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
#: Records written into a segment after one roll check: Liftbridge's ``batch.max.messages`` default
#: (its commit loop appends up to that many messages at once, all into the active segment).
BATCH_MAX_MESSAGES = 1024
_SUFFIX = ".log"
_crc32c = google_crc32c.value


class LogClosedError(OSError):
    """A write reached a log after :meth:`PartitionLog.close` (its broker stopped or restarted):
    Liftbridge's ``ErrCommitLogClosed`` ("commit log was closed"). The records are not stored."""


def frame(offset: int, timestamp: int, body: bytes) -> bytes:
    """Return the on-disk bytes of one record."""
    rest = _OT.pack(offset, timestamp) + body
    return _FRAME.pack(len(body), _crc32c(rest)) + rest


class _Segment:
    """One segment file: its first offset, its open descriptor and an in-memory index."""

    __slots__ = ("base", "fd", "path", "positions", "size", "timestamps")

    def __init__(self, base: int, path: Path) -> None:
        self.base = base
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.positions = array("q")
        self.timestamps = array("q")
        self.size = 0

    @property
    def next_offset(self) -> int:
        return self.base + len(self.positions)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PartitionLog:
    """The commit log of one partition (see the module docstring for the format).

    Not thread-safe: the dev server drives every log from its single event loop.

    :param directory: where the segment files live (created if missing).
    :param segment_max_bytes: a new segment is started before a write once the active one has
        reached this size (a batch that starts below it is written whole, so a segment may exceed it).
    :param fsync: ``fsync`` after each flush (survives power loss, not only a process kill).
    :param segment_max_age_ns: a non-empty active segment whose first record is this old is rolled
        (0: never; see :meth:`check_split`).
    :raises DataDirError: the directory cannot be created or a segment cannot be opened.
    """

    def __init__(
        self,
        directory: Path,
        *,
        segment_max_bytes: int = DEFAULT_SEGMENT_BYTES,
        fsync: bool = False,
        segment_max_age_ns: int = 0,
    ) -> None:
        self.directory = directory
        self.segment_max_bytes = max(segment_max_bytes, 1)
        self.segment_max_age_ns = max(segment_max_age_ns, 0)
        self.fsync = fsync
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._pending: list[bytes] = []
        self._pending_ts: list[int] = []
        self._next = 0
        self._flushed_next = 0
        self._oldest = 0
        self._closed = False
        #: Records dropped while opening because they were torn or corrupt.
        self.recovered_torn_records = 0
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._open()
        except OSError as exc:
            self.close()
            raise DataDirError(f"cannot open the partition log in {directory}: {exc}") from exc

    # -- opening and recovery -------------------------------------------------
    def _open(self) -> None:
        files = sorted(
            (int(p.name[: -len(_SUFFIX)]), p)
            for p in self.directory.iterdir()
            if p.name.endswith(_SUFFIX) and p.name[: -len(_SUFFIX)].isdigit()
        )
        if not files:
            self._add_segment(0)
            return
        expected = files[0][0]
        cut = False
        for base, path in files:
            if cut or base != expected:
                # Anything after a torn record (or a gap) cannot be trusted to follow on.
                path.unlink()
                cut = True
                continue
            seg = _Segment(base, path)
            self._segments.append(seg)
            self._bases.append(base)
            expected, good = self._scan(seg)
            if not good:
                cut = True
        self._next = self._flushed_next = expected
        self._oldest = self._segments[0].base

    def _scan(self, seg: _Segment) -> tuple[int, bool]:
        """Index ``seg``; truncate it after the last sound record. Return (next offset, whether it was sound)."""
        data = seg.path.read_bytes()
        total = len(data)
        pos = 0
        expected = seg.base
        positions, timestamps = seg.positions, seg.timestamps
        while pos + RECORD_OVERHEAD <= total:
            blen, crc = _FRAME.unpack_from(data, pos)
            end = pos + RECORD_OVERHEAD + blen
            if end > total or _crc32c(data[pos + _FRAME.size : end]) != crc:
                break
            offset, ts = _OT.unpack_from(data, pos + _FRAME.size)
            if offset != expected:
                break
            positions.append(pos)
            timestamps.append(ts)
            expected += 1
            pos = end
        seg.size = pos
        if pos != total:
            os.truncate(seg.path, pos)
            self.recovered_torn_records += 1
            return expected, False
        return expected, True

    def _add_segment(self, base: int) -> _Segment:
        seg = _Segment(base, self.directory / f"{base:020d}{_SUFFIX}")
        self._segments.append(seg)
        self._bases.append(base)
        return seg

    # -- positions ------------------------------------------------------------
    @property
    def oldest_offset(self) -> int:
        """First offset still retained (equal to ``newest_offset + 1`` when nothing is retained)."""
        return self._oldest

    @property
    def newest_offset(self) -> int:
        """Last committed (flushed) offset, -1 when nothing was ever committed."""
        return self._flushed_next - 1

    @property
    def next_offset(self) -> int:
        """Offset the next :meth:`append` gets (counts records not flushed yet)."""
        return self._next

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: a later :meth:`flush` refuses what was buffered."""
        return self._closed

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def is_empty(self) -> bool:
        """True when no committed record is retained."""
        return self._oldest >= self._flushed_next

    # -- writing --------------------------------------------------------------
    def append(self, body: bytes, timestamp: int) -> int:
        """Buffer one record and return its offset. It becomes visible after :meth:`flush`."""
        offset = self._next
        self._next = offset + 1
        self._pending.append(frame(offset, timestamp, body))
        self._pending_ts.append(timestamp)
        return offset

    def extend(self, first: int, bodies: Sequence[bytes], timestamp: int) -> None:
        """Buffer records built for offsets ``first``, ``first + 1``, ... sharing one timestamp.

        :raises ValueError: ``first`` is not :attr:`next_offset` (bodies carry their offsets).
        """
        if first != self._next:
            raise ValueError(f"records built for offset {first} but the log is at {self._next}")
        offset = first
        pack_ot, pack_frame, crc, out = _OT.pack, _FRAME.pack, _crc32c, self._pending.append
        for body in bodies:  # frame(), inlined: this runs once per message
            rest = pack_ot(offset, timestamp) + body
            out(pack_frame(len(body), crc(rest)) + rest)
            offset += 1
        self._pending_ts += [timestamp] * len(bodies)
        self._next = offset

    def extend_copied(self, first: int, bodies: Sequence[bytes], timestamps: Sequence[int]) -> None:
        """Buffer records copied from another replica's log: same offsets, same timestamps.

        :raises ValueError: ``first`` is not :attr:`next_offset`.
        """
        if first != self._next:
            raise ValueError(f"records copied for offset {first} but the log is at {self._next}")
        offset = first
        out = self._pending.append
        for body, ts in zip(bodies, timestamps, strict=True):
            out(frame(offset, ts, body))
            offset += 1
        self._pending_ts += timestamps
        self._next = offset

    def truncate(self, next_offset: int) -> int:
        """Cut every committed record at or after ``next_offset`` (what a replica drops when a new
        leader never had it); return how many records went. Buffered records must be flushed first.

        :raises ValueError: records are still buffered.
        """
        if self._pending:
            raise ValueError("flush the log before truncating it")
        next_offset = max(next_offset, self._oldest)
        cut = self._flushed_next - next_offset
        if cut <= 0:
            return 0
        while len(self._segments) > 1 and self._segments[-1].base >= next_offset:
            seg = self._segments.pop()
            self._bases.pop()
            seg.close()
            seg.path.unlink(missing_ok=True)
        seg = self._segments[-1]
        keep = next_offset - seg.base
        size = seg.positions[keep] if keep < len(seg.positions) else seg.size
        del seg.positions[keep:]
        del seg.timestamps[keep:]
        os.ftruncate(seg.fd, size)
        seg.size = size
        self._next = self._flushed_next = next_offset
        return cut

    def flush(self) -> int:
        """Write buffered records to the segment files; return how many became committed.

        :raises OSError: the write failed (disk full, ...): the buffered records are dropped and the
            log is as it was before them (their offsets are given out again).
        :raises LogClosedError: the log was closed: the buffered records are dropped likewise.
        """
        pending = self._pending
        if not pending:
            return 0
        if self._closed:
            # Written to the closed descriptors this would fail with EBADF; say what happened.
            self._pending, self._pending_ts = [], []
            self._next = self._flushed_next
            raise LogClosedError(f"commit log was closed: {len(pending)} record(s) for {self.directory} not stored")
        timestamps = self._pending_ts
        self._pending = []
        self._pending_ts = []
        seg_count = len(self._segments)
        seg = self._segments[-1]
        size, indexed = seg.size, len(seg.positions)
        try:
            self._write_records(pending, timestamps)
        except OSError:
            self._roll_back(seg_count, size, indexed)
            raise
        self._flushed_next += len(pending)
        return len(pending)

    def _write_records(self, pending: list[bytes], timestamps: list[int]) -> None:
        """Write ``pending`` in batches of :data:`BATCH_MAX_MESSAGES`, each whole into the active
        segment after a roll check (Liftbridge's ``commitLog.Append``: ``checkAndPerformSplit``, then
        ``segment.WriteMessageSet``). The age is judged with the clock of the leader that stamped the
        records: a batch's first timestamp is that clock's now."""
        for first in range(0, len(pending), BATCH_MAX_MESSAGES):
            self.check_split(timestamps[first])
            seg = self._segments[-1]
            chunk = pending[first : first + BATCH_MAX_MESSAGES]
            starts = list(accumulate(map(len, chunk), initial=seg.size))
            end = starts.pop()
            seg.positions.extend(starts)
            seg.timestamps.extend(timestamps[first : first + BATCH_MAX_MESSAGES])
            self._write(seg, chunk, end)

    def _roll_back(self, seg_count: int, size: int, indexed: int) -> None:
        """Undo a failed :meth:`flush`: drop segments it started, cut the active one back (best effort)."""
        while len(self._segments) > seg_count:
            extra = self._segments.pop()
            self._bases.pop()
            extra.close()
            extra.path.unlink(missing_ok=True)
        seg = self._segments[-1]
        del seg.positions[indexed:]
        del seg.timestamps[indexed:]
        seg.size = size
        try:
            os.ftruncate(seg.fd, size)
        except OSError:
            pass  # a torn tail is cut when the log is opened again
        self._next = self._flushed_next

    def _write(self, seg: _Segment, chunk: list[bytes], new_size: int) -> None:
        data = memoryview(b"".join(chunk))
        while data:
            written = os.write(seg.fd, data)
            data = data[written:]
        if self.fsync:
            os.fsync(seg.fd)
        seg.size = new_size

    # -- reading --------------------------------------------------------------
    def _segment_for(self, offset: int) -> _Segment:
        return self._segments[bisect_right(self._bases, offset) - 1]

    def read(self, offset: int, max_count: int = 512, max_bytes: int = 1 << 20) -> list[bytes]:
        """Return the bodies of committed records from ``offset`` (at least one if any), oldest first.

        Offsets below :attr:`oldest_offset` are read from the oldest retained record.
        """
        offset = max(offset, self._oldest)
        end = min(self._flushed_next, offset + max_count)
        out: list[bytes] = []
        budget = max_bytes
        while offset < end and budget > 0:
            seg = self._segment_for(offset)
            positions = seg.positions
            i = offset - seg.base
            j = min(end - seg.base, len(positions))
            start = positions[i]
            # Stop at the last whole record within the byte budget (but return at least one).
            k = bisect_right(positions, start + budget, i + 1, j)
            if k < j:
                if out and k == i + 1:
                    break  # not even the next record fits any more
                j = max(i + 1, k - 1)
                budget = 0
            stop = positions[j] if j < len(positions) else seg.size
            data = os.pread(seg.fd, stop - start, start)
            p = 0
            for _ in range(j - i):
                (blen,) = _LEN.unpack_from(data, p)
                body_at = p + RECORD_OVERHEAD
                p = body_at + blen
                out.append(data[body_at:p])
            budget = max(0, budget - (stop - start)) if budget else 0
            offset += j - i
        return out

    def read_copies(self, offset: int, max_count: int = 512) -> tuple[list[bytes], list[int]]:
        """Committed records from ``offset`` with their timestamps, for a replica to copy."""
        bodies = self.read(offset, max_count)
        start = max(offset, self._oldest)
        return bodies, [self.timestamp_of(o) for o in range(start, start + len(bodies))]

    def timestamp_of(self, offset: int) -> int:
        """Timestamp (ns) of a committed, retained record."""
        seg = self._segment_for(offset)
        return seg.timestamps[offset - seg.base]

    def check_split(self, now_ns: int) -> bool:
        """Start a new, empty active segment when the active one is full (its size has reached
        ``segment_max_bytes``) or holds records the first of which is at least ``segment_max_age_ns``
        old at ``now_ns`` (the stamping clock); return whether it rolled. Liftbridge's
        ``segment.CheckSplit`` and ``commitLog.checkAndPerformSplit`` (``server/commitlog``), run
        before every append and by the cleaner loop. An empty segment never rolls by age (its
        ``firstWriteTime`` is 0), and a roll by the cleaner leaves the newest segment empty until
        the next record.
        """
        seg = self._segments[-1]
        if self._closed:
            return False
        if seg.size < self.segment_max_bytes and (
            self.segment_max_age_ns <= 0 or not seg.timestamps or now_ns - seg.timestamps[0] < self.segment_max_age_ns
        ):
            return False
        self._add_segment(seg.next_offset)
        return True

    def earliest_offset_after_timestamp(self, timestamp: int) -> int:
        """The offset a ``StartPosition.TIMESTAMP`` subscription starts at, as Liftbridge v1.9.0-72
        answers it (``commitLog.EarliestOffsetAfterTimestamp`` in ``server/commitlog/commitlog.go``,
        ``findSegmentIndexByTimestamp`` in ``util.go``): usually the first retained offset stamped at
        or after ``timestamp`` (:meth:`first_offset_at_or_after`), but "the next offset" when

        - the binary search over the segments' first entries reads the empty newest segment (a roll
          by age, until its next record): reading its first index entry fails with ``io.EOF``,
          taken for "after the end of the log"; it always does when ``timestamp`` is at or after
          the newest record's segment's first timestamp, and with one segment of records always;
        - ``timestamp`` falls between the last record of the second-to-last segment and the first
          record of the last one (the search picks the last segment, finds nothing in the one
          before, and only looks on when the picked segment is not the last).

        The search is Go's ``sort.Search``, step for step, so the same probes are made.
        """
        if self.is_empty:
            return self._flushed_next
        oldest = self._oldest
        # The segments Liftbridge would list: those holding retained records, and an empty active one.
        segs = [s for s in self._segments if s.next_offset > oldest or not s.positions]

        def first_index(seg: _Segment) -> int:
            return max(0, oldest - seg.base)

        eof = False

        def starts_after(i: int) -> bool:
            nonlocal eof
            seg = segs[i]
            if not seg.positions:
                eof = True  # ReadEntryAtLogOffset(0) on an empty index: io.EOF, and Search goes left
                return True
            return seg.timestamps[first_index(seg)] > timestamp

        lo, hi = 0, len(segs)
        while lo < hi:
            mid = (lo + hi) // 2
            if starts_after(mid):
                hi = mid
            else:
                lo = mid + 1
        if eof:
            return self._flushed_next
        seg = segs[max(lo - 1, 0)]
        found = bisect_left(seg.timestamps, timestamp, first_index(seg))
        if found < len(seg.timestamps):
            return seg.base + found
        if lo < len(segs) - 1:
            seg = segs[lo]
            return seg.base + bisect_left(seg.timestamps, timestamp, first_index(seg))
        return self._flushed_next

    def first_offset_at_or_after(self, timestamp: int) -> int:
        """First retained offset whose timestamp is >= ``timestamp`` (``newest + 1`` when there is none)."""
        for seg in self._segments:
            if not seg.timestamps or seg.next_offset <= self._oldest:
                continue
            lo = max(0, self._oldest - seg.base)
            if seg.timestamps[-1] >= timestamp:
                return seg.base + bisect_left(seg.timestamps, timestamp, lo)
        return self._flushed_next

    def last_offset_at_or_before(self, timestamp: int) -> int:
        """Last retained offset whose timestamp is <= ``timestamp`` (-1 when there is none)."""
        found = -1
        for seg in self._segments:
            if not seg.timestamps or seg.next_offset <= self._oldest:
                continue
            lo = max(0, self._oldest - seg.base)
            if seg.timestamps[lo] > timestamp:
                break
            found = seg.base + bisect_right(seg.timestamps, timestamp, lo) - 1
        return found

    # -- retention ------------------------------------------------------------
    def enforce_retention(
        self, *, max_messages: int = 0, max_bytes: int = 0, max_age_ns: int = 0, now_ns: int = 0
    ) -> bool:
        """Delete the oldest segments as Liftbridge v1.9.0-72's delete cleaner does
        (``deleteCleaner.Clean`` in ``server/commitlog/delete_cleaner.go``): whole segments only,
        never the active (last) one, limits applied in this order (0 = none):

        - ``max_age_ns``: the leading segments whose last record is older than ``now_ns -
          max_age_ns`` go (a segment with one younger record stays, and so do those after it);
        - ``max_messages``, then ``max_bytes`` (segment file sizes, framing included): walking
          from the newest segment back, segments are kept while the total stays within the limit;
          the first one that would exceed it and every older one go. So at most the limit is kept,
          often less, and everything when there is only one segment.

        :returns: whether anything expired (:attr:`oldest_offset` then moves to the first kept
            segment's base, past every record when only an empty active segment is left). A closed
            log expires nothing (Liftbridge's cleaner loop ends when its log closes).
        """
        if self._closed:
            return False
        segs = self._segments
        last = len(segs) - 1
        keep = 0  # index of the first segment kept
        if max_age_ns > 0:
            ttl = now_ns - max_age_ns
            while keep < last and (segs[keep].timestamps[-1] if segs[keep].timestamps else 0) < ttl:
                keep += 1
        oldest = self._oldest
        if max_messages > 0:
            keep = self._first_kept(keep, max_messages, lambda s: s.next_offset - max(s.base, oldest))
        if max_bytes > 0:
            keep = self._first_kept(keep, max_bytes, lambda s: s.size)
        return keep > 0 and self.discard_before(segs[keep].base)

    def _first_kept(self, start: int, limit: int, measure: Callable[[_Segment], int]) -> int:
        """Index of the oldest segment from ``start`` on that the newest-first walk keeps within
        ``limit`` (the last segment always counts and is always kept)."""
        segs = self._segments
        total = measure(segs[-1])
        for i in range(len(segs) - 2, start - 1, -1):
            total += measure(segs[i])
            if total > limit:
                return i + 1
        return start

    def discard_before(self, offset: int) -> bool:
        """Move :attr:`oldest_offset` forward to ``offset`` (never past the last written record,
        never backwards) and delete the segments wholly before it; return whether it moved.

        Retention uses it, and so does the compaction of the ``__cursors`` stream (``cursors.py``).
        """
        oldest = min(offset, self._flushed_next)
        if oldest <= self._oldest:
            return False
        self._oldest = oldest
        while len(self._segments) > 1 and self._segments[1].base <= oldest:
            seg = self._segments.pop(0)
            self._bases.pop(0)
            seg.close()
            seg.path.unlink(missing_ok=True)
        return True

    @property
    def first_timestamp(self) -> int:
        """Timestamp of the oldest retained record, 0 when none."""
        return 0 if self.is_empty else self.timestamp_of(self._oldest)

    @property
    def latest_timestamp(self) -> int:
        """Timestamp of the newest committed record, 0 when none is retained."""
        return 0 if self.is_empty else self.timestamp_of(self._flushed_next - 1)

    # -- lifecycle ------------------------------------------------------------
    def close(self) -> None:
        """Flush what is buffered (best effort) and close every segment file; idempotent. Records
        appended afterwards are refused by :meth:`flush` (:class:`LogClosedError`)."""
        if self._pending and self._segments and self._segments[-1].fd >= 0 and not self._closed:
            try:
                self.flush()
            except OSError:
                pass
        self._closed = True
        for seg in self._segments:
            seg.close()

    def destroy(self) -> None:
        """Close the log and delete its directory."""
        self._pending.clear()
        self._pending_ts.clear()
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)
