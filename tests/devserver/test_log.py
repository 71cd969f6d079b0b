"""The partition log on its own: framing, recovery from torn writes, segments, timestamps, retention."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from airflow_provider_liftbridge.devserver.log import BATCH_MAX_MESSAGES, RECORD_OVERHEAD, LogClosedError, PartitionLog


def fill(log: PartitionLog, n: int, *, start_ts: int = 1_000, size: int = 10) -> None:
    for i in range(n):
        log.append(bytes([i % 256]) * size, start_ts + i)
    log.flush()


def test_offsets_start_at_zero_and_only_flushed_records_are_committed(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    assert (log.newest_offset, log.next_offset) == (-1, 0)
    assert log.append(b"a", 1) == 0
    assert log.append(b"b", 2) == 1
    assert log.newest_offset == -1 and log.read(0) == []
    assert log.flush() == 2
    assert log.newest_offset == 1
    assert log.read(0) == [b"a", b"b"]
    log.close()


def test_reopen_keeps_every_record(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    fill(log, 100)
    log.close()
    again = PartitionLog(tmp_path)
    assert again.newest_offset == 99
    assert again.read(0, 1000) == [bytes([i]) * 10 for i in range(100)]
    assert again.recovered_torn_records == 0
    again.close()


def test_torn_last_record_is_dropped_on_open(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    fill(log, 5)
    log.close()
    seg = next(tmp_path.glob("*.log"))
    size = seg.stat().st_size
    os.truncate(seg, size - 3)  # a write cut short by a kill
    again = PartitionLog(tmp_path)
    assert again.newest_offset == 3
    assert again.recovered_torn_records == 1
    assert seg.stat().st_size == size - (RECORD_OVERHEAD + 10)
    # The log keeps working after the cut: the next record takes the dropped offset.
    assert again.append(b"new", 9_999) == 4
    again.flush()
    again.close()
    third = PartitionLog(tmp_path)
    assert third.read(3, 10) == [bytes([3]) * 10, b"new"]
    third.close()


def test_corrupt_record_is_detected_by_checksum(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    fill(log, 3)
    log.close()
    seg = next(tmp_path.glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[-1] ^= 0xFF  # flip a bit in the last body
    seg.write_bytes(bytes(data))
    again = PartitionLog(tmp_path)
    assert again.newest_offset == 1
    again.close()


def test_segments_roll_and_reads_cross_them(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, segment_max_bytes=1024)
    for i in range(200):  # one flush each: a segment rolls only between batches
        log.append(bytes([i % 256]) * 40, 1_000 + i)
        log.flush()
    assert len(list(tmp_path.glob("*.log"))) > 5
    assert log.read(0, 1000, max_bytes=1 << 30) == [bytes([i % 256]) * 40 for i in range(200)]
    log.close()
    again = PartitionLog(tmp_path, segment_max_bytes=1024)
    assert again.newest_offset == 199
    assert again.read(150, 5) == [bytes([i]) * 40 for i in range(150, 155)]
    again.close()


def test_read_respects_count_and_byte_budget(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    fill(log, 50, size=100)
    assert len(log.read(0, 7)) == 7
    assert len(log.read(0, 50, max_bytes=300)) == 2  # budget reached after whole records
    assert len(log.read(0, 50, max_bytes=1)) == 1  # always at least one
    log.close()


def test_timestamp_lookups(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path)
    for i, ts in enumerate([10, 20, 20, 30]):
        log.append(bytes([i]), ts)
    log.flush()
    assert log.first_offset_at_or_after(20) == 1
    assert log.first_offset_at_or_after(25) == 3
    assert log.first_offset_at_or_after(31) == 4
    assert log.last_offset_at_or_before(20) == 2
    assert log.last_offset_at_or_before(9) == -1
    log.close()


RECORD = RECORD_OVERHEAD + 20


def five_per_segment(directory: Path, n: int) -> PartitionLog:
    """A log of ``n`` 20-byte records, one flush each, in segments of five records (the last one,
    the active segment, holds the rest); record ``i`` is stamped ``1000 + i``."""
    log = PartitionLog(directory, segment_max_bytes=5 * RECORD)
    for i in range(n):
        log.append(bytes([i]) * 20, 1_000 + i)
        log.flush()
    return log


def test_a_full_segment_rolls_before_the_next_batch_which_is_written_whole(tmp_path: Path) -> None:
    # Liftbridge's commitLog.Append: checkAndPerformSplit (position >= maxBytes), then the whole
    # message set into the active segment.
    log = PartitionLog(tmp_path, segment_max_bytes=3 * RECORD)
    fill(log, 2, size=20)
    fill(log, 4, size=20)  # starts below the limit: all four go into the first segment
    assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == [0]
    fill(log, 1, size=20)  # the first segment is full: a new one first
    assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == [0, 6]
    fill(log, BATCH_MAX_MESSAGES + 1, size=20)  # Liftbridge's batches are 1,024 messages at most
    assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == [0, 6, 7 + BATCH_MAX_MESSAGES]
    log.close()


def test_retention_by_messages_keeps_whole_segments_within_the_limit(tmp_path: Path) -> None:
    log = five_per_segment(tmp_path, 23)  # segments from 0, 5, 10, 15 and the active one from 20 (3 records)
    assert not log.enforce_retention(max_messages=23)  # 3 + 4 * 5 = 23 fit: nothing goes
    assert log.enforce_retention(max_messages=12)  # 3 + 5 fit, 3 + 5 + 5 do not: 8 kept, fewer than 12
    assert log.oldest_offset == 15 and log.read(0, 1)[0] == bytes([15]) * 20
    assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == [15, 20]
    assert log.enforce_retention(max_messages=2)  # the active segment stays even beyond the limit
    assert (log.oldest_offset, log.newest_offset) == (20, 22)
    assert not log.enforce_retention(max_messages=1)  # one segment: everything stays
    log.close()
    again = PartitionLog(tmp_path, segment_max_bytes=5 * RECORD)
    assert (again.oldest_offset, again.newest_offset) == (20, 22)
    again.close()


def test_retention_by_bytes_keeps_whole_segments_within_the_limit(tmp_path: Path) -> None:
    log = five_per_segment(tmp_path, 23)
    assert log.enforce_retention(max_bytes=8 * RECORD + 1)  # the active 3 records and the 5 before
    assert log.oldest_offset == 15
    assert log.enforce_retention(max_bytes=8 * RECORD - 1)
    assert log.oldest_offset == 20
    log.close()


def test_retention_by_age_keeps_a_segment_with_one_young_record(tmp_path: Path) -> None:
    log = five_per_segment(tmp_path, 23)
    # Everything stamped before 1007 has expired: the first segment (1000-1004) goes, the second
    # (1005-1009) stays whole for its records 1007-1009.
    assert log.enforce_retention(max_age_ns=93, now_ns=1_100)
    assert log.oldest_offset == 5
    # All but the active segment are older than the age: it stays all the same.
    assert log.enforce_retention(max_age_ns=1, now_ns=10_000)
    assert (log.oldest_offset, log.newest_offset) == (20, 22)
    log.close()


def test_a_full_active_segment_rolled_by_the_cleaner_leaves_an_empty_log(tmp_path: Path) -> None:
    # What the lead measured on Liftbridge v1.9.0-72: the cleaner rolls the full active segment,
    # the next run deletes every older one, and only an empty segment at the next offset is left.
    log = five_per_segment(tmp_path, 10)
    assert log.check_split(0)  # full (no age limit): rolled
    assert not log.check_split(0)  # an empty segment is neither full nor old
    assert log.enforce_retention(max_messages=4)  # the five records of the segment before are too many
    assert log.is_empty and (log.oldest_offset, log.newest_offset) == (10, 9)
    assert log.read(0) == []
    log.close()
    again = PartitionLog(tmp_path, segment_max_bytes=5 * RECORD)
    assert again.is_empty and (again.oldest_offset, again.newest_offset) == (10, 9)
    assert again.append(b"x", 2_000) == 10
    again.close()


def test_failed_write_rolls_the_log_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full disk cannot be arranged here: os.write is replaced for one flush by one that writes
    # part of the data and then fails with ENOSPC, as a filling disk does.
    log = PartitionLog(tmp_path)
    fill(log, 3)
    size = os.path.getsize(next(tmp_path.glob("*.log")))
    real_write = os.write

    def disk_full(fd: int, data: bytes | memoryview) -> int:
        real_write(fd, bytes(data[:7]))
        raise OSError(errno.ENOSPC, "No space left on device")

    log.append(b"lost-1", 10)
    log.append(b"lost-2", 11)
    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        log.flush()
    monkeypatch.setattr(os, "write", real_write)
    # As before the failed flush: the torn bytes are gone and the offsets are given out again.
    assert (log.newest_offset, log.next_offset) == (2, 3)
    assert os.path.getsize(next(tmp_path.glob("*.log"))) == size
    assert log.append(b"next", 12) == 3
    log.flush()
    assert log.read(0) == [bytes([0]) * 10, bytes([1]) * 10, bytes([2]) * 10, b"next"]
    log.close()
    again = PartitionLog(tmp_path)
    assert again.read(0)[-1] == b"next" and again.recovered_torn_records == 0
    again.close()


def test_a_write_after_close_is_refused_and_not_stored(tmp_path: Path) -> None:
    # A broker that stopped (or a restarted cluster) closed the log while a write was on its way:
    # the write is refused as Liftbridge's "commit log was closed", not tried on closed descriptors.
    log = PartitionLog(tmp_path)
    fill(log, 3)
    log.close()
    assert log.closed
    log.append(b"late", 9_999)
    with pytest.raises(LogClosedError, match="commit log was closed: 1 record"):
        log.flush()
    assert log.next_offset == 3 and not log.has_pending
    log.close()  # idempotent
    again = PartitionLog(tmp_path)
    assert again.newest_offset == 2 and b"late" not in again.read(0)
    again.close()
