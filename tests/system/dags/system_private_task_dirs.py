"""A DAG of the system tier that shows what the ``private_task_dirs`` plugin does to tasks: the
first task leaves a file in its temporary directory and one in its working directory, the second
one (another task process) reports where it runs and whether it sees them. The test expects two
different directories and neither file: a DAG that relied on them would fail, as on workers that
share no disk."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime
from typing import Any

from airflow.sdk import dag, task


@dag(dag_id="system_private_task_dirs", schedule=None, start_date=datetime(2024, 1, 1), catchup=False)
def system_private_task_dirs() -> None:
    @task
    def leave_files() -> dict[str, Any]:
        """Write a temporary file and a file in the working directory; return where they are."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
            handle.write("left by leave_files")
        with open("relative.txt", "w") as relative:
            relative.write("left by leave_files")
        return {"cwd": os.getcwd(), "tmp": tempfile.gettempdir(), "file": handle.name}

    @task
    def look_for_them(left: dict[str, Any]) -> dict[str, Any]:
        """Where this task runs, and whether it sees what the first task left."""
        return {
            "cwd": os.getcwd(),
            "tmp": tempfile.gettempdir(),
            "sees_temp_file": os.path.exists(left["file"]),
            "sees_relative_file": os.path.exists("relative.txt"),
        }

    look_for_them(leave_files())


system_private_task_dirs()
