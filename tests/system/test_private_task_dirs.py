"""The system tier runs every task in a working and temporary directory of its own, removed when
the task ends (``plugins/private_task_dirs.py``), so the example DAGs (run by test_deployment.py in
this deployment) cannot rely on a disk their tasks share without failing. This test checks the
isolation itself, with ``dags/system_private_task_dirs.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.deployment import Deployment

pytestmark = pytest.mark.system


def xcom(deployment: Deployment, dag_id: str, run_id: str, task_id: str) -> dict[str, object]:
    entry = deployment.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value")
    value = entry["value"]
    return value if isinstance(value, dict) else json.loads(value)


@pytest.mark.timeout(300)
def test_each_task_runs_in_a_directory_of_its_own(deployment: Deployment, private_task_dirs: Path) -> None:
    dag_id = "system_private_task_dirs"
    run_id = deployment.trigger_dag(dag_id)
    assert deployment.wait_for_run(dag_id, run_id, timeout=240) == "success", deployment.task_states(dag_id, run_id)
    first = xcom(deployment, dag_id, run_id, "leave_files")
    second = xcom(deployment, dag_id, run_id, "look_for_them")
    for where in (first, second):
        assert where["cwd"] == where["tmp"]
        assert Path(str(where["cwd"])).parent == private_task_dirs
    assert first["cwd"] != second["cwd"]
    assert second["sees_temp_file"] is False and second["sees_relative_file"] is False
    assert not Path(str(first["cwd"])).exists()  # removed when the first task ended
