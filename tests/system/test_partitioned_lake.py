"""The partitioned pair of example DAGs (dags_examples/liftbridge_partitioned_lake.py) under the
real deployment (tests/system/conftest.py): a backfill of three past hours of
``liftbridge_hourly_partitions`` runs the archive once per partition key, each hour's asset
event carries its key, and then ``liftbridge_daily_rollup`` runs once for the day, reading
exactly those hours' folders with Spark.

The messages are stamped in those hours by the dev server's reception clock (``clock`` on its
control channel: the deployment's dev server is a process of its own), with messages in the
hours before and after them that no archive may take. The deployment sets
``LIFTBRIDGE_ROLLUP_MIN_HOURS=3`` so the roll-up starts after three hours rather than the day's 24
(the example's default, ``WaitForAll``). Judged against the stored timestamps; each step polls
for what it waits for.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, StartPosition, StopPosition, StreamExistsError
from scripts.deployment import Deployment, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]  # the Spark job runs in the deployment's task

HOURLY = "liftbridge_hourly_partitions"
DAILY = "liftbridge_daily_rollup"
STREAM = "page-views"
#: Minutes of each hour at which views arrive (partition 1 skips :20, so the partitions differ).
MINUTES = (0, 20, 40, 59)


@pytest.fixture(scope="module")
def client(deployment: Deployment) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(deployment.devserver.address) as lb:
        yield lb


def publish_hours(deployment: Deployment, client: LiftbridgeClient, first: dt.datetime) -> None:
    """Views in the hour before ``first``, in ``first`` and the two hours after it, and in the hour
    after those, stamped there by the dev server's reception clock; then one with the real clock."""
    try:
        client.create_stream(STREAM, STREAM, partitions=2)
    except StreamExistsError:  # made by the example's own run of the current hour (create_stream)
        pass
    try:
        for hour in range(-1, 4):
            for minute in MINUTES:
                deployment.devserver.set_reception_clock(STREAM, first + dt.timedelta(hours=hour, minutes=minute))
                for partition in (0, 1):
                    if partition == 1 and minute == 20:
                        continue
                    view = {"page": f"/p{minute % 3}", "minute": minute}  # no "hour": the folders' column
                    client.publish(STREAM, json.dumps(view).encode(), partition=partition)
    finally:
        deployment.devserver.set_reception_clock(STREAM, None)
    for partition in (0, 1):
        client.publish(STREAM, b'{"page": "/today"}', partition=partition)


def stored(client: LiftbridgeClient) -> dict[tuple[int, int], int]:
    """(partition, offset) -> the stored timestamp (ns) of every message of the stream."""
    found = {}
    for partition in (0, 1):
        for m in client.subscribe(
            STREAM, partition=partition, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST
        ):
            found[(partition, m.offset)] = m.timestamp
    return found


def runs(deployment: Deployment, dag_id: str) -> list[tuple[str, str | None, str]]:
    """(run id, partition key, state) of every run of a DAG."""
    with deployment.db() as db:
        rows = db.execute("SELECT run_id, partition_key, state FROM dag_run WHERE dag_id = ?", (dag_id,)).fetchall()
    return [(str(r[0]), r[1], str(r[2])) for r in rows]


def xcom(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> Any:
    entry = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")
    return entry["value"] if not isinstance(entry["value"], str) else json.loads(entry["value"])


def archived(root: Path) -> dict[str, set[tuple[int, int]]]:
    """Folder (relative to the archive) -> the (partition, offset) of its rows."""
    import pyarrow.parquet as pq

    found: dict[str, set[tuple[int, int]]] = {}
    for path in root.rglob("*.parquet"):
        table = pq.read_table(path, columns=["partition", "offset"], partitioning=None)
        rows = zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
        found.setdefault(str(path.parent.relative_to(root)), set()).update(rows)
    return found


def test_three_hourly_partitions_then_the_daily_rollup_once_reading_exactly_those_hours(
    deployment: Deployment, client: LiftbridgeClient
) -> None:
    deployment.wait_for_dags([HOURLY, DAILY])
    # Three whole hours of a day two days back: past, complete, and never the scheduler's own runs.
    day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=2)).replace(hour=9, minute=0, second=0, microsecond=0)
    publish_hours(deployment, client, day)
    stamps = stored(client)
    keys = [(day + dt.timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M:%S") for h in range(3)]

    deployment.run_cli(
        [
            "backfill", "create", "--dag-id", HOURLY,
            "--from-date", day.isoformat(), "--to-date", (day + dt.timedelta(hours=2)).isoformat(),
        ]
    )  # fmt: skip

    def hourly_done() -> list[tuple[str, str | None, str]] | None:
        deployment.check_running()
        found = [r for r in runs(deployment, HOURLY) if r[1] in keys]
        return found if len(found) == 3 and all(r[2] in ("success", "failed") for r in found) else None

    hourly = wait_until("the three hourly partitions' runs", hourly_done, timeout=600, interval=2)
    assert sorted(r[1] for r in hourly) == keys
    assert {r[2] for r in hourly} == {"success"}, f"{hourly} (logs: {deployment.log_dir})"

    # Each hour's folder holds exactly the messages stamped in that hour, nothing of the hours around.
    root = deployment.home / "liftbridge-lake" / STREAM
    # (the day's folders only: the example's own run of the current hour may have archived it)
    folders = {k: v for k, v in archived(root).items() if k.startswith(f"dt={day:%Y-%m-%d}/")}
    expected = {}
    for h in range(3):
        start = day + dt.timedelta(hours=h)
        low, high = int(start.timestamp() * 1e9), int((start + dt.timedelta(hours=1)).timestamp() * 1e9)
        expected[f"dt={start:%Y-%m-%d}/hour={start:%H}"] = {k for k, ts in stamps.items() if low <= ts < high}
    assert folders == expected
    assert all(len(v) == 2 * len(MINUTES) - 1 for v in expected.values())
    for run_id, key, _ in hourly:
        summary = xcom(deployment, HOURLY, run_id, "archive_hour")
        assert summary["interval"]["start"].startswith(str(key)), summary["interval"]

    # Each archive's asset event carries its partition key.
    with deployment.db() as db:
        events = db.execute(
            "SELECT e.partition_key, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.name = ?",
            ("liftbridge_page_views_hourly",),
        ).fetchall()
    assert sorted(e[0] for e in events if e[0] in keys) == keys

    def daily_done() -> list[tuple[str, str | None, str]] | None:
        deployment.check_running()
        found = runs(deployment, DAILY)
        return found if found and all(r[2] in ("success", "failed") for r in found) else None

    daily = wait_until("the day's roll-up", daily_done, timeout=600, interval=2)
    assert [(r[1], r[2]) for r in daily] == [(f"{day:%Y-%m-%d}", "success")], f"{daily} (logs: {deployment.log_dir})"
    result = xcom(deployment, DAILY, daily[0][0], "roll_up_day")
    assert result["folders"] == sorted(expected)
    assert result["views_per_hour"] == {f"{(day + dt.timedelta(hours=h)):%H}": 2 * len(MINUTES) - 1 for h in range(3)}
    assert (deployment.home / "liftbridge-lake" / f"{STREAM}-daily" / f"dt={day:%Y-%m-%d}").is_dir()
