"""Partitioned runs as the real scheduler runs them (issue 54), the counterpart of
tests/system/test_interval_backfill.py: the pair ``system_partition_minutes`` (a
``CronPartitionTimetable`` of one-minute partitions archiving a 2-partition stream,
``deferrable=True``) and ``system_partition_rollup`` (``PartitionedAssetTimetable``, an hour's
minutes rolled up with Spark) of tests/system/dags/system_partitioned_minutes.py, under the
deployment of tests/system/conftest.py.

A publisher thread keeps the stream busy (a few messages a second per partition, bursts at the
partition edges). It first runs with the dev server's reception clock moved to a few seconds
around each edge of three minutes of an hour long past (a random one per test: an hour no other
test of the session touches), then with the real clock. The three past minutes are backfilled
with three runs at once (the REST API where ``airflow backfill create`` hits SQLite's "database
is locked"); once they are archived the hour's roll-up starts (three minutes are in) and runs
once; then one of the three is cleared and runs again (the same files, each message once, and no
second roll-up); meanwhile the scheduler makes a run a minute for the minute just begun: a
partition still open when its run starts, which defers and resumes once.

Judged against the timestamps the leader stored (the publisher's acks, and the stream read back):
every run archived exactly its minute's messages (the files its XCom lists), every message of a
run's minute is in that minute's folder and nowhere else, once; the roll-up read exactly the three
minute folders, each message once; no try failed (the cleared run's tasks ran twice, both
successes); every task instance deferred, and so was resumed, at most once (counted in its task
logs), and those whose partition was open deferred exactly once -- the last checks, so that when
they fail every other check has passed.

No sleeps stand in for a wait: each step polls for the state it waits for; the sleeps are until
the stream's clock has passed an edge, and the publisher's pauses only pace it.
"""

from __future__ import annotations

import datetime as dt
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import Deployment, wait_until
from tests.system.dags.system_partitioned_minutes import MINUTES_DAG, ROLLUP_DAG
from tests.system.scheduled_reads import (
    Publisher,
    archived_rows,
    check_tries,
    clear_run,
    create_backfill,
    finish_and_pause,
    iso,
    mismatch,
    publish_past_edges,
    set_paused,
    set_variable,
    xcom,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

PARTITIONS = (0, 1)
MINUTE = dt.timedelta(minutes=1)
#: Seconds of the stream's clock published on each side of a past partition edge.
AROUND_EDGE = 3
KEY = "%Y-%m-%dT%H:%M:%S"
#: The manual run's partition ends at least this many seconds after it is triggered.
OPEN_AHEAD = 75


@pytest.fixture(scope="module")
def client(deployment: Deployment) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(deployment.devserver.address) as lb:
        yield lb


def partitions_of(deployment: Deployment, dag_id: str) -> dict[str, tuple[str, str]]:
    """Run id -> (partition key, run type) of every run of a DAG."""
    with deployment.db() as db:
        rows = db.execute("SELECT run_id, partition_key, run_type FROM dag_run WHERE dag_id = ?", (dag_id,)).fetchall()
    return {str(r[0]): (str(r[1]), str(r[2])) for r in rows}


def past_minutes() -> dt.datetime:
    """The first of three minutes of an hour long past, one per test (so no roll-up of an earlier
    test's hour is pending)."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    pick = random.Random()
    return (now - dt.timedelta(days=pick.randint(3, 700))).replace(hour=pick.randrange(24), minute=pick.randint(0, 56))


def folder_of(minute: dt.datetime) -> str:
    return f"dt={minute:%Y-%m-%d}/hour={minute:%H}/minute={minute:%M}"


def test_backfill_clear_open_partition_and_rollup_hand_over_each_partition_once(
    deployment: Deployment, client: LiftbridgeClient, tmp_path: Path
) -> None:
    deployment.wait_for_dags([MINUTES_DAG, ROLLUP_DAG])
    for dag_id in (MINUTES_DAG, ROLLUP_DAG):
        # Paused at creation and between tests; runs of an earlier test on this deployment
        # (scripts/repeat.sh) are finished and left out of what is judged.
        assert deployment.api("GET", f"/dags/{dag_id}")["is_paused"], f"{dag_id} must be paused at creation"
    earlier = {r["dag_run_id"] for r in finish_and_pause(deployment, MINUTES_DAG)}
    earlier_rollups = {r["dag_run_id"] for r in finish_and_pause(deployment, ROLLUP_DAG)}
    stream = f"system-partitions-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream, partitions=len(PARTITIONS))
    root = tmp_path / "out"
    root.mkdir()
    set_variable(deployment, "system_partition_stream", stream)
    set_variable(deployment, "system_partition_root", str(root))
    first = past_minutes()
    keys = [(first + k * MINUTE).strftime(KEY) for k in range(3)]
    hour_key = f"{first:%Y-%m-%dT%H}"

    publisher = Publisher(deployment, stream, PARTITIONS, step=60)
    cleared = made_by = manual = ""
    before_clear: Counter[tuple[int, int]] = Counter()
    files_before: list[str] = []
    rollup: dict[str, Any] = {}
    began = time.time()
    try:
        publish_past_edges(publisher, first, edges=4, around=AROUND_EDGE)
        set_paused(deployment, ROLLUP_DAG, False)  # events of a paused consumer are not queued for it
        made_by = create_backfill(deployment, MINUTES_DAG, first.isoformat(), (first + 2 * MINUTE).isoformat())
        backfill = sorted(
            (run_id for run_id, (_, kind) in partitions_of(deployment, MINUTES_DAG).items() if run_id not in earlier),
            key=lambda run_id: partitions_of(deployment, MINUTES_DAG)[run_id][0],
        )
        assert [partitions_of(deployment, MINUTES_DAG)[r] for r in backfill] == [(k, "backfill") for k in keys]
        set_paused(deployment, MINUTES_DAG, False)  # the backfill starts; the scheduler adds a run a minute
        for run_id in backfill:
            assert deployment.wait_for_run(MINUTES_DAG, run_id, timeout=600) == "success", deployment.log_dir

        def rolled_up() -> str | None:
            deployment.check_running()
            mine = [r for r, (key, _) in partitions_of(deployment, ROLLUP_DAG).items() if key == hour_key]
            return mine[0] if mine else None

        rollup_run = wait_until(f"the roll-up of {hour_key}", rolled_up, timeout=600, interval=2)
        assert deployment.wait_for_run(ROLLUP_DAG, rollup_run, timeout=600) == "success", deployment.log_dir
        rollup = xcom(deployment, ROLLUP_DAG, rollup_run, "roll_up_hour")

        # Cleared once the roll-up has read its files (a roll-up reading while a cleared run replaces
        # them would race it).
        cleared = backfill[1]
        files_before = sorted(f["path"] for f in xcom(deployment, MINUTES_DAG, cleared, "archive")["files"])
        before_clear = archived_rows(files_before)
        clear_run(deployment, MINUTES_DAG, cleared)

        # A manual run for a partition that is still open when its archive first looks: the minute
        # ends 75 to 135 s from now (a task of its interval twin first looked 54 s after its run was
        # made, at load 9-12: test_interval_backfill). Triggered once the roll-up and the clear are done, so it does
        # not queue behind the backfill's tasks and the roll-up's Spark job for worker slots (its
        # interval twin in test_interval_backfill, triggered before the clear, started after its
        # interval at load 10-17).
        open_minute = (time.time() + OPEN_AHEAD) // 60 * 60
        manual = deployment.api(
            "POST",
            f"/dags/{MINUTES_DAG}/dagRuns",
            {"logical_date": None, "partition_key": iso(open_minute)[:19]},
        )["dag_run_id"]
        runs = [r for r in finish_and_pause(deployment, MINUTES_DAG) if r["dag_run_id"] not in earlier]
        rollups = [r for r in finish_and_pause(deployment, ROLLUP_DAG) if r["dag_run_id"] not in earlier_rollups]
    finally:
        set_paused(deployment, MINUTES_DAG, True)  # no runs of these DAGs during the rest of the tier
        set_paused(deployment, ROLLUP_DAG, True)
        publisher.stop.set()
        publisher.join(timeout=60)
    assert publisher.error is None, repr(publisher.error)

    # The stream as the leader stamped it, read back: every acked message; and on the real clock the
    # acks' reception timestamps. (The dev server's acks do not carry the reception clock's shift.)
    stamped = publisher.stored(client)
    assert stamped.keys() == publisher.acked.keys()
    live = {k: ts for k, ts in stamped.items() if ts >= began * 10**9}
    assert live == {k: publisher.acked[k] for k in live}

    partition_keys = partitions_of(deployment, MINUTES_DAG)
    problems: list[str] = []
    deferrals: dict[str, int] = {}
    expected_folders: dict[str, Counter[tuple[int, int]]] = {}
    by_type = Counter(r["run_type"] for r in runs)
    for run in runs:
        run_id = run["dag_run_id"]
        key, kind = partition_keys[run_id]
        if kind == "scheduled":  # not the test's: both tasks skip (see the DAG)
            states = deployment.task_states(MINUTES_DAG, run_id)
            if run["state"] != "success" or set(states.values()) != {"skipped"}:
                problems.append(f"{run_id}: {run['state']} {states}, expected success with every task skipped")
            continue
        start = dt.datetime.strptime(key, KEY).replace(tzinfo=dt.UTC)
        start_ns, end_ns = int(start.timestamp()) * 10**9, int((start + MINUTE).timestamp()) * 10**9
        assert end_ns <= max(stamped.values()), f"{run_id}: the publisher stopped before its partition ended"
        expected = Counter(k for k, ts in stamped.items() if start_ns <= ts < end_ns)
        assert folder_of(start) not in expected_folders, f"two runs of the partition {key}"
        expected_folders[folder_of(start)] = expected
        if run["state"] != "success":
            problems.append(f"{run_id}: {run['state']} {deployment.task_states(MINUTES_DAG, run_id)}")
            continue
        runs_of_it = 2 if run_id == cleared else 1
        deferrals[run_id] = check_tries(deployment, MINUTES_DAG, run_id, "archive", runs_of_it, problems)
        announced = deployment.task_states(MINUTES_DAG, run_id)["announce"]
        if announced != ("success" if kind == "backfill" else "skipped"):
            problems.append(f"{run_id} announce: {announced}")
        elif kind == "backfill":
            check_tries(deployment, MINUTES_DAG, run_id, "announce", runs_of_it, problems)
        files = sorted(f["path"] for f in xcom(deployment, MINUTES_DAG, run_id, "archive")["files"])
        if gone := [f for f in files if not Path(f).exists()]:
            problems.append(f"{run_id} archive: {len(gone)} of the files it wrote are gone, e.g. {gone[0]}")
        if problem := mismatch(f"{run_id} archive", archived_rows(files), expected):
            problems.append(problem)
        if run_id == cleared and (files, archived_rows(files)) != (files_before, before_clear):
            problems.append(f"{run_id}: the cleared run's files differ from its first run's: {files_before} -> {files}")
    # Every message of a run's minute in that minute's folder, once; no other folder.
    archive = root / "archive"
    folders = {str(p.parent.relative_to(archive)) for p in archive.rglob("*.parquet")}
    if folders != set(expected_folders):
        problems.append(f"folders {sorted(folders ^ set(expected_folders))}: without a run, or a run's missing")
    for folder in sorted(folders & set(expected_folders)):
        got = archived_rows([str(p) for p in (archive / folder).glob("*.parquet")])
        if problem := mismatch(f"folder {folder}", got, expected_folders[folder]):
            problems.append(problem)
    stray = [str(p) for p in archive.rglob(".*")]
    if stray:
        problems.append(f"temporary files left: {stray[:3]}")

    # The hour's roll-up: once, reading exactly the three backfilled minutes' folders.
    mine = [r for r in rollups if partitions_of(deployment, ROLLUP_DAG)[r["dag_run_id"]][0] == hour_key]
    if [r["state"] for r in mine] != ["success"]:
        problems.append(
            f"roll-ups of {hour_key}: {[(r['dag_run_id'], r['state']) for r in mine]}, expected one success"
        )
    else:
        check_tries(deployment, ROLLUP_DAG, mine[0]["dag_run_id"], "roll_up_hour", 1, problems)
    read = {folder: Counter(map(tuple, rows)) for folder, rows in rollup.get("folders", {}).items()}
    wanted = {
        folder_of(dt.datetime.strptime(k, KEY)): expected_folders.get(folder_of(dt.datetime.strptime(k, KEY)))
        for k in keys
    }
    if read != wanted:
        problems.append(
            f"the roll-up of {hour_key} read {sorted(read)} ({ {f: sum(c.values()) for f, c in read.items()} } rows),"
            f" expected {sorted(wanted)} ({ {f: len(c or ()) for f, c in wanted.items()} })"
        )

    print(
        f"\n{MINUTES_DAG}: backfill by {made_by}; runs {dict(by_type)}, {len(stamped)} messages published"
        f" ({publisher.bursts} bursts), {sum(sum(c.values()) for c in expected_folders.values())} in the runs'"
        f" minutes; roll-ups {len(rollups)}; deferrals per task instance: {dict(Counter(deferrals.values()))}"
        f" (number: task instances)"
    )
    assert by_type["backfill"] == 3 and manual in {r["dag_run_id"] for r in runs}, runs
    assert not problems, "\n".join(problems) + f"\n(logs: {deployment.log_dir})"
    # The open partition's archive found it open and waited in the triggerer.
    assert deferrals[manual], (
        f"the open partition's archive did not defer: it started after its partition ended; the deployment was"
        f" too slow for OPEN_AHEAD (logs: {deployment.log_dir})"
    )
    # Last: each deferred task resumed at most once (needs LiftbridgeIntervalTrigger to fire once
    # per partition, not on every new message).
    resumed_more = {run_id: n for run_id, n in deferrals.items() if n > 1}
    assert not resumed_more, f"task instances deferred (and resumed) more than once: {resumed_more}"
