"""An Airflow plugin of the system tier: every task process gets its own working directory and
temporary directory, removed when the task ends, as on workers that share no disk (Celery or
Kubernetes workers on several hosts, containers with an ephemeral ``/tmp``).

The listener runs in the task process just before the task executes: it creates
``$LIFTBRIDGE_PRIVATE_TASK_DIRS/<dag>.<task>.<random>``, points ``TMPDIR`` (and Python's
``tempfile``) and the working directory at it, and removes it when the task runner stops. A DAG
that hands a temporary file or a relative path from one task to another then fails here, as it
would on such workers. Without ``LIFTBRIDGE_PRIVATE_TASK_DIRS`` it does nothing.

Absolute paths outside the temporary directory (``/tmp/fixed-name``) are not hidden from other
tasks: the example DAGs have none (their docstrings say which storage they use).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

BASE_ENV = "LIFTBRIDGE_PRIVATE_TASK_DIRS"


class PrivateTaskDirs:
    """The listener: one scratch directory per task process."""

    def __init__(self) -> None:
        self.scratch: Path | None = None

    @hookimpl
    def on_task_instance_running(self, previous_state: Any, task_instance: Any) -> None:
        base = os.environ.get(BASE_ENV)
        if not base:
            return
        prefix = f"{task_instance.dag_id}.{task_instance.task_id}."
        self.scratch = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        os.environ["TMPDIR"] = str(self.scratch)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        os.chdir(self.scratch)

    @hookimpl
    def before_stopping(self, component: Any) -> None:
        if self.scratch is None:
            return
        os.chdir(self.scratch.parent)
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch = None


class PrivateTaskDirsPlugin(AirflowPlugin):
    name = "liftbridge_private_task_dirs"
    listeners = [PrivateTaskDirs()]
