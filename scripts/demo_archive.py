"""The demo's second DAG: ``liftbridge_stream_archive``, with its archive task SIGKILLed mid-run.

``scripts/demo.py`` runs it beside the stream-lifecycle DAG, in its own AIRFLOW_HOME (a copy of
the migrated database, so the two runs never wait on one SQLite file). ``dag.test()`` runs tasks
in its own process, so the simulated crash kills that process, as it would kill a worker; the
demo then runs the same DAG run again (same logical date and run id), which is what Airflow's
retry does under a scheduler: the archive task resumes the run's plan, rewrites the file the
killed try completed but never committed, and Spark checks each message is in the archive once.

``python scripts/demo_archive.py --dag-test DAG_ID`` is the child process: one ``dag.test()`` of
that DAG for the fixed logical date, with the DAGs folder on ``sys.path`` as Airflow puts it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

DAG_ID = "liftbridge_stream_archive"
RUN_DATE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
#: The exit status of a process killed by SIGKILL, as ``subprocess`` reports it.
KILLED = -9


class ArchiveDemo:
    """Runs the archive DAG (crash, then the retry) in a background thread.

    :param env: the environment of the Airflow processes (its own AIRFLOW_HOME).
    :param log: where their output goes.
    :param timeout: seconds allowed for each of the two processes.
    """

    def __init__(self, env: dict[str, str], log: Path, timeout: float) -> None:
        self.env = env
        self.log = log
        self.timeout = timeout
        self.exit_codes: list[int] = []
        self.seconds = 0.0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="archive-demo", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            for attempt in range(2):
                code = self._dag_test()
                self.exit_codes.append(code)
                if code == 0:
                    break
                if attempt == 0 and code != KILLED:
                    self.error = f"the first run of {DAG_ID} exited with {code}, not by the simulated SIGKILL"
                    break
            else:
                self.error = f"the retried run of {DAG_ID} exited with {self.exit_codes[-1]}"
        except subprocess.TimeoutExpired:
            self.error = f"{DAG_ID} did not finish within {self.timeout:.0f}s"
        self.seconds = time.monotonic() - started

    def _dag_test(self) -> int:
        with self.log.open("ab") as out:
            out.write(f"\n$ dag.test {DAG_ID} (logical date {RUN_DATE:%Y-%m-%d})\n".encode())
            out.flush()
            command = [sys.executable, str(Path(__file__).resolve()), "--dag-test", DAG_ID]
            return subprocess.run(
                command, env=self.env, stdout=out, stderr=subprocess.STDOUT, timeout=self.timeout, check=False
            ).returncode

    def report(self, states: dict[str, str], xcoms: dict[str, Any]) -> None:
        """Print what the run did: the crash and the retry, the files, what Spark found."""
        print(f"\nDAG {DAG_ID}, {len(self.exit_codes)} process(es) in {self.seconds:.0f}s")
        width = max(map(len, states), default=10)
        for task_id, task_state in states.items():
            print(f"  {task_id:<{width}}  {task_state}")
        if self.exit_codes[:1] == [KILLED]:
            print("\ncrash       archive_orders SIGKILLed its process after its 2nd file (simulated worker crash)")
            print("retry       the same DAG run again: the plan resumed, the uncommitted file rewritten")
        archive = xcoms.get("archive_orders") or {}
        for f in archive.get("files") or []:
            name = f["path"].rsplit("/", 1)[-1]
            print(f"archived    partition {f['partition']} offsets {f['first_offset']}-{f['last_offset']}: {name}")
        report = xcoms.get("spark_report") or {}
        if report:
            print(f"spark       {report['files']} file(s), {report['rows']} messages, each exactly once")


def _dag_test(dag_id: str) -> None:
    """The child process: one ``dag.test()`` of ``dag_id`` for :data:`RUN_DATE`."""
    sys.path.insert(0, os.environ["AIRFLOW__CORE__DAGS_FOLDER"])  # as Airflow does for DAG files
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    # run_after fixes the run id (it is built from it): the second process continues the same run.
    dag_run = bag.get_dag(dag_id).test(logical_date=RUN_DATE, run_after=RUN_DATE)
    if str(dag_run.state) != "success":
        raise SystemExit(f"{dag_id}: the run ended {dag_run.state}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dag-test", required=True, metavar="DAG_ID", help="run one dag.test() of DAG_ID")
    _dag_test(parser.parse_args().dag_test)
