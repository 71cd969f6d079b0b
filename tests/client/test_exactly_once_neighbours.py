"""Exactly-once publishing beside other producers (the tasks of one Spark job writing the same
partitions), on the virtual clock and partition model of ``test_exactly_once_scripted.py``.

Before a call returns it reads what lies between its own records (ADR 8 rule 5): here it must
neither wait for the other writers to pause nor read its own long runs back, and it must still
fail on a duplicate of its own sequence numbers and watch a zombie's arrivals for ``quiet``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from airflow_provider_liftbridge.client import Ack, AckPolicy, Record
from airflow_provider_liftbridge.client.effects import OpenStream, Unary
from airflow_provider_liftbridge.client.exactly_once import (
    PRODUCER_HEADER,
    SEQ_HEADER,
    ConcurrentProducerError,
)
from airflow_provider_liftbridge.client.exactly_once.state import PartitionState
from airflow_provider_liftbridge.client.exactly_once.tail import SKIP_OWN_RUN, unread_ranges
from airflow_provider_liftbridge.client.types import AckError

from .scripted import scripted_client
from .test_exactly_once_scripted import TIMEOUT, Clock, Partition, _ours, _publisher


def record(producer: bytes, seq: int) -> Record:
    return Record(b"%s-%d" % (producer, seq), headers={PRODUCER_HEADER: producer, SEQ_HEADER: b"%d" % seq})


class Busy(Partition):
    """A partition another producer keeps writing to: a record of its own before every partition
    metadata read, and the subscriptions' ranges kept."""

    def __init__(self, clock: Clock, *, busy: bool = True) -> None:
        super().__init__(clock)
        self.busy = busy
        self.other = 0
        self.reads: list[tuple[int, int]] = []

    def intrude(self, make: Callable[[int], Record] | None = None) -> None:
        self.append(make(self.other) if make else record(b"other", self.other))
        self.other += 1

    def answer(self, effect: Any) -> Any:
        if self.busy and isinstance(effect, Unary) and effect.method == "FetchPartitionMetadata":
            self.intrude()
        if isinstance(effect, OpenStream):
            self.reads.append((effect.request.startOffset, effect.request.stopOffset))
        return super().answer(effect)


class Interleaved:
    """The publisher's sender: records land in runs of ``run``, with ``between`` records of another
    writer (``intruder``) after each run; every record acknowledged."""

    def __init__(self, part: Busy, run: int, between: int = 3, intruder: Callable[[int], Record] | None = None):
        self.part, self.run, self.between, self.intruder = part, run, between, intruder
        self.lose_last = 0  # records a new leader never had: cut off the log once acknowledged

    def send(self, records: Sequence[Record]) -> list[Ack]:
        acks = []
        for i, rec in enumerate(records):
            if i and i % self.run == 0:
                for _ in range(self.between):
                    self.part.intrude(self.intruder)
            offset = self.part.append(rec)
            acks.append(Ack("s", 0, "s", "s", offset, "", "", AckPolicy.LEADER, 0, 0, AckError.OK))
        if self.lose_last:
            del self.part.log[-self.lose_last :]
            self.part.hw = self.part.newest
        return acks

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run(
    run: int, intruder: Callable[[int], Record] | None = None, *, busy: bool = True
) -> tuple[Clock, Busy, Any, Interleaved]:
    clock = Clock()
    part = Busy(clock, busy=busy)
    sender = Interleaved(part, run, intruder=intruder)
    publisher = _publisher(scripted_client(part.answer, timeout=TIMEOUT), sender, clock)  # type: ignore[arg-type]
    return clock, part, publisher, sender


def test_the_end_of_a_call_reads_between_its_records_without_waiting_for_the_others_to_pause() -> None:
    clock, part, publisher, _ = _run(run=100)

    result = publisher.publish([b"r%d" % i for i in range(1000)])

    assert (result.written, result.skipped) == (1000, 0)
    assert _ours(part) == {i: 1 for i in range(1000)}
    # The other writer never paused: the call did not wait for it (no time passed), where it
    # used to read and wait until the partition stood still, up to the timeout.
    assert clock.now == 0.0
    # What lies between its runs of 100 was read, the runs themselves not.
    read = {o for first, last in part.reads for o in range(first, last + 1)}
    mine = {o for o, m in enumerate(part.log) if m.headers.get(PRODUCER_HEADER) == b"p"}
    between = {o for o in range(min(mine), max(mine)) if o not in mine}
    assert between <= read and not read & mine


def test_short_runs_of_its_own_are_read_through() -> None:
    _, part, publisher, _ = _run(run=SKIP_OWN_RUN // 4)

    publisher.publish([b"r%d" % i for i in range(200)])

    verify = [(first, last) for first, last in part.reads if first > 0]
    assert len(verify) == 1  # one subscription over the whole range, not one per gap


def test_a_duplicate_of_its_own_between_its_records_still_fails_the_call() -> None:
    # A zombie try of the same producer stores sequence number 0 again between the runs.
    _, part, publisher, _ = _run(run=100, intruder=lambda i: record(b"p", 0) if i == 4 else record(b"other", i))

    with pytest.raises(ConcurrentProducerError, match="sequence number|more than once|twice"):
        publisher.publish([b"r%d" % i for i in range(300)])


def test_records_of_its_producer_from_elsewhere_are_watched_for_quiet() -> None:
    # A zombie's records with sequence numbers this call does not have (no duplicate): the call
    # succeeds, after watching the partition for ``quiet`` seconds.
    clock, part, publisher, _ = _run(
        run=100, intruder=lambda i: record(b"p", 5000 + i) if i == 4 else record(b"other", i)
    )

    result = publisher.publish([b"r%d" % i for i in range(300)])

    assert result.written == 300
    assert clock.now >= publisher.reader.waits.quiet


def test_records_acknowledged_by_a_leader_that_lost_them_do_not_hold_the_call(caplog: Any) -> None:
    # Ack policy LEADER: a new leader without the last records took over before the end-of-call
    # read. The log ends, committed, below them: nothing more will come, so the read goes on (and
    # the loss is logged, as before) instead of waiting for a high watermark that never reaches them.
    clock, part, publisher, sender = _run(run=100, busy=False)
    sender.lose_last = 5

    result = publisher.publish([b"r%d" % i for i in range(300)])

    assert result.written == 300
    assert clock.now < publisher.reader.waits.tail_wait
    assert len(_ours(part)) == 295


@pytest.mark.parametrize(
    ("scanned_to", "runs", "stop", "expected"),
    [
        (-1, [], 9, [(0, 9)]),
        (-1, [(10, 200)], 300, [(0, 9), (201, 300)]),
        (-1, [(10, 20), (100, 300)], 400, [(0, 99), (301, 400)]),  # a short run is read through
        (49, [(0, 200)], 300, [(201, 300)]),  # a run that began before the scan's start
        (49, [(60, 100)], 55, [(50, 55)]),  # a run beyond the stop
        (-1, [(5, 500)], 300, [(0, 4)]),  # a run past the stop: acknowledged, not committed yet
        (10, [], 10, []),
    ],
)
def test_unread_ranges(
    scanned_to: int, runs: list[tuple[int, int]], stop: int, expected: list[tuple[int, int]]
) -> None:
    assert SKIP_OWN_RUN <= 64
    state = PartitionState(scan_start=0, scanned_to=scanned_to, next_offset=scanned_to + 1)
    for low, high in runs:
        for offset in range(low, high + 1):
            state.own.add(offset)

    assert unread_ranges(state, stop) == expected
