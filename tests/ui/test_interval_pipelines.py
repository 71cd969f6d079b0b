"""Pipelines reading by interval (``read=DataInterval()``) in the view: registered and charted like
those reading by position, from real hourly DAG runs (``dag.test()`` with explicit logical dates)
on the session dev server, whose reception clock the test sets (devserver/clock.py), read through
the view's endpoints behind Airflow's auth; and registry and history entries of the version
before, which have no interval, still load."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import PipelineEntry, RunEntry, read_pipelines
from airflow_provider_liftbridge.devserver import set_reception_clock
from airflow_provider_liftbridge.operators import DataInterval
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators import consume_support as support
from tests.ui.test_api import Api, airflow_app, connections, pipeline_of, token  # noqa: F401  (fixtures too)

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]
UTC = dt.UTC
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
#: Per hour (0: 10:00, 1: 11:00), the minutes of its messages on partitions 0 and 1.
MESSAGES = {0: {0: (5, 40), 1: (20,)}, 1: {0: (10,), 1: (15, 45)}}


def publish_hours(client: LiftbridgeClient, stream: str) -> None:
    """The messages of :data:`MESSAGES` at their times, then one received now on each partition.

    Partition 0 holds offsets 0, 1 (10:00), 2 (11:00), 3 (now); partition 1: 0 (10:00), 1, 2
    (11:00), 3 (now)."""
    client.create_stream(stream, stream, partitions=2)
    try:
        for hour, partitions in MESSAGES.items():
            for partition, minutes in partitions.items():
                for minute in minutes:
                    set_reception_clock(stream, T0 + hour * HOUR + dt.timedelta(minutes=minute))
                    client.publish(stream, b"%d:%02d" % (10 + hour, minute), partition=partition)
    finally:
        set_reception_clock(stream, None)
    for partition in (0, 1):
        client.publish(stream, b"now", partition=partition)


def hourly_dag(stream: str) -> Any:
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    with DAG(
        f"ui_interval_{stream}", schedule=CronDataIntervalTimetable("0 * * * *", "UTC"), start_date=T0, catchup=False
    ) as dag:
        LiftbridgeConsumeOperator(
            task_id="consume",
            stream=stream,
            read=DataInterval(cursor_id=f"{stream}-progress"),
            apply_function="tests.ui.ui_support.accept",
        )
    register_dag(dag)
    return dag


def run_hour(dag: Any, hour: int) -> dict[str, Any]:
    """Run the hour from 10:00 + ``hour`` (a manual run's data interval is the whole hour before its
    logical date); return the task's XCom."""
    dag_run = dag.test(logical_date=T0 + (hour + 1) * HOUR)
    assert str(dag_run.state) == "success"
    return xcom_of(dag_run, "consume")  # type: ignore[no-any-return]


def iso(hour: int) -> str:
    return (T0 + hour * HOUR).isoformat()


def test_an_interval_pipeline_is_listed_with_its_interval_and_charted_per_interval(
    airflow_app: Any,  # noqa: F811  (the imported fixtures)
    stream_name: str,
    lb_address: str,
    connections: Any,  # noqa: F811
) -> None:
    """The 11:00 hour runs first, then 10:00 (as a backfill may go), then 10:00 again (a clear: a
    second reading, with fresh progress cursors). The pipelines page lists the task with its latest
    interval (10:00), its progress there (not the never-set cursor ``<cursor_id>`` a position
    pipeline would have), the interval's offsets and the messages after its end; the charts have
    the three runs in interval order, each with its interval."""
    with LiftbridgeClient(lb_address) as client:
        publish_hours(client, stream_name)
    dag = hourly_dag(stream_name)
    assert run_hour(dag, 1)["processed"] == 3
    assert run_hour(dag, 0)["processed"] == 3
    assert run_hour(dag, 0)["processed"] == 3  # cleared: read again
    api = Api(airflow_app, token("op"))

    pipeline = pipeline_of(api.get("/api/connections/liftbridge_default/pipelines"), stream_name)
    assert (pipeline["dag_id"], pipeline["task_id"], pipeline["mode"]) == (
        f"ui_interval_{stream_name}",
        "consume",
        "DataInterval",
    )
    assert pipeline["interval"] == {"start": iso(0), "end": iso(1), "finished": True}
    assert (pipeline["cursor_id"], pipeline["position_cursor"]) == (f"{stream_name}-progress",) * 2
    rows = {r["partition"]: r for r in pipeline["partitions"]}
    # Read up to the interval's last offset; the lag: what came after its end (11:00 and now).
    assert {p: (r["position"], r["high_watermark"], r["lag"]) for p, r in rows.items()} == {0: (1, 3, 2), 1: (0, 3, 3)}
    assert pipeline["lag"] == 5
    assert rows[0]["plan"] == {"start": 0, "end": 2, "run_id": pipeline["last_run_id"], "finished": True}
    assert rows[1]["plan"] == {"start": 0, "end": 1, "run_id": pipeline["last_run_id"], "finished": True}
    assert rows[0]["last_commit_time"].startswith("2026-03-02T10:40:00")
    with LiftbridgeClient(lb_address) as client:  # the view did not read its positions from here
        assert client.fetch_cursor(f"{stream_name}-progress", stream_name, 0) == -1

    history = [
        p for p in api.get("/api/connections/liftbridge_default/history")["pipelines"] if p["stream"] == stream_name
    ]
    [charted] = history
    assert charted["by_interval"] is True and charted["partitions"] == [0, 1]
    runs = charted["runs"]
    assert [(r["interval"]["start"], r["interval"]["end"]) for r in runs] == [(iso(0), iso(1))] * 2 + [(iso(1), iso(2))]
    assert [r["interval"]["start_time"] for r in runs] == [(T0 + h * HOUR).timestamp() for h in (0, 0, 1)]
    assert [(r["partitions"]["0"]["processed"], r["partitions"]["1"]["processed"]) for r in runs] == [(2, 1)] * 2 + [
        (1, 2)
    ]
    # The lag when each run ended: messages after the end of the interval it read.
    assert [(r["partitions"]["0"]["lag"], r["partitions"]["1"]["lag"]) for r in runs] == [(2, 3)] * 2 + [(1, 1)]


def test_an_interval_pipeline_mid_reading_shows_its_progress_open(
    airflow_app: Any,  # noqa: F811
    stream_name: str,
    lb_address: str,
    connections: Any,  # noqa: F811
) -> None:
    """A first try that failed part-way (no retries): the page shows the progress reached in the
    interval, the partitions not finished, the interval not read, and the lag from the progress."""
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    with LiftbridgeClient(lb_address) as client:
        publish_hours(client, stream_name)
    with DAG(
        f"ui_interval_fail_{stream_name}",
        schedule=CronDataIntervalTimetable("0 * * * *", "UTC"),
        start_date=T0,
        catchup=False,
    ) as dag:
        LiftbridgeConsumeOperator(
            task_id="consume",
            stream=stream_name,
            read=DataInterval(),
            partitions=[0],
            batch_size=1,
            apply_function="tests.operators.consume_support.fail_at_offset",
            retries=0,
        )
    register_dag(dag)
    support.reset(fail_at=1)  # offset 0 is read and committed, offset 1 fails the try
    assert str(dag.test(logical_date=T0 + HOUR).state) == "failed"
    pipeline = pipeline_of(
        Api(airflow_app, token("op")).get("/api/connections/liftbridge_default/pipelines"), stream_name
    )
    assert pipeline["interval"] == {"start": iso(0), "end": iso(1), "finished": False}
    assert pipeline["position_cursor"] == "airflow"  # no cursor_id: the progress cursors' default prefix
    [row] = pipeline["partitions"]
    assert (row["partition"], row["position"], row["high_watermark"], row["lag"]) == (0, 0, 3, 3)
    assert row["plan"] == {"start": 0, "end": 2, "run_id": pipeline["last_run_id"], "finished": False}


def test_entries_of_the_version_before_load_as_reading_by_position(stream_name: str, lb_address: str) -> None:
    """A registry entry without ``mode`` or ``read_by`` (written before reading by interval was
    registered) is a position pipeline, one of before the modes had names loads as the mode its
    ``read_by`` and group said; a history entry without an interval has none; entries with them
    round-trip."""
    old = (
        b'{"cursor_id": "c", "dag_id": "d", "dead_letter_stream": null, "group_id": null, "map_index": -1,'
        b' "operator": "LiftbridgeConsumeOperator", "partitions": [0, 1], "plan_key": "d/t",'
        b' "position_cursor": "c", "recorded_at": 1700000000000, "run_id": "r", "stream": "s", "task_id": "t"}'
    )
    registry = f"{stream_name}-registry"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(registry, registry, compact_enabled=True)
        client.publish(registry, old, key=b"old")
        [entry] = read_pipelines(client, stream=registry)
    assert (entry.mode, entry.interval_start, entry.interval_offsets, entry.partitions) == (
        "SinceLastRun",
        None,
        (),
        (0, 1),
    )
    by_interval = PipelineEntry(
        stream="s",
        position_cursor="airflow",
        plan_key="d/t",
        dag_id="d",
        task_id="t",
        run_id="r",
        partitions=(0, 1),
        mode="DataInterval",
        interval_start=1,
        interval_end=2,
        interval_offsets=((0, 3, 5), (1, 0, 0)),
    )
    assert PipelineEntry.from_json(by_interval.to_json()) == by_interval
    # Entries written before the modes had names: read_by said "interval"; a group's had a group_id.
    old_interval = old.replace(b'"cursor_id": "c",', b'"cursor_id": "c", "read_by": "interval",')
    old_group = old.replace(b'"group_id": null', b'"group_id": "g"')
    assert [PipelineEntry.from_json(v).mode for v in (old, old_interval, old_group)] == [
        "SinceLastRun",
        "DataInterval",
        "ConsumerGroup",
    ]
    old_run = (
        b'{"dag_id": "d", "task_id": "t", "run_id": "r", "stream": "s", "recorded_at": 5,'
        b' "partitions": {"0": [1, 0, 2, 3]}}'
    )
    assert RunEntry.from_json(old_run).interval is None
    run = RunEntry.from_json(old_run)
    with_interval = RunEntry(run.dag_id, run.task_id, run.run_id, run.stream, run.partitions, interval=(1000, 2000))
    assert RunEntry.from_json(with_interval.to_json()).interval == (1000, 2000)
