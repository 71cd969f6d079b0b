"""The partition log's roll by age and its time lookup as Liftbridge v1.9.0-72 answers it
(``commitLog.EarliestOffsetAfterTimestamp``): an empty newest segment, and a time in the gap before
the newest segment, give "the next offset"; every other time its first message at or after it."""

from __future__ import annotations

from pathlib import Path

from airflow_provider_liftbridge.devserver.log import PartitionLog


def append(log: PartitionLog, *stamps: int) -> None:
    for ts in stamps:
        log.append(b"x", ts)
    log.flush()


def test_a_roll_by_age_leaves_the_newest_segment_empty_and_lookups_answer_the_next_offset(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, segment_max_age_ns=100)
    append(log, *range(1000, 1010))
    assert [log.earliest_offset_after_timestamp(t) for t in (0, 1000, 1005, 1009, 1010)] == [0, 0, 5, 9, 10]
    assert not log.check_split(1099)  # 99 ns after the first record: not old yet
    assert log.check_split(1100)
    assert not log.check_split(5000)  # an empty segment never rolls
    assert len(list(tmp_path.glob("*.log"))) == 2
    assert [log.earliest_offset_after_timestamp(t) for t in (0, 1000, 1005, 1009, 1010)] == [10] * 5
    assert log.first_offset_at_or_after(1005) == 5  # the exact lookup (retention) is not affected
    log.close()
    log = PartitionLog(tmp_path, segment_max_age_ns=100)  # the empty segment is a file: it survives a restart
    assert log.earliest_offset_after_timestamp(1005) == 10
    append(log, 1500)  # into the empty segment (no roll before it: that segment has no first write)
    assert len(list(tmp_path.glob("*.log"))) == 2
    lookups = {t: log.earliest_offset_after_timestamp(t) for t in (0, 1005, 1009, 1010, 1499, 1500, 1501)}
    # 1010 and 1499 lie between the older segment's last record and the newest segment's first.
    assert lookups == {0: 0, 1005: 5, 1009: 9, 1010: 11, 1499: 11, 1500: 10, 1501: 11}
    log.close()


def test_the_segment_search_reads_the_empty_segment_only_on_its_way_right(tmp_path: Path) -> None:
    log = PartitionLog(tmp_path, segment_max_age_ns=50)
    for first in (0, 100, 200, 300):  # each batch is 50 ns or more after the segment's first: a roll before it
        append(log, *range(first, first + 10))
    assert len(list(tmp_path.glob("*.log"))) == 4
    # Four segments: a time in the gap before the last one is "the next offset".
    assert [log.earliest_offset_after_timestamp(t) for t in (5, 150, 205, 250, 305)] == [5, 20, 25, 40, 35]
    assert log.check_split(10_000)
    # Five segments, the last empty: Go's sort.Search looks at segment 2 first; a time before its
    # first record goes left and is right, any later one ends on the empty segment.
    assert [log.earliest_offset_after_timestamp(t) for t in (5, 105, 150, 199, 200, 205, 305)] == [
        5,
        15,
        20,
        20,
        40,
        40,
        40,
    ]
    log.close()
