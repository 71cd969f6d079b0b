"""The deferrable wait of an interval read under the real deployment (tests/system/conftest.py):
the triggerer, not ``dag.test()``'s inline trigger loop, holds the wait.

A run of ``system_interval_wait`` (tests/system/dags/system_interval_wait.py) reads the interval
``[start, start + WINDOW)`` of a fresh stream, with real timestamps (the dev server is a process of
its own, so the test cannot set its reception clock): the run starts right after ``start``, long
before the interval is complete. The stream holds a message just before ``start`` and two inside;
once the task is DEFERRED a third message inside is published, and, once the end has passed, one
after the end. Checked from outside: the task went through ``deferred`` (the REST API's state,
the scheduler's executor events, the worker's and the trigger's logs), it finished after the end,
and its XCom counts exactly the three messages stamped inside the interval, the one published
while it was deferred among them.

No sleeps: each step polls for what it waits for (a state, a log line, the clock passing the end).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators.deferral import DEFERRING
from scripts.deployment import Deployment, DeploymentError, wait_until
from tests.system.dags.system_interval_wait import ALLOWED_LATENESS

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]

DAG_ID = "system_interval_wait"
TASK_ID = "read_interval"
#: The interval's length: long enough for the scheduler to start the task (and the task to defer)
#: well before the end on a busy 2-core machine, short for the test's budget.
WINDOW = dt.timedelta(seconds=30)
#: What Airflow 3.3.2's supervisor logs when it kills a resumed deferred task (apache/airflow#72716).
RACE = "Server indicated the task shouldn't be running anymore"


@pytest.fixture(scope="module")
def client(deployment: Deployment) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(deployment.devserver.address) as lb:
        yield lb


def utc(ns: int) -> dt.datetime:
    """Nanoseconds since the epoch as an aware datetime (microseconds: what ISO 8601 text holds)."""
    return dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(microseconds=ns // 1000)


def publish(client: LiftbridgeClient, stream: str, value: bytes) -> tuple[int, int]:
    """Publish one message; return its offset and the leader's timestamp of it (ns)."""
    ack = client.publish(stream, value)
    assert ack is not None
    return ack.offset, ack.reception_timestamp


def ti_state(deployment: Deployment, run_id: str) -> str:
    return str(deployment.task_states(DAG_ID, run_id).get(TASK_ID) or "")


def deferrals_handled(deployment: Deployment, run_id: str) -> int:
    """How many times the scheduler has handled the executor's report of the task's process
    exiting while the task was DEFERRED. Once it has, a trigger firing cannot meet that stale
    report after the task is running again (the kill of apache/airflow#72716)."""
    pattern = re.compile(
        rf"TaskInstance Finished: dag_id={DAG_ID}, task_id={TASK_ID}, run_id={re.escape(run_id)},.*?, state=deferred,"
    )
    return len(pattern.findall(deployment.log_text("scheduler")))


def wait_for_deferral(deployment: Deployment, run_id: str, count: int, timeout: float) -> None:
    """Wait until the task is DEFERRED for the ``count``-th time, and the scheduler has handled
    the deferring process's exit."""

    def deferred() -> bool:
        deployment.check_running()
        state = ti_state(deployment, run_id)
        if state in ("success", "failed"):
            raise DeploymentError(f"the task is {state} before deferring {count} time(s) (logs: {deployment.log_dir})")
        return state == "deferred" and deferrals_handled(deployment, run_id) >= count

    wait_until(f"deferral {count} of {DAG_ID}.{TASK_ID}", deferred, timeout=timeout)


def task_logs(deployment: Deployment, run_id: str) -> tuple[str, str]:
    """The task's worker logs and its triggers' logs, all attempts."""
    folder = deployment.log_dir / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={TASK_ID}"
    worker = "".join(p.read_text(errors="replace") for p in sorted(folder.glob("attempt=*.log")))
    trigger = "".join(p.read_text(errors="replace") for p in sorted(folder.glob("attempt=*.log.trigger.*.log")))
    return worker, trigger


def xcom(deployment: Deployment, run_id: str) -> dict[str, Any]:
    entry = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}/xcomEntries/return_value")
    value = entry["value"] if not isinstance(entry["value"], str) else json.loads(entry["value"])
    assert isinstance(value, dict)
    return value


def test_a_run_started_before_its_interval_is_complete_waits_in_the_triggerer_and_reads_exactly_it(
    deployment: Deployment, client: LiftbridgeClient
) -> None:
    deployment.wait_for_dags([DAG_ID])
    stream = f"system-interval-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    before_offset, before_ns = publish(client, stream, b"before")
    start_ns = (before_ns // 1000 + 1000) * 1000  # 1 ms after the message before it, in whole microseconds
    wait_until("the clock to pass the interval's start", lambda: time.time_ns() > start_ns, timeout=5, interval=0.001)
    start = utc(start_ns)
    end = start + WINDOW
    end_ns = start_ns + int(WINDOW.total_seconds() * 1e9)
    inside = [publish(client, stream, b"inside-%d" % n) for n in (1, 2)]

    run_id = deployment.trigger_dag(
        DAG_ID, {"stream": stream, "start_time": start.isoformat(), "end_time": end.isoformat()}
    )
    # The task looks once, finds the interval incomplete (no message at or after its end, the end
    # not passed) and defers: LiftbridgeIntervalTrigger waits in the triggerer for the next offset.
    wait_for_deferral(deployment, run_id, 1, timeout=(end_ns - time.time_ns()) / 1e9 - 5)
    # A message inside the interval, published while the task waits: the run started before its
    # interval was complete. Its offset fires the trigger; the task looks again and defers again.
    late_inside = publish(client, stream, b"inside-while-deferred")
    assert late_inside[1] < end_ns, "published after the interval's end: the deployment was too slow for WINDOW"
    wait_for_deferral(deployment, run_id, 2, timeout=(end_ns - time.time_ns()) / 1e9 + ALLOWED_LATENESS)
    assert time.time_ns() < end_ns + ALLOWED_LATENESS * 1_000_000_000, "deferred again too late: raise ALLOWED_LATENESS"
    # The first message after the end completes the interval (before end + allowed_lateness): its
    # offset fires the trigger, the task finds the interval complete and reads it, without it.
    wait_until(
        "the interval's end", lambda: time.time_ns() >= end_ns, timeout=WINDOW.total_seconds() + 5, interval=0.05
    )
    after_offset, _ = publish(client, stream, b"after")
    published_after_at = time.time_ns()

    state = deployment.wait_for_run(DAG_ID, run_id, timeout=180)
    ti = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}")
    worker, trigger = task_logs(deployment, run_id)
    assert state == "success", f"{ti['state']} (logs: {deployment.log_dir})"
    if ti["try_number"] != 1:  # a resumed attempt killed by Airflow 3.3.2, then the retry: see check_sensor
        assert ti["try_number"] == 2 and RACE in worker, f"try {ti['try_number']} (logs: {deployment.log_dir})"
        print(f"\n{DAG_ID}.{TASK_ID}: a resumed attempt was killed by apache/airflow#72716, retried")

    # It waited in the triggerer: it deferred twice, and the last trigger (the triggerer keeps one
    # log per attempt and triggerer: the latest trigger's) fired there on the message after the end.
    assert worker.count(DEFERRING) >= 2 and worker.count("Pausing task as DEFERRED") >= 2
    fired = re.findall(r"Trigger fired event.*?TriggerEvent<(\{.*?\})>", trigger)
    assert fired, f"no trigger fired in the triggerer (logs: {deployment.log_dir})"
    assert f"'target_offset': {after_offset}, 'offset': {after_offset}, 'reason': 'offset'" in fired[-1], fired
    assert dt.datetime.fromisoformat(ti["start_date"]) < end  # the task (its first attempt) began inside the interval
    assert dt.datetime.fromisoformat(ti["end_date"]) >= end

    # The stream as the leader stamped it: the two messages inside, the one published while the task
    # was deferred and nothing else are in [start, end).
    stamped = {m.offset: m.timestamp for m in client.subscribe(stream, start_at=0, stop_at=after_offset)}
    assert stamped[before_offset] < start_ns <= stamped[inside[0][0]]
    assert stamped[late_inside[0]] < end_ns <= stamped[after_offset]
    expected = sorted(o for o, ns in stamped.items() if start_ns <= ns < end_ns)
    assert expected == [inside[0][0], inside[1][0], late_inside[0]]

    result = xcom(deployment, run_id)
    assert result["read_by"] == "interval"
    assert result["interval"] == {"start": start.isoformat(), "end": end.isoformat()}
    assert result["processed"] == len(expected) == 3
    partition = result["partitions"]["0"]
    assert (partition["first_offset"], partition["last_offset"]) == (expected[0], expected[-1])
    read = [int(o) for o in re.findall(r"interval message: partition 0 offset (\d+) ", worker)]
    assert sorted(set(read)) == expected  # the function saw exactly these (a retry may repeat none: one reading)
    print(
        f"\n{DAG_ID}: run started {(dt.datetime.fromisoformat(ti['start_date']) - start).total_seconds():.1f} s into"
        f" a {WINDOW.total_seconds():.0f} s interval, {worker.count('Pausing task as DEFERRED')} deferral(s),"
        f" finished {(dt.datetime.fromisoformat(ti['end_date']) - end).total_seconds():.1f} s after its end"
        f" ({(published_after_at - end_ns) / 1e9:.1f} s after the end the message after it was published)"
    )
