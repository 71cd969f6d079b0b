"""The counting of the read after a leader change (``exactly_once/recount.py``): each sequence
number counted as stored must be read exactly once; copies an earlier try left (and reported) are
not counted again, and other producers' records are not counted at all."""

from __future__ import annotations

from airflow_provider_liftbridge.client.exactly_once import PRODUCER_HEADER, SEQ_HEADER, SeqSet
from airflow_provider_liftbridge.client.exactly_once.recount import Recount, overlap


def _headers(seq: int, producer: bytes = b"p") -> dict[str, bytes]:
    return {PRODUCER_HEADER: producer, SEQ_HEADER: b"%d" % seq}


def test_missing_and_twice_are_counted_and_known_copies_and_other_producers_are_not() -> None:
    expected = SeqSet(range(10))
    counted = Recount(b"p", expected, known_twice=SeqSet([3]))
    for seq in [0, 1, 2, 3, 3, 5, 5, 6, 7, 42]:  # 4, 8, 9 missing; 5 again; 3 again but known
        counted.take(1, _headers(seq))
    counted.take(0, _headers(4, b"other"))  # another producer's record: not ours
    counted.take(0, {})  # no headers at all
    assert (counted.missing, counted.twice, counted.twice_in) == (3, 1, 1)


def test_the_overlap_of_runs() -> None:
    assert overlap([(0, 9), (20, 29)], [(5, 24)]) == 10
    assert overlap([(0, 9)], []) == 0
    assert overlap([(0, 0), (2, 2)], [(0, 2)]) == 2
