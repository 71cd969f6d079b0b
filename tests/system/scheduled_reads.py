"""What the system tier's checks of interval reads under the real scheduler share
(tests/system/test_interval_backfill.py, tests/system/test_partitioned_backfill.py): a publisher
that keeps a stream busy, a backfill made through the CLI or the REST API, the runs of a DAG and
the tries and logs of its tasks, and the rows of archived Parquet files.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections import Counter
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import Deployment, DeploymentError, wait_until

#: What Airflow 3.3.2's supervisor logs when it kills a resumed deferred task (apache/airflow#72716).
RACE = "Server indicated the task shouldn't be running anymore"
DEFERRED = "Pausing task as DEFERRED"


def iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()


def ns_of(text: str) -> int:
    moment = dt.datetime.fromisoformat(text)
    return (int(moment.timestamp()) * 1_000_000 + moment.microsecond) * 1000


class Publisher(threading.Thread):
    """Publishes to every partition until stopped: one message per partition every 0.1 s, and a
    burst of 10 per partition within half a second of each edge (a multiple of ``step`` seconds
    of the stream's clock). Keeps every ack's (partition, offset) -> the leader's reception
    timestamp.

    :meth:`shift_to` moves the stream's clock (the dev server's reception clock) while it runs,
    so that a few seconds around each of some past edges take as long as they would have live."""

    def __init__(self, deployment: Deployment, stream: str, partitions: tuple[int, ...], step: int) -> None:
        super().__init__(daemon=True, name=f"{stream}-publisher")
        self.deployment, self.stream, self.partitions, self.step = deployment, stream, partitions, step
        self.stop = threading.Event()
        self.acked: dict[tuple[int, int], int] = {}
        self.error: BaseException | None = None
        self.bursts = 0
        self.shift = 0.0  # seconds the stream's clock is ahead of the real one

    def stream_time(self) -> float:
        return time.time() + self.shift

    def shift_to(self, at: dt.datetime | None) -> None:
        """Stamp the next messages as if the clock read ``at`` now (``None``: the real clock)."""
        self.deployment.devserver.set_reception_clock(self.stream, at)
        self.shift = 0.0 if at is None else at.timestamp() - time.time()

    def run(self) -> None:
        n = 0
        try:
            with LiftbridgeClient(self.deployment.devserver.address) as client:
                last_burst = -1
                while not self.stop.is_set():
                    now = self.stream_time()
                    edge = round(now / self.step) * self.step
                    count = 1
                    if abs(now - edge) < 0.5 and edge != last_burst:
                        count, last_burst = 10, edge
                        self.bursts += 1
                    for _ in range(count):
                        for partition in self.partitions:
                            ack = client.publish(self.stream, b'{"n": %d}' % n, partition=partition)
                            assert ack is not None
                            self.acked[(partition, ack.offset)] = ack.reception_timestamp
                            n += 1
                    self.stop.wait(0.1)  # pacing, not a wait for state
        except BaseException as exc:  # the test reports it
            self.error = exc

    def stored(self, client: LiftbridgeClient) -> dict[tuple[int, int], int]:
        """The stream as the leader stamped it, read back up to the last ack; the test asserts it
        equals the acks."""
        stamped: dict[tuple[int, int], int] = {}
        for partition in self.partitions:
            last = max(o for p, o in self.acked if p == partition)
            for m in client.subscribe(self.stream, partition=partition, start_at=0, stop_at=last):
                stamped[(partition, m.offset)] = m.timestamp
        return stamped


def publish_past_edges(publisher: Publisher, first: dt.datetime, edges: int, around: float) -> None:
    """Run the publisher on the stream's clock for ``around`` seconds on each side of ``edges``
    edges a ``publisher.step`` apart from ``first`` (a past edge), then on the real clock: past
    intervals as busy around their edges as live ones, in seconds rather than their length."""
    for k in range(edges):
        edge = first + dt.timedelta(seconds=k * publisher.step)
        publisher.shift_to(edge - dt.timedelta(seconds=around))
        if not publisher.is_alive() and publisher.error is None:
            publisher.start()  # after the first shift: a partition's timestamps never go back
        # A wait for the stream's clock, not for a state (it runs at the real clock's pace).
        time.sleep(max(0.0, edge.timestamp() + around - publisher.stream_time()))
    publisher.shift_to(None)


def set_variable(deployment: Deployment, key: str, value: str) -> None:
    try:
        deployment.api("POST", "/variables", {"key": key, "value": value})
    except DeploymentError:  # there from an earlier session on this deployment
        deployment.api("PATCH", f"/variables/{key}", {"key": key, "value": value})


def create_backfill(deployment: Deployment, dag_id: str, first: str, last: str) -> str:
    """A backfill of ``dag_id`` from ``first`` to ``last`` (ISO 8601), three runs at once, with
    ``airflow backfill create``; returns how it was made.

    On this deployment's SQLite the command mostly fails with "database is locked" (measured: 6 of
    6 tries in two sessions, at load 20-30): Airflow 3.3.2 creates each run in a SAVEPOINT that
    reads and then writes, and SQLite fails such a transaction at once, without waiting, when
    another process commits in between (the triggerer heartbeats every second here); Airflow's
    REST API answers it with 503 "Backfill creation is not supported on SQLite under concurrent
    access". The failed command removes its backfill, so the same request then goes to the REST
    API (``POST /backfills``: the same ``_create_backfill``, in the warm api-server, about a
    second a try) until one gets through.
    """

    def backfills() -> set[int]:
        return {b["id"] for b in deployment.api("GET", f"/backfills?dag_id={dag_id}")["backfills"]}

    before = backfills()  # an earlier test on this deployment (scripts/repeat.sh) made these

    def made() -> set[int]:
        return backfills() - before

    args = ["backfill", "create", "--dag-id", dag_id, "--from-date", first, "--to-date", last]
    try:
        deployment.run_cli([*args, "--max-active-runs", "3"])
        return "airflow backfill create"
    except DeploymentError:
        output = (deployment.log_dir / "cli.log").read_text(errors="replace").rsplit("$ airflow backfill", 1)[-1]
        if "database is locked" not in output:
            raise
    assert not made(), "the failed command left a backfill"
    body = {"dag_id": dag_id, "from_date": first, "to_date": last, "max_active_runs": 3}
    for attempt in range(1, 31):
        try:
            deployment.api("POST", "/backfills", body)
            return f"POST /backfills, attempt {attempt} (airflow backfill create: database is locked)"
        except DeploymentError as exc:
            if "HTTP 503" not in str(exc):
                raise
            if made():
                raise  # it was made after all, or half: not what the test expects
    raise AssertionError("POST /backfills: database is locked 30 times")


def dag_runs(deployment: Deployment, dag_id: str) -> list[dict[str, Any]]:
    body = deployment.api("GET", f"/dags/{dag_id}/dagRuns?limit=100&order_by=run_after")
    return list(body["dag_runs"])


def set_paused(deployment: Deployment, dag_id: str, paused: bool) -> None:
    deployment.api("PATCH", f"/dags/{dag_id}", {"is_paused": paused})


def finish_and_pause(deployment: Deployment, dag_id: str) -> list[dict[str, Any]]:
    """Wait for every run to finish, then pause the DAG; if a scheduled run came meanwhile,
    unpause and let it finish too. Returns the runs, finished."""
    while True:
        listed = dag_runs(deployment, dag_id)
        for run in listed:
            deployment.wait_for_run(dag_id, run["dag_run_id"], timeout=600)
        set_paused(deployment, dag_id, True)
        if [r["dag_run_id"] for r in dag_runs(deployment, dag_id)] == [r["dag_run_id"] for r in listed]:
            return dag_runs(deployment, dag_id)
        set_paused(deployment, dag_id, False)


def clear_run(deployment: Deployment, dag_id: str, run_id: str) -> None:
    """Clear every task of a finished run and wait until it has run again (each task's try 2)."""
    deployment.api(
        "POST",
        f"/dags/{dag_id}/clearTaskInstances",
        {"dag_run_id": run_id, "dry_run": False, "only_failed": False, "reset_dag_runs": True},
    )

    def cleared_again() -> bool:
        deployment.check_running()
        state = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"]
        return state in ("success", "failed") and min(deployment.task_tries(dag_id, run_id).values()) >= 2

    wait_until(f"the cleared run {run_id} to run again", cleared_again, timeout=600, interval=1)


def task_log(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> str:
    folder = deployment.log_dir / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("attempt=*.log")))


def tries(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> list[str]:
    """The states of every try of a task instance, in order."""
    body = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
    return [str(t["state"]) for t in sorted(body["task_instances"], key=lambda t: t["try_number"])]


def check_tries(
    deployment: Deployment, dag_id: str, run_id: str, task_id: str, runs_of_it: int, problems: list[str]
) -> int:
    """Note in ``problems`` a task instance that did not succeed at its first try of each of its
    ``runs_of_it`` runs; returns how often its task logs say it deferred."""
    states = tries(deployment, dag_id, run_id, task_id)
    log = task_log(deployment, dag_id, run_id, task_id)
    if states != ["success"] * runs_of_it:
        race = " (apache/airflow#72716 killed a resumed attempt)" if RACE in log else ""
        problems.append(f"{run_id} {task_id}: tries {states}, expected {runs_of_it} success(es){race}")
    return log.count(DEFERRED)


def xcom(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> Any:
    entry = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")
    return entry["value"] if not isinstance(entry["value"], str) else json.loads(entry["value"])


def archived_rows(paths: list[str]) -> Counter[tuple[int, int]]:
    """(partition, offset) of every row of these Parquet files; a file that is gone has none (the
    caller's comparison then names its rows as missing)."""
    import pyarrow.parquet as pq

    rows: Counter[tuple[int, int]] = Counter()
    for path in paths:
        if not os.path.exists(path):
            continue
        table = pq.read_table(path, columns=["partition", "offset"], partitioning=None).to_pydict()
        rows.update(zip(table["partition"], table["offset"], strict=True))
    return rows


def mismatch(what: str, got: Counter[tuple[int, int]], expected: Counter[tuple[int, int]]) -> str | None:
    """A problem line when ``got`` is not exactly ``expected`` (``None``: it is)."""
    if got == expected:
        return None
    return (
        f"{what}: {sum(got.values())} rows, {len(expected)} expected,"
        f" missing {len(expected - got)}, extra or twice {sum((got - expected).values())}"
    )
