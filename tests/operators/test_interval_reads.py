"""read=DataInterval() through real DAG runs (``dag.test()`` with explicit logical dates) against
the dev server, whose reception clock the test sets (devserver/clock.py): three hours of messages
on two partitions, an hourly DAG, and each run reading exactly its hour, in every try, clear and
backfill; bad input before anything is read."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import set_reception_clock
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import DataInterval, SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators import consume_support as support

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(240)]
UTC = dt.UTC
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
MINUTES = (1, 17, 33, 59)
RECORD = "tests.operators.consume_support.record_interval"


@pytest.fixture
def three_hours(liftbridge_client: LiftbridgeClient, stream_name: str) -> Iterator[dict[int, set[tuple[int, int]]]]:
    """A 2-partition stream with messages at :01, :17, :33 and :59 of 10:00, 11:00 and 12:00 on
    2026-03-02, and two more received now; yields, per hour, the (partition, offset) pairs of it."""
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    per_hour: dict[int, set[tuple[int, int]]] = {0: set(), 1: set(), 2: set()}
    offsets = [0, 0]
    try:
        for hour in range(3):
            for minute in MINUTES:
                set_reception_clock(stream_name, T0 + hour * HOUR + dt.timedelta(minutes=minute))
                for partition in (0, 1):
                    if partition == 1 and minute == 17:
                        continue  # partitions hold different numbers
                    liftbridge_client.publish(stream_name, b"%d:%02d" % (10 + hour, minute), partition=partition)
                    per_hour[hour].add((partition, offsets[partition]))
                    offsets[partition] += 1
    finally:
        set_reception_clock(stream_name, None)
    for partition in (0, 1):
        liftbridge_client.publish(stream_name, b"today", partition=partition)  # the real clock: not those hours
    yield per_hour


def make_dag(stream: str, **op_kwargs: Any) -> Any:
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    op_kwargs.setdefault("retries", 1)
    op_kwargs.setdefault("retry_delay", dt.timedelta(seconds=0))
    op_kwargs.setdefault("apply_function", RECORD)
    op_kwargs.setdefault("read", DataInterval())
    with DAG(
        f"interval_{stream}_{uuid.uuid4().hex[:6]}",
        schedule=CronDataIntervalTimetable("0 * * * *", "UTC"),
        start_date=T0,
        catchup=False,
    ) as dag:
        LiftbridgeConsumeOperator(task_id="consume", stream=stream, batch_size=2, **op_kwargs)
    register_dag(dag)
    return dag


def run_hour(dag: Any, hour: int) -> tuple[Any, Any]:
    """Run the hour starting at 10:00 + ``hour``: a manual run's data interval is the last whole
    hour before its logical date (Airflow's ``infer_manual_data_interval``), so it is dated at the end."""
    support.SEEN.clear()
    dag_run = dag.test(logical_date=T0 + (hour + 1) * HOUR)
    return dag_run, xcom_of(dag_run, "consume")


def seen() -> set[tuple[int, int]]:
    return {where for _, where, _ in support.SEEN}


def test_each_hourly_run_reads_exactly_its_hour_and_a_clear_reads_it_again(
    stream_name: str, three_hours: dict[int, set[tuple[int, int]]]
) -> None:
    support.reset()
    dag = make_dag(stream_name, read=DataInterval(cursor_id="c"))
    for hour in range(3):
        dag_run, result = run_hour(dag, hour)
        assert str(dag_run.state) == "success"
        assert seen() == three_hours[hour] and len(support.SEEN) == len(three_hours[hour])
        assert result["cursor_id"] == "c" and result["processed"] == len(three_hours[hour])
        assert result["interval"] == {
            "start": (T0 + hour * HOUR).isoformat(),
            "end": (T0 + (hour + 1) * HOUR).isoformat(),
        }
        assert all(value.startswith(b"%d:" % (10 + hour)) for _, _, value in support.SEEN)
    # Clearing the 11:00 run (dag.test of the same logical date: the same run id) reads its hour again.
    dag_run, result = run_hour(dag, 1)
    assert str(dag_run.state) == "success" and seen() == three_hours[1] and result["processed"] == len(three_hours[1])


def test_a_backfill_reads_past_hours_not_todays_position(
    stream_name: str, three_hours: dict[int, set[tuple[int, int]]], liftbridge_client: LiftbridgeClient
) -> None:
    """A reader by position took everything (its cursor is at today's end); interval runs of past
    hours, newest first as a backfill may go, each read their past messages."""
    support.reset()
    from airflow.sdk import DAG

    with DAG(f"position_{stream_name}", schedule=None, start_date=T0) as by_position:
        LiftbridgeConsumeOperator(task_id="consume", stream=stream_name, read=SinceLastRun("c"), apply_function=RECORD)
    register_dag(by_position)
    assert str(by_position.test().state) == "success"
    assert liftbridge_client.fetch_cursor("c", stream_name, 0) == 12  # 12 messages of the hours + today's
    dag = make_dag(stream_name, read=DataInterval(cursor_id="c"))
    for hour in (2, 0, 1):
        dag_run, _ = run_hour(dag, hour)
        assert str(dag_run.state) == "success" and seen() == three_hours[hour]
    assert liftbridge_client.fetch_cursor("c", stream_name, 0) == 12  # the position reader's cursor is untouched


def test_a_retry_resumes_after_the_last_finished_batch(
    stream_name: str, three_hours: dict[int, set[tuple[int, int]]]
) -> None:
    """Hour 11 holds offsets 4..7 of partition 0 (batches of 2): the first try fails at offset 7
    (4..6 were handed over and committed: a per-message function commits up to the message before
    the one that failed); the retry starts at 7, repeating none of them."""
    support.reset(fail_at=(0, 7), fails=1)
    dag_run, result = run_hour(make_dag(stream_name, read=DataInterval(cursor_id="c")), 1)
    assert str(dag_run.state) == "success"
    by_try = {t: sorted(w for tt, w, _ in support.SEEN if tt == t) for t in (1, 2)}
    assert [w for w in by_try[1] if w[0] == 0] == [(0, 4), (0, 5), (0, 6)]
    assert [w for w in by_try[2] if w[0] == 0] == [(0, 7)]
    assert {w for w in by_try[1] + by_try[2]} == three_hours[1]
    assert result["partitions"]["0"]["resumed"] is True


def test_two_runs_of_different_hours_in_progress_together_never_share_a_message(
    stream_name: str, three_hours: dict[int, set[tuple[int, int]]]
) -> None:
    """The 10:00 run fails part-way (no retries left); the 11:00 run runs meanwhile; the cleared
    10:00 run then finishes its hour: no message is in both, none of 10:00 is handed over twice."""
    dag = make_dag(stream_name, read=DataInterval(cursor_id="c"), retries=0)
    support.reset(fail_at=(0, 2), fails=1)
    dag_run, _ = run_hour(dag, 0)
    assert str(dag_run.state) == "failed"
    first_part = seen()
    assert first_part == {(0, 0), (0, 1)}
    _, eleven = run_hour(dag, 1)
    eleven_seen = seen()
    assert eleven_seen == three_hours[1]
    dag_run, _ = run_hour(dag, 0)  # cleared: its last try failed, so it goes on after what it handed over
    assert str(dag_run.state) == "success"
    assert seen().isdisjoint(first_part) and seen() | first_part == three_hours[0]
    assert eleven_seen.isdisjoint(three_hours[0])


def test_an_empty_interval_succeeds_with_zero_messages(
    stream_name: str, three_hours: dict[int, set[tuple[int, int]]]
) -> None:
    support.reset()
    dag_run, result = run_hour(make_dag(stream_name), 5)  # 15:00: between those hours and today's messages
    assert str(dag_run.state) == "success"
    assert support.SEEN == [] and result["processed"] == 0 and result["empty"] is True


def test_bad_interval_arguments_fail_at_parse_time(stream_name: str) -> None:
    def op(**kwargs: Any) -> Any:
        return LiftbridgeConsumeOperator(task_id="t", stream=stream_name, apply_function=RECORD, **kwargs)

    with pytest.raises(LiftbridgeArgumentError, match="end_time=.*not after its start"):
        op(read=DataInterval(start_time="2026-03-02T11:00:00Z", end_time="2026-03-02T10:00:00Z"))
    with pytest.raises(LiftbridgeArgumentError, match="start_time.*time zone"):
        op(read=DataInterval(start_time="2026-03-02T10:00:00"))
    with pytest.raises(LiftbridgeArgumentError, match="lateness=-1 is not valid"):
        op(read=DataInterval(-1))
    with pytest.raises(TypeError, match="unexpected keyword argument 'min_messages'"):  # not a field of the mode
        DataInterval(min_messages=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'group_id'"):
        DataInterval(group_id="g")  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'start_time'"):
        SinceLastRun("c", start_time="2026-03-02T10:00:00Z")  # type: ignore[call-arg]
    op(read=DataInterval(start_time="{{ data_interval_start }}", end_time="{{ data_interval_start }}"))  # later


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (
            {"read_by": "interval", "allowed_lateness": 60},
            "use read=DataInterval(lateness=60) instead of read_by='interval', allowed_lateness=60",
        ),
        (
            {"read_by": "interval", "cursor_id": "c", "start_time": "{{ ds }}"},
            "use read=DataInterval(start_time='{{ ds }}', cursor_id='c') instead of read_by='interval', cursor_id='c',"
            " start_time='{{ ds }}'",
        ),
        (
            {"cursor_id": "c", "min_messages": 5, "max_batch_size": 10},
            "use read=SinceLastRun(cursor_id='c', min_messages=5) instead of cursor_id='c', min_messages=5; use"
            " batch_size=10 instead of max_batch_size=10",
        ),
        (
            {"group_id": "g", "max_poll_interval": 30},
            "use read=ConsumerGroup(group_id='g', max_poll_interval=30) instead of group_id='g', max_poll_interval=30",
        ),
        (
            {
                "cursor_id": "c",
                "on_error": "dead_letter",
                "dead_letter_stream": "dlq",
                "create_dead_letter_stream": True,
            },
            "use dead_letters=DeadLetterStream('dlq', create=True) instead of on_error='dead_letter',"
            " dead_letter_stream='dlq', create_dead_letter_stream=True",
        ),
    ],
)
def test_every_old_keyword_names_its_new_form(stream_name: str, old: dict[str, Any], new: str) -> None:
    """The keywords the modes replaced fail when the DAG is parsed, saying what to write instead."""
    with pytest.raises(TypeError) as info:
        LiftbridgeConsumeOperator(task_id="t", stream=stream_name, apply_function=RECORD, **old)
    assert new in str(info.value) and isinstance(info.value, ValueError)


def test_a_rendered_interval_whose_end_is_not_after_its_start_fails_before_reading(
    stream_name: str, three_hours: dict[int, set[tuple[int, int]]], liftbridge_client: LiftbridgeClient
) -> None:
    support.reset()
    dag = make_dag(
        stream_name,
        read=DataInterval(cursor_id="c", start_time="{{ data_interval_end }}", end_time="{{ data_interval_start }}"),
        retries=0,
    )
    dag_run, _ = run_hour(dag, 0)
    assert str(dag_run.state) == "failed" and support.SEEN == []


def test_a_deferrable_run_started_before_its_interval_is_complete_waits_in_the_trigger(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """The interval ends 10 s after the run starts, with no allowed lateness, and no message comes
    after it: the task finds it incomplete, defers (LiftbridgeIntervalTrigger, run inline by
    dag.test()) until the end, and execute_complete then reads the interval's one message."""
    from airflow_provider_liftbridge.client.reading import Interval, IntervalPlanner

    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish(stream_name, b"inside")  # the real clock: inside the interval below
    now = dt.datetime.now(UTC)
    interval = Interval(now - dt.timedelta(minutes=1), now + dt.timedelta(seconds=10))
    look = IntervalPlanner(
        liftbridge_client, stream_name, cursor_prefix="x", plan_key="x/x", interval=interval, lateness=dt.timedelta(0)
    )
    assert [b.partition for b in look.incomplete([0])] == [0]  # not complete when the run starts
    support.reset()
    dag = make_dag(
        stream_name,
        deferrable=True,
        read=DataInterval(0, start_time=interval.start.isoformat(), end_time=interval.end.isoformat()),
    )
    dag_run, result = run_hour(dag, 0)
    assert str(dag_run.state) == "success"
    assert [v for _, _, v in support.SEEN] == [b"inside"] and result["processed"] == 1
    assert dt.datetime.now(UTC) >= interval.end  # it did not read before the interval was over
