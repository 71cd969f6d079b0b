"""Deferrable sensors look once before they defer, seen through real DAG runs (``dag.test()`` on
the dev server, triggers run in line by Airflow's test runner): targets already committed finish
without a DEFERRED state; targets committed after the sensors looked defer, then succeed when
their triggers fire. Each sensor's log says which way it went."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators.deferral import DEFERRING, NOT_DEFERRING

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]
DAGS = Path(__file__).parent / "dags"
DAG_ID = "liftbridge_sensor_deferral"
#: The DAG's sensor tasks, by the class name their log lines carry.
SENSORS = {
    "wait_offset": "LiftbridgeOffsetSensor",
    "wait_ack": "LiftbridgeAckSensor",
    "wait_message": "LiftbridgeMessageSensor",
}


@pytest.fixture(scope="module")
def dag(airflow_db: None) -> Any:
    """The sensors' DAG, written to the metadata DB as the DAG processor would (``dag.test()``
    runs only serialized DAGs, and this one lives outside the configured DAGs folder)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    DagBundlesManager().sync_bundles_to_db()
    bag = BundleDagBag(dag_folder=str(DAGS), bundle_path=DAGS, bundle_name="dags-folder")
    assert bag.import_errors == {}
    sync_bag_to_db(bag, "dags-folder", None)
    return bag.get_dag(DAG_ID)


class States:
    """Every state Airflow gives the DAG's task instances, in order (an ORM attribute listener),
    with an optional callback when one becomes DEFERRED."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.on_deferred: Callable[[str], None] | None = None

    def record(self, target: Any, value: Any, _old: Any, _initiator: Any) -> None:
        state = str(getattr(value, "value", value))
        if target.dag_id == DAG_ID and value is not None:
            self.seen.append((target.task_id, state))
            if state == "deferred" and self.on_deferred:
                self.on_deferred(target.task_id)

    def of(self, task_id: str) -> list[str]:
        return [state for task, state in self.seen if task == task_id]


@pytest.fixture
def states() -> Iterator[States]:
    from airflow.models.taskinstance import TaskInstance
    from sqlalchemy import event

    recorder = States()
    event.listen(TaskInstance.state, "set", recorder.record)
    yield recorder
    event.remove(TaskInstance.state, "set", recorder.record)


def run(dag: Any, stream: str) -> tuple[Any, dict[str, str], dict[str, list[str]]]:
    """Run the DAG on ``stream``; return the run, the final task states and each sensor's
    "deferring or not" log lines."""
    summary = {"stream": stream, "partitions": {"1": {"first_offset": 0, "last_offset": 1, "count": 2}}}
    with structlog.testing.capture_logs(processors=[structlog.stdlib.add_logger_name]) as logs:
        dag_run = dag.test(run_conf={"stream": stream, "summary": summary})
    final = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    lines: dict[str, list[str]] = {task: [] for task in SENSORS}
    for entry in logs:
        for task, cls in SENSORS.items():
            if entry.get("event") in (DEFERRING, NOT_DEFERRING) and str(entry.get("logger")).endswith(f".{cls}"):
                lines[task].append(entry["event"])
    return dag_run, final, lines


def targets(client: LiftbridgeClient, stream: str) -> dict[str, Callable[[], None]]:
    """What each sensor waits for: offset 2 on partition 0, offsets 0-1 on 1, "ready" on 2."""
    return {
        "wait_offset": lambda: client.publish_many(stream, [b"a", b"b", b"c"], partition=0),
        "wait_ack": lambda: client.publish_many(stream, [b"a", b"b"], partition=1),
        "wait_message": lambda: client.publish_many(stream, [b"not yet", b"ready"], partition=2),
    }


def test_sensors_with_their_targets_committed_do_not_defer(
    dag: Any, stream_name: str, liftbridge_client: LiftbridgeClient, states: States
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=3)
    for commit in targets(liftbridge_client, stream_name).values():
        commit()
    dag_run, final, lines = run(dag, stream_name)
    assert str(dag_run.state) == "success", final
    assert final == dict.fromkeys(SENSORS, "success")
    assert "deferred" not in {state for _, state in states.seen}, states.seen
    assert lines == dict.fromkeys(SENSORS, [NOT_DEFERRING])


def test_sensors_defer_until_their_targets_are_committed_then_succeed(
    dag: Any, stream_name: str, liftbridge_client: LiftbridgeClient, states: States
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=3)
    commits = targets(liftbridge_client, stream_name)
    timers: list[threading.Timer] = []

    def commit_later(task_id: str) -> None:
        # 3 s after the sensor looked and deferred: its trigger is waiting by then.
        timers.append(threading.Timer(3.0, commits[task_id]))
        timers[-1].start()

    states.on_deferred = commit_later
    try:
        dag_run, final, lines = run(dag, stream_name)
    finally:
        for timer in timers:
            timer.cancel()
    assert str(dag_run.state) == "success", final
    assert final == dict.fromkeys(SENSORS, "success")
    for task in SENSORS:
        assert "deferred" in states.of(task) and states.of(task)[-1] == "success", (task, states.of(task))
    assert lines == dict.fromkeys(SENSORS, [DEFERRING])
