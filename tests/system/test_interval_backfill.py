"""Interval reads as the real scheduler runs them, backfill included (issue 54): the DAG
``system_interval_backfill`` (tests/system/dags/system_interval_backfill.py) archives and
consumes each 20 s data interval of a 2-partition stream, ``deferrable=True``, while a publisher
thread keeps the stream busy (a few messages a second per partition, bursts at the interval
edges). Under the deployment of tests/system/conftest.py: ``airflow backfill create`` over three
past complete intervals with ``--max-active-runs 3`` (their archive runs write into one
``minute=`` folder at once), a clear of one backfill run through the REST API once it is done,
a manual run for the interval still open, and the scheduled runs the DAG gets while unpaused.

Judged against the timestamps the leader stored (the publisher's acks, and the stream read back):
every run handed over exactly its interval's messages, once (its consume output per try, the
archive files its XCom lists, and no message twice anywhere in the archive); no try failed (each
task instance ran once; the cleared run's twice, both successes); each task instance deferred,
and so was resumed, at most once (counted in its task logs) -- the last check, so that when it
fails every other check has passed.

No sleeps stand in for a wait: each step polls for the state it waits for (a run's state); the
one sleep is until the clock has passed three whole intervals, and the publisher's pauses only
pace it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import Deployment
from tests.system.dags.system_interval_backfill import DAG_ID, INTERVAL, consumed_file
from tests.system.scheduled_reads import (
    Publisher,
    archived_rows,
    check_tries,
    clear_run,
    create_backfill,
    dag_runs,
    finish_and_pause,
    iso,
    mismatch,
    ns_of,
    set_paused,
    set_variable,
    xcom,
)

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]

PARTITIONS = (0, 1)
STEP = int(INTERVAL.total_seconds())
#: The manual run's interval ends at least this many seconds after it is triggered.
OPEN_AHEAD = 45


def grid_floor(moment: float) -> int:
    """The start (epoch seconds) of the data interval holding ``moment``."""
    return int(moment) // STEP * STEP


@pytest.fixture(scope="module")
def client(deployment: Deployment) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(deployment.devserver.address) as lb:
        yield lb


def consumed_rows(path: Path) -> Counter[tuple[int, int]]:
    if not path.exists():
        return Counter()
    return Counter((r["p"], r["o"]) for r in map(json.loads, path.read_text().splitlines()))


def test_backfill_clear_and_an_open_interval_hand_over_each_interval_once(
    deployment: Deployment, client: LiftbridgeClient, tmp_path: Path
) -> None:
    deployment.wait_for_dags([DAG_ID])
    # The DAG is paused at creation and between tests; runs of an earlier test on this deployment
    # (scripts/repeat.sh) are finished and left out of what is judged.
    assert deployment.api("GET", f"/dags/{DAG_ID}")["is_paused"], "the DAG must be paused at creation"
    earlier = {r["dag_run_id"] for r in finish_and_pause(deployment, DAG_ID)}
    stream = f"system-backfill-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream, partitions=len(PARTITIONS))
    root = tmp_path / "out"
    root.mkdir()
    set_variable(deployment, "system_interval_backfill_stream", stream)
    set_variable(deployment, "system_interval_backfill_root", str(root))

    publisher = Publisher(deployment, stream, PARTITIONS, STEP)
    publisher.start()
    cleared = manual = made_by = ""
    try:
        # Three complete intervals, all after the publisher started.
        first = grid_floor(time.time() + 1) + STEP
        # A wait for the clock, not for a state: it has no deadline to run out (the margin report
        # would show it near 100 % of any deadline drawn around it).
        time.sleep(max(0.0, first + 3 * STEP + 1 - time.time()))
        made_by = create_backfill(deployment, DAG_ID, iso(first), iso(first + 2 * STEP))
        backfill = [
            r["dag_run_id"]
            for r in dag_runs(deployment, DAG_ID)
            if r["run_type"] == "backfill" and r["dag_run_id"] not in earlier
        ]
        assert len(backfill) == 3, dag_runs(deployment, DAG_ID)
        set_paused(deployment, DAG_ID, False)  # the backfill's runs start; scheduled runs come every 20 s

        cleared = backfill[1]
        assert deployment.wait_for_run(DAG_ID, cleared, timeout=600) == "success", deployment.log_dir
        clear_run(deployment, DAG_ID, cleared)
        for run_id in backfill:
            deployment.wait_for_run(DAG_ID, run_id, timeout=600)
        # A manual run for an interval that is still open when its tasks first look: it ends 45 to
        # 65 s from now. Triggered once the backfill is done, so its tasks do not queue behind the
        # backfill's for worker slots and the DAG's max_active_runs (busy run of this test: created
        # beside the backfill at load 14, its tasks started 112 s later, after its interval).
        start = grid_floor(time.time() + OPEN_AHEAD)
        manual = deployment.api(
            "POST",
            f"/dags/{DAG_ID}/dagRuns",
            {"logical_date": iso(start), "data_interval_start": iso(start), "data_interval_end": iso(start + STEP)},
        )["dag_run_id"]
        runs = [r for r in finish_and_pause(deployment, DAG_ID) if r["dag_run_id"] not in earlier]
    finally:
        set_paused(deployment, DAG_ID, True)  # no runs of this DAG during the rest of the tier
        publisher.stop.set()
        publisher.join(timeout=60)
    assert publisher.error is None, repr(publisher.error)

    # The stream as the leader stamped it: read back, and the same as the publisher's acks.
    stamped = publisher.stored(client)
    assert stamped == publisher.acked

    problems: list[str] = []
    deferrals: dict[str, int] = {}
    all_archived: Counter[tuple[int, int]] = Counter()
    by_type = Counter(r["run_type"] for r in runs)
    for run in runs:
        run_id = run["dag_run_id"]
        start_ns, end_ns = ns_of(run["data_interval_start"]), ns_of(run["data_interval_end"])
        assert end_ns <= max(stamped.values()), f"{run_id}: the publisher stopped before its interval ended"
        expected = Counter(k for k, ts in stamped.items() if start_ns <= ts < end_ns)
        if run["state"] != "success":
            problems.append(f"{run_id}: {run['state']} {deployment.task_states(DAG_ID, run_id)}")
            continue
        runs_of_it = 2 if run_id == cleared else 1
        for task_id in ("archive", "consume"):
            deferrals[f"{run_id} {task_id}"] = check_tries(deployment, DAG_ID, run_id, task_id, runs_of_it, problems)
        for try_number in range(1, runs_of_it + 1):
            got = consumed_rows(consumed_file(str(root), run_id, "consume", try_number))
            if problem := mismatch(f"{run_id} consume try {try_number} (handed over)", got, expected):
                problems.append(problem)
        files = archived_rows([f["path"] for f in xcom(deployment, DAG_ID, run_id, "archive")["files"]])
        if problem := mismatch(f"{run_id} archive (rows in its files)", files, expected):
            problems.append(problem)
        all_archived.update(files)
    twice = [k for k, n in archived_rows([str(p) for p in (root / "archive").rglob("*.parquet")]).items() if n > 1]
    if twice:
        problems.append(f"{len(twice)} message(s) twice in the archive, e.g. {twice[:3]}")
    stray = [str(p) for p in (root / "archive").rglob(".*")]
    if stray:
        problems.append(f"temporary files left: {stray[:3]}")

    print(
        f"\n{DAG_ID}: backfill by {made_by}; runs {dict(by_type)},"
        f" {len(stamped)} messages published ({publisher.bursts} bursts),"
        f" {sum(all_archived.values())} archived by the runs; deferrals per task instance: "
        f"{dict(Counter(deferrals.values()))} (number: task instances)"
    )
    assert by_type["backfill"] == 3 and manual in {r["dag_run_id"] for r in runs}, runs
    assert not problems, "\n".join(problems) + f"\n(logs: {deployment.log_dir})"
    # The manual run's tasks found its interval open and waited in the triggerer.
    early = {ti: n for ti, n in deferrals.items() if ti.startswith(manual + " ")}
    assert all(early.values()), (
        f"the open-interval run's tasks did not defer {early}: they started after its interval ended; the"
        f" deployment was too slow for OPEN_AHEAD (logs: {deployment.log_dir})"
    )
    # Last: each deferred task resumed at most once (needs LiftbridgeIntervalTrigger to fire once
    # per interval, not on every new message).
    resumed_more = {ti: n for ti, n in deferrals.items() if n > 1}
    assert not resumed_more, f"task instances deferred (and resumed) more than once: {resumed_more}"
