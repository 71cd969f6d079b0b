"""Under a real Airflow deployment (separate api-server, scheduler, dag-processor and triggerer
processes; see conftest.py): the example DAGs run from the REST API (their sensors, whose targets
upstream tasks committed, finish without deferring), the event-driven DAG fires exactly once per
matching message (one message, a 3,000-message burst, across a triggerer SIGTERM and SIGKILL), a
deferred sensor survives triggerer restarts, and the duplicate window of a triggerer killed in the
middle of a burst is measured against its bound.

The tests share one deployment and run in file order (later ones use the streams earlier ones left).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, NoSuchStreamError
from airflow_provider_liftbridge.operators.deferral import DEFERRING, NOT_DEFERRING
from airflow_provider_liftbridge.triggers.event import DEFAULT_COMMIT_EVERY, DEFAULT_MAX_IN_FLIGHT
from scripts.deployment import Deployment, wait_until

pytestmark = pytest.mark.system

ORDERS_STREAM = "lifecycle-orders"  # what the example consumer's watcher watches
ORDERS_ASSET = "liftbridge_ready_orders"
ORDERS_CURSOR = "example-ready-orders"
BURST_STREAM = "system-burst"
BURST_ASSET = "system_burst_orders"


@pytest.fixture(scope="module")
def client(deployment: Deployment) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(deployment.devserver.address) as lb:
        yield lb


def order(number: int, ready: bool) -> bytes:
    return json.dumps({"order": number, "status": "ready" if ready else "pending"}).encode()


def recreate(client: LiftbridgeClient, stream: str) -> str:
    """A new incarnation of ``stream``; return the watcher cursor id prefix of it."""
    try:
        client.delete_stream(stream)
    except NoSuchStreamError:
        pass
    client.create_stream(stream, stream)
    return str(client.fetch_metadata([stream]).streams[stream].creation_timestamp)


def fired_offsets(deployment: Deployment, asset: str, cursor_key: str) -> list[int]:
    """Offsets of the asset events the watcher fired for one stream incarnation, in event order."""
    return [
        e["payload"]["message"]["offset"]
        for e in deployment.asset_events(asset)
        if e["payload"] and e["payload"].get("cursor_id") == cursor_key
    ]


def wait_for_events(deployment: Deployment, asset: str, cursor_key: str, count: int, timeout: float) -> list[int]:
    def enough() -> list[int] | None:
        deployment.check_running()
        offsets = fired_offsets(deployment, asset, cursor_key)
        return offsets if len(offsets) >= count else None

    return wait_until(f"{count} asset events of {cursor_key}", enough, timeout, interval=1)


def wait_for_cursor(client: LiftbridgeClient, cursor_key: str, stream: str, offset: int, timeout: float = 60) -> None:
    wait_until(
        f"cursor {cursor_key} at {offset}",
        lambda: client.fetch_cursor(cursor_key, stream, 0) == offset,
        timeout,
    )


#: What Airflow 3.3.2's supervisor logs when it kills a resumed deferred task (apache/airflow#72716).
RACE = "Server indicated the task shouldn't be running anymore"


def task_logs(
    deployment: Deployment, dag_id: str, run_id: str, task_id: str, attempt: int | None = None
) -> tuple[str, str]:
    """A task's worker logs and its triggers' logs (the triggerer writes them beside the task's),
    of one attempt or of all."""
    folder = deployment.log_dir / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    name = f"attempt={attempt}" if attempt else "attempt=*"
    worker = "".join(p.read_text(errors="replace") for p in sorted(folder.glob(f"{name}.log")))
    trigger = "".join(p.read_text(errors="replace") for p in sorted(folder.glob(f"{name}.log.trigger.*.log")))
    return worker, trigger


def deferred_through_triggerer(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> bool:
    """The task deferred (its worker said so) and its trigger ran and fired in the triggerer."""
    worker, trigger = task_logs(deployment, dag_id, run_id, task_id)
    return DEFERRING in worker and "Pausing task as DEFERRED" in worker and "Trigger fired event" in trigger


def finished_without_deferring(deployment: Deployment, dag_id: str, run_id: str, task_id: str, attempt: int) -> bool:
    """The sensor's one look before deferring found its target reached: no trip to the triggerer."""
    worker, _ = task_logs(deployment, dag_id, run_id, task_id, attempt)
    return NOT_DEFERRING in worker and "Pausing task as DEFERRED" not in worker


def check_sensor(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> None:
    """A successful deferrable sensor either finished on its first try (without deferring, or
    deferred through the triggerer), or was retried because Airflow killed its resumed first try
    (apache/airflow#72716) and the retry found its target reached. Any other failed try is a
    provider failure, and fails the test."""
    where = f"{dag_id}.{task_id} (logs: {deployment.log_dir})"
    tries = deployment.task_tries(dag_id, run_id)[task_id]
    if tries == 1:
        assert finished_without_deferring(deployment, dag_id, run_id, task_id, 1) or deferred_through_triggerer(
            deployment, dag_id, run_id, task_id
        ), where
        return
    first, _ = task_logs(deployment, dag_id, run_id, task_id, 1)
    assert tries == 2, f"{where}: {tries} tries"
    assert "Pausing task as DEFERRED" in first and RACE in first, f"{where}: try 1 failed, not by #72716"
    print(f"\n{where}: try 1 killed by apache/airflow#72716, retried")
    assert finished_without_deferring(deployment, dag_id, run_id, task_id, 2), f"{where}: the retry deferred again"


def restart_triggerer(deployment: Deployment, sig: int) -> None:
    deployment.stop_component("triggerer", sig)
    deployment.start_component("triggerer")


# -- the example DAGs ----------------------------------------------------------------------------


#: Run ids of the example DAG runs started by the first test (the Spark one is checked by the
#: last test, so its minute or two of Spark overlaps the tests in between).
RUNS: dict[str, str] = {}
SENSORS = {
    "liftbridge_stream_lifecycle": ["wait_for_offset", "find_ready_order"],
    "liftbridge_publish_files": ["wait_until_committed"],
    "liftbridge_spark_pipeline": ["wait_partition_0", "wait_partition_1"],
}


def check_example_run(deployment: Deployment, dag_id: str) -> None:
    run_id = RUNS[dag_id]
    state = deployment.wait_for_run(dag_id, run_id, timeout=500)
    tasks = deployment.task_states(dag_id, run_id)
    assert state == "success", f"{dag_id}: {tasks} (logs: {deployment.log_dir})"
    assert set(tasks.values()) == {"success"}, tasks
    for task_id in SENSORS[dag_id]:
        # Upstream tasks committed what the sensors wait for, so their check normally finds it
        # (a high watermark a moment behind the acks would send one through the triggerer: fine).
        check_sensor(deployment, dag_id, run_id, task_id)


@pytest.mark.timeout(600)
def test_example_dags_succeed_and_the_event_driven_one_fires_once(
    deployment: Deployment, client: LiftbridgeClient
) -> None:
    RUNS["liftbridge_spark_pipeline"] = deployment.trigger_dag("liftbridge_spark_pipeline")
    RUNS["liftbridge_stream_lifecycle"] = deployment.trigger_dag(
        "liftbridge_stream_lifecycle", {"stream": ORDERS_STREAM}
    )
    RUNS["liftbridge_publish_files"] = deployment.trigger_dag("liftbridge_publish_files")
    check_example_run(deployment, "liftbridge_stream_lifecycle")
    check_example_run(deployment, "liftbridge_publish_files")

    # The lifecycle run published four orders, one of them ready (offset 2), to the stream the
    # event-driven example watches, then deleted the stream: exactly one asset event...
    events = [e for e in deployment.asset_events(ORDERS_ASSET) if e["payload"]]
    assert [e["payload"]["message"]["offset"] for e in events] == [2]
    assert events[0]["payload"]["match"] == {"order": 3, "status": "ready"}

    # ...and one run of the event-driven DAG, which handled that order.
    def consumer_runs() -> list[dict[str, object]] | None:
        found = deployment.api("GET", "/dags/liftbridge_event_consumer/dagRuns")["dag_runs"]
        return found if found and all(r["state"] in ("success", "failed") for r in found) else None

    finished = wait_until("the event-driven DAG's run", consumer_runs, timeout=240, interval=1)
    assert [r["state"] for r in finished] == ["success"]
    run_id = finished[0]["dag_run_id"]
    xcom = deployment.api(
        "GET",
        f"/dags/liftbridge_event_consumer/dagRuns/{run_id}/taskInstances/handle_ready_orders/xcomEntries/return_value",
    )
    handled = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    assert handled == {"orders": [{"offset": 2, "order": {"order": 3, "status": "ready"}}]}
    time.sleep(3)  # a duplicate would show up here
    assert len([e for e in deployment.asset_events(ORDERS_ASSET) if e["payload"]]) == 1


# -- the event-driven DAG under a burst and triggerer restarts ----------------------------------


@pytest.mark.timeout(400)
def test_a_3000_message_burst_fires_once_per_matching_message(deployment: Deployment, client: LiftbridgeClient) -> None:
    """3,000 messages at once, every 10th one ready: 300 asset events, none twice. Before the
    watcher applied back-pressure, a burst over the fan-out queue's 1,024 failed the watcher and
    re-fired events already stored."""
    created = recreate(client, ORDERS_STREAM)
    key = f"{ORDERS_CURSOR}@{created}"
    client.publish_many(ORDERS_STREAM, [order(n, ready=n % 10 == 0) for n in range(3000)])
    offsets = wait_for_events(deployment, ORDERS_ASSET, key, 300, timeout=300)
    wait_for_cursor(client, key, ORDERS_STREAM, 2999)
    time.sleep(3)
    offsets = fired_offsets(deployment, ORDERS_ASSET, key)
    assert offsets == list(range(0, 3000, 10))
    assert "overflowed" not in deployment.log_text("triggerer")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_each_matching_message_fires_once_across_a_triggerer_restart(
    deployment: Deployment, client: LiftbridgeClient, sig: int
) -> None:
    """The triggerer is stopped once the watcher has caught up; messages published while it is
    down fire once after the restart (a killed triggerer's watcher moves on once its heartbeat
    is older than [triggerer] triggerer_health_check_threshold, 10 s here)."""
    created = client.fetch_metadata([ORDERS_STREAM]).streams[ORDERS_STREAM].creation_timestamp
    key = f"{ORDERS_CURSOR}@{created}"
    before = fired_offsets(deployment, ORDERS_ASSET, key)
    newest = client.fetch_partition_metadata(ORDERS_STREAM, 0).newest_offset
    wait_for_cursor(client, key, ORDERS_STREAM, newest)
    deployment.stop_component("triggerer", sig)
    client.publish_many(ORDERS_STREAM, [order(n, ready=n % 2 == 0) for n in range(20)])
    deployment.start_component("triggerer")
    expected = before + [newest + 1 + n for n in range(0, 20, 2)]
    wait_for_events(deployment, ORDERS_ASSET, key, len(expected), timeout=240)
    wait_for_cursor(client, key, ORDERS_STREAM, newest + 20)
    time.sleep(3)
    assert fired_offsets(deployment, ORDERS_ASSET, key) == expected


# -- a deferred sensor survives triggerer restarts ----------------------------------------------


@pytest.mark.timeout(400)
def test_a_deferred_sensor_survives_triggerer_restarts(deployment: Deployment, client: LiftbridgeClient) -> None:
    stream = "system-wait"
    recreate(client, stream)
    client.publish(stream, b"not yet")
    run_id = deployment.trigger_dag("system_wait_for_message", {"stream": stream})

    def sensor_state() -> str:
        return deployment.task_states("system_wait_for_message", run_id).get("wait_for_go", "")

    wait_until("the sensor to defer", lambda: sensor_state() == "deferred", timeout=180)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        restart_triggerer(deployment, sig)
        time.sleep(2)
        assert sensor_state() == "deferred"
    client.publish(stream, b"go")
    assert deployment.wait_for_run("system_wait_for_message", run_id, timeout=240) == "success"
    assert deferred_through_triggerer(deployment, "system_wait_for_message", run_id, "wait_for_go")
    check_sensor(deployment, "system_wait_for_message", run_id, "wait_for_go")


# -- the duplicate window of a triggerer stopped in the middle of a burst -----------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_stopping_the_triggerer_mid_burst_loses_nothing_and_repeats_at_most_the_window(
    deployment: Deployment, client: LiftbridgeClient, sig: int, record_property: pytest.RecordProperty
) -> None:
    """1,000 matching messages at once; the triggerer is stopped once 250 asset events are
    stored. After the restart every message has fired, and the ones that fired twice are at most
    the messages handed over but not confirmed (max_in_flight) plus the confirmed ones the cursor
    had not covered yet (fewer than commit_every, or the last commit_interval)."""
    burst = 1000
    created = recreate(client, BURST_STREAM)
    key = f"system-burst@{created}"
    client.publish_many(BURST_STREAM, [order(n, ready=True) for n in range(burst)])
    wait_for_events(deployment, BURST_ASSET, key, 250, timeout=300)
    stopped_at = len(fired_offsets(deployment, BURST_ASSET, key))
    cursor_at_stop = client.fetch_cursor(key, BURST_STREAM, 0)
    restart_triggerer(deployment, sig)
    wait_for_cursor(client, key, BURST_STREAM, burst - 1, timeout=400)
    time.sleep(3)
    offsets = fired_offsets(deployment, BURST_ASSET, key)
    counts = Counter(offsets)
    repeated = sorted(o for o, n in counts.items() if n > 1)
    assert sorted(counts) == list(range(burst)), "a message never fired"
    assert max(counts.values()) <= 2
    assert len(repeated) < DEFAULT_MAX_IN_FLIGHT + DEFAULT_COMMIT_EVERY
    summary = {
        "signal": signal.Signals(sig).name,
        "events_when_stopped": stopped_at,
        "cursor_when_stopped": cursor_at_stop,
        "fired_twice": len(repeated),
        "fired_twice_range": [repeated[0], repeated[-1]] if repeated else None,
    }
    record_property("duplicate_window", summary)
    print(f"\nMEASURED {json.dumps(summary)}")
    with (Path(deployment.log_dir) / "measurements.jsonl").open("a") as out:
        out.write(json.dumps(summary) + "\n")


@pytest.mark.timeout(600)
def test_spark_example_succeeds(deployment: Deployment) -> None:
    check_example_run(deployment, "liftbridge_spark_pipeline")
