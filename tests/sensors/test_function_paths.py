"""``LiftbridgeMessageSensor``'s ``apply_function`` is checked for its shape when the DAG is parsed
and imported where it runs: on the worker when the task starts (poking, and the look before
deferring), in the triggerer when it defers. A DAG whose function module is absent where it is
parsed loads and its run succeeds where the module is present; a module missing on the worker
fails the try before anything is read, and the cursor does not move."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from tests.airflow_support import register_dag, xcom_of
from tests.worker_module import WorkerModule

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def sensor_dag(stream: str, **kwargs: Any) -> Any:
    """A registered DAG of one message sensor, built (parsed) in this process."""
    from airflow.sdk import DAG

    with DAG(f"sense_{uuid.uuid4().hex[:8]}", schedule=None, start_date=START) as dag:
        LiftbridgeMessageSensor(task_id="wait", stream=stream, cursor_id="s", poke_interval=0.1, timeout=30, **kwargs)
    register_dag(dag)
    return dag


def test_a_sensor_dag_parses_without_the_module_and_runs_where_it_is(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    module = WorkerModule(tmp_path)
    assert not module.importable()
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"no", b"go"])
    # The path is templated: checked for its shape once rendered, imported on the worker.
    dag = sensor_dag(
        stream_name,
        apply_function="{{ params.matcher }}",
        apply_function_args=["go"],
        params={"matcher": module.path("value_is")},
    )
    assert module.name not in sys.modules

    dag_run = dag.test()  # a worker without the module: the try fails before reading
    assert str(dag_run.state) == "failed"
    logs = capfd.readouterr().out
    assert (
        f"apply_function='{module.path('value_is')}' cannot be imported on the Airflow worker (where the task runs)"
        in logs
    )
    assert module.calls() == [] and liftbridge_client.fetch_cursor("s", stream_name, 0) == -1

    with module.on_path():
        dag_run = dag.test()
    assert str(dag_run.state) == "success"
    assert xcom_of(dag_run, "wait")["message"]["offset"] == 1
    assert [c["offset"] for c in module.calls()] == [0, 1]
    assert liftbridge_client.fetch_cursor("s", stream_name, 0) == 1

    dag_run = dag.test(run_conf={"matcher": "value_is"})  # rendered, then checked: no dotted path
    assert str(dag_run.state) == "failed"
    assert "apply_function='value_is' is not valid: a dotted path of a function is required" in capfd.readouterr().out


def test_a_deferred_sensor_imports_its_function_in_the_triggerer(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """The worker (module present) looks once and defers; the trigger it hands over carries the
    path, not the function, and is imported again where the triggerer runs it."""
    module = WorkerModule(tmp_path)
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"no"])
    sensor = LiftbridgeMessageSensor(
        task_id="wait",
        stream=stream_name,
        apply_function=module.path("value_is"),
        apply_function_args=["go"],
        deferrable=True,
        timeout=30,
    )
    with module.on_path(), pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    assert [c["offset"] for c in module.calls()] == [0]  # the look before deferring, on the worker
    classpath, kwargs = deferred.value.trigger.serialize()
    assert kwargs["apply_function"] == module.path("value_is") and kwargs["start_at"] == 1
    liftbridge_client.publish(stream_name, b"go")

    async def event_of(trigger: LiftbridgeMessageTrigger) -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    missing = asyncio.run(asyncio.wait_for(event_of(LiftbridgeMessageTrigger(**kwargs)), 15))
    assert "cannot be imported on the triggerer (where the trigger runs)" in missing["message"]
    with pytest.raises(Exception, match="cannot be imported on the triggerer"):
        sensor.execute_complete({}, missing)
    with module.on_path():
        found = asyncio.run(asyncio.wait_for(event_of(LiftbridgeMessageTrigger(**kwargs)), 15))
    assert sensor.execute_complete({}, found)["message"]["offset"] == 1
    assert [c["offset"] for c in module.calls()] == [0, 1]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("nope", "apply_function='nope' is not valid: a dotted path of a function is required"),
        (print, "apply_function=<built-in function print> is not valid: a dotted path"),
    ],
)
def test_a_function_of_the_wrong_shape_fails_when_the_dag_is_parsed(value: Any, words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=re.escape(words)):
        LiftbridgeMessageSensor(task_id="m", stream="s", apply_function=value)
