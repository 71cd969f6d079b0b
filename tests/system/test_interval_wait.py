"""The deferrable wait of an interval read under the real deployment (tests/system/conftest.py):
the triggerer, not ``dag.test()``'s inline trigger loop, holds the wait.

A run of ``system_interval_wait`` (tests/system/dags/system_interval_wait.py) reads the interval
``[start, start + WINDOW)`` of a fresh stream, with real timestamps (the dev server is a process of
its own, so the test cannot set its reception clock): the run starts right after ``start``, long
before the interval is complete. A publisher keeps the stream live, at :data:`RATE` messages a
second, from before ``start`` until the run has finished: every one of those messages is committed
while the task waits. Checked from outside: the task deferred exactly once and resumed exactly once
(the worker's log, the scheduler's executor events, one trigger event), with no retry; the trigger
fired on a message stamped at or after the end; and the XCom and the function's log hold exactly
the messages the leader stamped inside the interval.

The trigger must have started in the triggerer before the end (else the wait was not held on a
live stream: the deployment was too slow for :data:`WINDOW`). Before issue 54 (ca642c2) the trigger
fired on the partition's next committed offset: on this live stream the task resumed a few seconds
after each deferral, found the interval open and deferred again (15 deferrals in one run here), or
a resumed attempt was killed by apache/airflow#72716.

No sleeps: each step polls for what it waits for (a state, a log line, the clock passing the end).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators.deferral import DEFERRING, NOT_DEFERRING
from scripts.deployment import Deployment, DeploymentError, wait_until

#: The time-out covers the deployment's start when this test runs first (over 4 minutes at a load
#: of 20 on 2 cores) beside its own minute and a half.
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]

DAG_ID = "system_interval_wait"
TASK_ID = "read_interval"
#: The interval's length: long enough for the scheduler to start the task, the task to defer and
#: the triggerer to start its trigger well before the end on a busy 2-core machine (at a load of
#: 20 the trigger started 43 s after the run was triggered), short for the test's budget.
WINDOW = dt.timedelta(seconds=60)
#: Messages a second the publisher keeps the stream live with (the issue: at least 10).
RATE = 20
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


def trigger_started_at(deployment: Deployment, run_id: str) -> dt.datetime | None:
    """When the run's trigger first logged in the triggerer (the task's trigger log, JSON lines):
    about when the triggerer started it."""
    folder = deployment.log_dir / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={TASK_ID}"
    stamps = []
    for path in folder.glob("attempt=*.log.trigger.*.log"):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                stamps.append(dt.datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")))
    return min(stamps) if stamps else None


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


class Publisher:
    """Publishes one message every ``1 / rate`` s on a client of its own, in a thread, until
    stopped; keeps each acked message's offset and leader timestamp."""

    def __init__(self, address: str, stream: str, rate: float) -> None:
        self.acks: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(address, stream, 1 / rate), daemon=True)

    def _run(self, address: str, stream: str, pause: float) -> None:
        try:
            with LiftbridgeClient(address) as client:
                n = 0
                while not self._stop.is_set():
                    self.acks.append(publish(client, stream, b"live-%d" % n))
                    n += 1
                    self._stop.wait(pause)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self._error = exc

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[int, int]]:
        """Stop; the acks. :raises AssertionError: a publish failed."""
        self._stop.set()
        self._thread.join()
        assert self._error is None, f"the publisher failed: {self._error!r}"
        return self.acks


def test_a_run_started_before_its_interval_is_complete_defers_once_on_a_live_stream_and_reads_exactly_it(
    deployment: Deployment, client: LiftbridgeClient
) -> None:
    deployment.wait_for_dags([DAG_ID])
    stream = f"system-interval-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    publisher = Publisher(deployment.devserver.address, stream, RATE).start()
    try:
        wait_until("the publisher's first ack", lambda: publisher.acks or None, timeout=30, interval=0.01)
        start_ns = (publisher.acks[0][1] // 1000 + 1000) * 1000  # 1 ms after its first message, whole µs
        wait_until(
            "the clock to pass the interval's start", lambda: time.time_ns() > start_ns, timeout=5, interval=0.001
        )
        start = utc(start_ns)
        end = start + WINDOW
        end_ns = start_ns + int(WINDOW.total_seconds() * 1e9)
        run_id = deployment.trigger_dag(
            DAG_ID, {"stream": stream, "start_time": start.isoformat(), "end_time": end.isoformat()}
        )
        # The task looks once, finds the interval incomplete and defers: LiftbridgeIntervalTrigger
        # waits in the triggerer while the publisher goes on.
        wait_for_deferral(deployment, run_id, 1, timeout=(end_ns - time.time_ns()) / 1e9 - 5)
        started = wait_until(
            "the triggerer to start the trigger",
            lambda: trigger_started_at(deployment, run_id),
            timeout=WINDOW.total_seconds() + 60,
        )
        # The test is about a wait held in the triggerer while the stream is live before the end.
        assert started < end, (
            f"the trigger started {started - end} after the end: the deployment is too slow for WINDOW"
        )
        state = deployment.wait_for_run(DAG_ID, run_id, timeout=180)
    finally:
        acks = publisher.stop()
    ti = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{TASK_ID}")
    worker, trigger = task_logs(deployment, run_id)
    assert state == "success", f"{ti['state']} (logs: {deployment.log_dir})"

    # The stream stayed live: at least RATE a second over the whole wait, past the end.
    during = [ns for _, ns in acks if start_ns <= ns < end_ns]
    assert len(during) >= RATE * WINDOW.total_seconds() * 0.5, f"only {len(during)} messages in the interval"
    assert acks[-1][1] > end_ns

    # Deferred once, resumed once: one deferral (worker log and the scheduler's executor events),
    # one trigger event, one look after it that found the interval complete, no retry.
    assert ti["try_number"] == 1, f"try {ti['try_number']} (logs: {deployment.log_dir})"
    assert RACE not in worker
    assert worker.count(DEFERRING) == 1 and worker.count("Pausing task as DEFERRED") == 1, worker.count(DEFERRING)
    assert deferrals_handled(deployment, run_id) == 1
    assert worker.count(NOT_DEFERRING) == 1
    fired = re.findall(r"Trigger fired event.*?TriggerEvent<(\{.*?\})>", trigger)
    assert len(fired) == 1, f"trigger events: {fired} (logs: {deployment.log_dir})"
    assert "'complete': {'0': 'a committed message at or after the end'}" in fired[0], fired
    assert dt.datetime.fromisoformat(ti["start_date"]) < end  # the task (its first attempt) began inside the interval
    assert dt.datetime.fromisoformat(ti["end_date"]) >= end

    # Exactly the messages the leader stamped inside [start, end): the publisher's acks say which.
    expected = sorted(o for o, ns in acks if start_ns <= ns < end_ns)
    stamped = {m.offset: m.timestamp for m in client.subscribe(stream, start_at=0, stop_at=acks[-1][0])}
    assert expected == sorted(o for o, ns in stamped.items() if start_ns <= ns < end_ns)
    result = xcom(deployment, run_id)
    assert result["cursor_id"] is None  # the progress cursors have the default prefix
    assert result["interval"] == {"start": start.isoformat(), "end": end.isoformat()}
    assert result["processed"] == len(expected)
    partition = result["partitions"]["0"]
    assert (partition["first_offset"], partition["last_offset"]) == (expected[0], expected[-1])
    read = [int(o) for o in re.findall(r"interval message: partition 0 offset (\d+) ", worker)]
    assert read == expected  # the function saw exactly these, once each, in order
    print(
        f"\n{DAG_ID}: {len(acks)} messages at {RATE} a second; the trigger started"
        f" {(end - started).total_seconds():.1f} s before the end; the run started"
        f" {(dt.datetime.fromisoformat(ti['start_date']) - start).total_seconds():.1f} s into a"
        f" {WINDOW.total_seconds():.0f} s interval, {worker.count('Pausing task as DEFERRED')} deferral(s),"
        f" finished {(dt.datetime.fromisoformat(ti['end_date']) - end).total_seconds():.1f} s after its end"
    )
