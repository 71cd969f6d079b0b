"""client/reading/interval.py against the dev server, with its reception clock set by the test
(devserver/clock.py): an interval's offsets by Liftbridge's time index, completeness, progress
across tries, a clear after success, messages without timestamps, bad intervals."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient, Message
from airflow_provider_liftbridge.client.reading import (
    BatchFailed,
    Interval,
    IntervalPlanner,
    NoTimestampsError,
    read_plan,
)
from airflow_provider_liftbridge.devserver import set_reception_clock

UTC = dt.UTC
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)


@pytest.fixture
def lb(lb_address: str) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(lb_address) as client:
        yield client


@pytest.fixture
def hours(lb: LiftbridgeClient, stream_name: str) -> Iterator[str]:
    """A 2-partition stream with 3 messages per partition in each of the hours 10, 11 and 12 (at
    :05, :20 and :40), stamped by the dev server's clock set to those times."""
    lb.create_stream(stream_name, stream_name, partitions=2)
    try:
        for hour in range(3):
            for minute in (5, 20, 40):
                set_reception_clock(stream_name, T0 + hour * HOUR + dt.timedelta(minutes=minute))
                for partition in (0, 1):
                    lb.publish(stream_name, b"h%d-m%d" % (hour, minute), partition=partition)
    finally:
        set_reception_clock(stream_name, None)
    yield stream_name


def planner(lb: LiftbridgeClient, stream: str, hour: int, **kwargs: object) -> IntervalPlanner:
    interval = Interval(T0 + hour * HOUR, T0 + (hour + 1) * HOUR)
    return IntervalPlanner(lb, stream, cursor_prefix="pos", plan_key="dag/task", interval=interval, **kwargs)  # type: ignore[arg-type]


def read_all(lb: LiftbridgeClient, p: IntervalPlanner, partitions: list[int]) -> list[Message]:
    got: list[Message] = []

    def handle(batch: list[Message]) -> int:
        got.extend(batch)
        return 0

    read_plan(lb, p.plan(partitions), handle, position_cursor=p.progress_cursor, batch_size=2)
    p.finish(partitions)
    return got


def test_each_hour_reads_exactly_its_messages_by_the_time_index(lb: LiftbridgeClient, hours: str) -> None:
    for hour in range(3):
        p = planner(lb, hours, hour)
        assert p.incomplete([0, 1]) == []
        got = read_all(lb, p, [0, 1])
        assert sorted((m.partition, m.offset) for m in got) == [(q, 3 * hour + i) for q in (0, 1) for i in range(3)]
        assert {m.value[:2] for m in got} == {b"h%d" % hour}
        assert all(
            T0 + hour * HOUR <= dt.datetime.fromtimestamp(m.timestamp / 1e9, UTC) < T0 + (hour + 1) * HOUR for m in got
        )


def test_a_clear_after_success_reads_the_interval_again_without_setting_a_cursor_back(
    lb: LiftbridgeClient, hours: str
) -> None:
    p = planner(lb, hours, 1)
    first = read_all(lb, p, [0])
    assert lb.fetch_cursor(p.readings_cursor, hours, 0) == 1  # reading 0 finished
    cleared = planner(lb, hours, 1)
    again = read_all(lb, cleared, [0])
    assert [m.offset for m in again] == [m.offset for m in first] == [3, 4, 5]
    assert cleared.progress_cursor == p.progress_cursor + "|g1"  # a fresh cursor, not the old one set back
    assert lb.fetch_cursor(p.progress_cursor, hours, 0) == 5 and lb.fetch_cursor(cleared.progress_cursor, hours, 0) == 5
    assert lb.fetch_cursor(p.readings_cursor, hours, 0) == 3  # reading 1 finished: only ever counted up


def test_a_retry_resumes_after_the_last_finished_batch(lb: LiftbridgeClient, hours: str) -> None:
    p = planner(lb, hours, 1)
    seen: list[int] = []

    def fail_at_5(batch: list[Message]) -> int:
        for i, m in enumerate(batch):
            if m.offset == 5:
                raise BatchFailed(i, m, "boom")
            seen.append(m.offset)
        return 0

    with pytest.raises(BatchFailed):
        read_plan(lb, p.plan([0, 1]), fail_at_5, position_cursor=p.progress_cursor, batch_size=2)
    assert seen == [3, 4]
    retry = planner(lb, hours, 1).plan([0, 1])
    assert [(x.partition, x.next_offset, x.end, x.resumed) for x in retry] == [(0, 5, 6, True), (1, 3, 6, False)]


def test_a_retry_after_one_partition_finished_does_not_read_it_again(lb: LiftbridgeClient, hours: str) -> None:
    p = planner(lb, hours, 0)
    lb.set_cursor(p.progress_cursor, hours, 0, 2)  # partition 0 read to its end, the try died on 1
    retry = planner(lb, hours, 0).plan([0, 1])
    assert [(x.next_offset, x.remaining) for x in retry] == [(3, 0), (0, 3)]


def test_an_interval_is_complete_only_with_a_later_message_or_after_the_lateness(
    lb: LiftbridgeClient, stream_name: str
) -> None:
    lb.create_stream(stream_name, stream_name)
    start = dt.datetime.now(UTC) + dt.timedelta(days=1)  # the clock has not reached it
    interval = Interval(start, start + HOUR)
    try:
        set_reception_clock(stream_name, start + dt.timedelta(minutes=10))
        lb.publish(stream_name, b"inside")
        p = IntervalPlanner(lb, stream_name, cursor_prefix="pos", plan_key="d/t", interval=interval)
        (waiting,) = p.incomplete([0])
        assert (waiting.first, waiting.end, waiting.complete) == (0, 1, False)
        with pytest.raises(InvalidArgumentError, match="not complete"):
            p.plan([0])
        late = IntervalPlanner(
            lb, stream_name, cursor_prefix="pos", plan_key="d/t", interval=interval, now_ns=lambda: p.complete_at_ns
        )
        assert late.incomplete([0]) == []  # the lateness passed: what is committed is the interval
        set_reception_clock(stream_name, start + HOUR + dt.timedelta(seconds=1))
        lb.publish(stream_name, b"after")
        assert p.incomplete([0]) == []
        (plan,) = p.plan([0])
        assert (plan.next_offset, plan.end) == (0, 1)
    finally:
        set_reception_clock(stream_name, None)


def test_an_empty_interval_plans_nothing(lb: LiftbridgeClient, hours: str) -> None:
    p = planner(lb, hours, -5)
    assert [x.remaining for x in p.plan([0, 1])] == [0, 0]


def test_messages_without_timestamps_are_refused(lb: LiftbridgeClient, stream_name: str) -> None:
    lb.create_stream(stream_name, stream_name)
    set_reception_clock(stream_name, dt.datetime(1969, 12, 31, 23, tzinfo=UTC))  # stamps below 0
    try:
        lb.publish(stream_name, b"no time")
    finally:
        set_reception_clock(stream_name, None)
    with pytest.raises(NoTimestampsError, match=r"no usable timestamp.*read=SinceLastRun\(\.\.\.\)"):
        planner(lb, stream_name, 0).incomplete([0])


def test_bad_intervals() -> None:
    with pytest.raises(InvalidArgumentError, match="not after its start"):
        Interval(T0, T0)
    with pytest.raises(InvalidArgumentError, match="aware datetime"):
        Interval(dt.datetime(2026, 1, 1), T0)  # noqa: DTZ001


def test_a_paused_partition_is_read_by_interval(lb: LiftbridgeClient, hours: str) -> None:
    """Liftbridge auto-pauses idle partitions: a past hour's are. Looking and reading resume them."""
    lb.pause_stream(hours)
    p = planner(lb, hours, 2)
    assert p.incomplete([0, 1]) == []
    got = read_all(lb, p, [0, 1])
    assert sorted((m.partition, m.offset) for m in got) == [(q, 6 + i) for q in (0, 1) for i in range(3)]
