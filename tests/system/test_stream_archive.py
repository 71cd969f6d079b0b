"""The stream-archive example under the real deployment (tests/system/conftest.py): its first
scheduled run (it is hourly, and unpaused at creation) SIGKILLs the archive task's process after
its second file; the scheduler retries the task, which resumes the run's plan, and Spark then reads
the archive back. Checked from outside: the run succeeded on the second try of the archive task,
the first try's log ends in the crash, and every archived message is there exactly once.

This file runs after test_deployment.py, so the run (started when the DAG was parsed) has had the
other tests' minutes to finish.
"""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from scripts.deployment import Deployment, wait_until

pytestmark = pytest.mark.system
DAG_ID = "liftbridge_stream_archive"


def xcom(deployment: Deployment, run_id: str, task_id: str) -> object:
    entry = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")
    return entry["value"] if not isinstance(entry["value"], str) else json.loads(entry["value"])


@pytest.mark.timeout(600)
def test_scheduled_archive_run_survives_a_sigkilled_task_and_archives_each_message_once(
    deployment: Deployment,
) -> None:
    def first_run() -> str | None:
        runs = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns?order_by=run_after")["dag_runs"]
        return str(runs[0]["dag_run_id"]) if runs else None

    run_id = wait_until(f"a scheduled run of {DAG_ID}", first_run, timeout=120, interval=1)
    state = deployment.wait_for_run(DAG_ID, run_id, timeout=540)
    tasks = deployment.task_states(DAG_ID, run_id)
    assert state == "success", f"{tasks} (logs: {deployment.log_dir})"
    assert set(tasks.values()) == {"success"}, tasks

    archive_ti = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/archive_orders")
    assert archive_ti["try_number"] == 2  # the SIGKILLed try, then Airflow's retry
    folder = deployment.log_dir / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=archive_orders"
    first, second = (folder / "attempt=1.log").read_text(), (folder / "attempt=2.log").read_text()
    assert "simulated crash: SIGKILL after writing" in first
    assert "this run's plan" in second  # the retry resumed the plan rather than planning afresh

    archived = xcom(deployment, run_id, "archive_orders")
    assert isinstance(archived, dict)
    files = archived["files"]
    assert len(files) >= 3
    seen: Counter[tuple[int, int]] = Counter()
    for f in files:
        table = pq.read_table(f["path"].removeprefix("file://"), columns=["partition", "offset"]).to_pydict()
        seen.update(zip(table["partition"], table["offset"], strict=True))
    assert max(seen.values()) == 1
    assert len(seen) == sum(f["last_offset"] - f["first_offset"] + 1 for f in files)
    report = xcom(deployment, run_id, "spark_report")
    assert isinstance(report, dict) and report["rows"] == len(seen) and report["files"] == len(files)
