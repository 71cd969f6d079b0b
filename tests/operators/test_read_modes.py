"""The reading modes as values (``read=SinceLastRun(...)`` / ``ConsumerGroup(...)`` /
``DataInterval(...)``) and ``dead_letters=DeadLetterStream(...)``: what each holds, that a keyword of
another mode cannot be written, and that Airflow renders their templated fields in a real run."""

from __future__ import annotations

import datetime as dt
import json
import uuid
import warnings
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import ConsumerGroup, DataInterval, DeadLetterStream, SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators import consume_support as support

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _consume(**kwargs: Any) -> Any:
    kwargs.setdefault("read", SinceLastRun("c"))
    return LiftbridgeConsumeOperator(task_id="c", stream="s", apply_function=print, **kwargs)


def test_each_mode_holds_only_its_own_fields() -> None:
    assert SinceLastRun("c", max_messages=5) == SinceLastRun(cursor_id="c", max_messages=5)
    assert SinceLastRun("c") != ConsumerGroup("c")
    assert repr(SinceLastRun("c", min_messages=3)) == "SinceLastRun(cursor_id='c', min_messages=3)"
    assert repr(DataInterval(lateness=0)) == "DataInterval(lateness=0)"
    assert repr(ConsumerGroup("g", max_poll_interval=None)) == "ConsumerGroup(group_id='g', max_poll_interval=None)"
    for build in (
        lambda: SinceLastRun("c", group_id="g"),
        lambda: SinceLastRun("c", lateness=60),
        lambda: ConsumerGroup("g", cursor_id="c"),
        lambda: DataInterval(max_messages=10),
        lambda: DataInterval(start_at="latest"),
    ):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            build()


def test_a_mode_checks_its_fields_when_the_dag_is_parsed_and_after_rendering() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="min_messages=-1 is not valid"):
        _consume(read=SinceLastRun("c", min_messages=-1))
    with pytest.raises(LiftbridgeArgumentError, match="max_poll_interval=0 is not valid"):
        _consume(read=ConsumerGroup("g", max_poll_interval=0))
    with pytest.raises(LiftbridgeArgumentError, match="group_id='' is not valid"):
        _consume(read=ConsumerGroup(""))
    op = _consume(read=SinceLastRun("{{ params.cursor }}", start_at="{{ params.start }}"))  # later
    with pytest.raises(LiftbridgeArgumentError, match="start_at='soon' is not valid"):
        op.render_template_fields({"params": {"cursor": "c", "start": "soon"}}, _jinja())


def _jinja() -> Any:
    import jinja2

    return jinja2.Environment()


def test_the_mode_is_rendered_per_task_and_the_given_value_is_left_alone() -> None:
    shared = SinceLastRun("{{ task.task_id }}-cursor", start_at="{{ params.start }}")
    first = LiftbridgeConsumeOperator(task_id="a", stream="s", read=shared, apply_function=print)
    second = LiftbridgeConsumeOperator(task_id="b", stream="s", read=shared, apply_function=print)
    for op in (first, second):
        op.render_template_fields({"task": op, "params": {"start": "latest"}}, _jinja())
    assert (first.read.cursor_id, second.read.cursor_id) == ("a-cursor", "b-cursor")
    assert first.read.start_at == "latest" and isinstance(first.read, SinceLastRun)
    assert shared.cursor_id == "{{ task.task_id }}-cursor"  # each operator renders its own copy


def test_a_dag_run_renders_the_modes_fields(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    """Airflow's templater renders the fields a mode lists in ``template_fields``: the cursor and
    start of ``SinceLastRun``, the times of ``DataInterval``, in a real ``dag.test()``."""
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [json.dumps({"n": i}).encode() for i in range(4)])
    later = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=1)  # the end of the interval read below
    while dt.datetime.now(dt.UTC) <= later:
        pass  # the next message is stamped at or after it (the dev server's clock is this machine's)
    liftbridge_client.publish(stream_name, b'{"n": 4}')  # after the end: the interval is complete
    support.reset()
    params = {
        "cursor": f"{stream_name}-rendered",
        "start": "2",
        "from": "2020-01-01T00:00:00Z",
        "to": later.isoformat(),
    }
    with DAG(f"modes_{stream_name}_{uuid.uuid4().hex[:6]}", schedule=None, start_date=START, params=params) as dag:
        LiftbridgeConsumeOperator(
            task_id="since",
            stream=stream_name,
            read=SinceLastRun("{{ params.cursor }}", start_at="{{ params.start }}"),
            apply_function="tests.operators.consume_support.record_plain",
        )
        LiftbridgeConsumeOperator(
            task_id="interval",
            stream=stream_name,
            read=DataInterval(lateness=0, start_time="{{ params['from'] }}", end_time="{{ params.to }}"),
            apply_function_batch="tests.operators.consume_support.record_batch",
        )
    register_dag(dag)
    dag_run = dag.test()
    assert str(dag_run.state) == "success"
    since = xcom_of(dag_run, "since")
    assert since["cursor_id"] == params["cursor"] and since["partitions"]["0"]["first_offset"] == 2
    assert liftbridge_client.fetch_cursor(params["cursor"], stream_name, 0) == 4
    interval = xcom_of(dag_run, "interval")
    assert interval["interval"]["start"].startswith("2020-01-01T00:00:00") and interval["processed"] == 4


# -- dead letters: one value ------------------------------------------------------------------


def test_dead_letters_is_one_value() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        op = _consume(dead_letters=DeadLetterStream("dlq", create=True))
    assert op.dead_letters == DeadLetterStream("dlq", create=True)
    assert op.dead_letter_target() == "dlq"
    assert _consume().dead_letters is None


def test_dead_letters_is_templated_and_rendered_as_a_whole() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the templated value waits for rendering
        op = _consume(dead_letters=DeadLetterStream("{{ params.dlq }}", create=True))
    assert "dead_letters" in op.template_fields
    op.render_template_fields({"params": {"dlq": "orders-dlq"}}, _jinja())
    assert op.dead_letters == DeadLetterStream("orders-dlq", create=True)
    assert isinstance(op.dead_letters, DeadLetterStream)
    bad = _consume(dead_letters=DeadLetterStream("{{ params.dlq }}"))
    with pytest.raises(LiftbridgeArgumentError, match="dead_letters.stream='' is not valid"):
        bad.render_template_fields({"params": {"dlq": ""}}, _jinja())


# -- a plan's trip: no file entered twice, never back up a layer -------------------------------------


def _trips(op: Any) -> list[list[str]]:
    """Run ``op``'s ``run`` (a task context of its own, as ``bench/reading_bench.py`` does) and
    return the call stack, from the operator's ``run`` down, of every call into ``operators/`` or
    ``client/reading/`` before the batched read (``read_plan`` calls the task's handler back by
    design, so the trip ends there): the files of those two rooms on it, a file once per stretch of
    consecutive frames."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    package = Path(__file__).resolve().parents[2] / "airflow_provider_liftbridge"
    rooms = (str(package / "operators") + "/", str(package / "client" / "reading") + "/")
    trips: list[list[str]] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(rooms):
            return
        if frame.f_code.co_filename.endswith("client/reading/runner.py"):
            sys.setprofile(None)  # the plan is made: the batched read begins
            return
        files: list[str] = []
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(rooms) and (not files or files[-1] != name):
                files.append(name)
            if frame.f_code.co_name == "run" and name.endswith("reading_base.py"):
                trips.append([str(Path(f).relative_to(package)) for f in reversed(files)])
                return
            frame = frame.f_back

    context = {"ti": SimpleNamespace(dag_id="trip", task_id=op.task_id, map_index=-1), "run_id": uuid.uuid4().hex}
    sys.setprofile(profile)
    try:
        op.run(op.hook.client, context)
    finally:
        sys.setprofile(None)
        op.hook.close()
    return trips


@pytest.mark.parametrize(
    "read", [SinceLastRun("trip", min_messages=3), DataInterval(lateness=0)], ids=["since-last-run", "data-interval"]
)
def test_a_plans_trip_enters_no_file_twice_and_never_climbs_back_up(
    read: Any, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """From the operator's ``run`` to the plan, the wait before it and the bookkeeping, every call
    stack enters each file of the reading path once and goes from ``operators/`` down to
    ``client/reading/``, never back (issue 56: it entered 12 files 18 times and climbed back twice)."""
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"%d" % i for i in range(3)])
    if isinstance(read, DataInterval):
        read.start_time, read.end_time = "2020-01-01T00:00:00Z", dt.datetime.now(dt.UTC).isoformat()
        liftbridge_client.publish(stream_name, b"after the end")  # the interval is complete
    op = LiftbridgeConsumeOperator(task_id="trip", stream=stream_name, read=read, apply_function=print)
    trips = _trips(op)
    assert trips and all(trip[0] == "operators/reading_base.py" for trip in trips)
    for trip in trips:
        assert len(trip) == len(set(trip)), trip  # no file entered twice on the way down
        rooms = [path.split("/")[0] for path in trip]
        assert rooms == sorted(rooms, key=lambda room: room != "operators"), trip  # operators, then the core
    planner = "client/reading/plan.py" if isinstance(read, SinceLastRun) else "client/reading/interval.py"
    assert [t for t in trips if t[-2:] == ["client/reading/strategies.py", planner]]  # the strategy plans
