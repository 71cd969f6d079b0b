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
