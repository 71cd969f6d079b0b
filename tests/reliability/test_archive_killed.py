"""The archiver SIGKILLed mid-run, then retried through Airflow for the same DAG run: every message
ends up in the archive exactly once, and the file the killed try completed but did not commit is
overwritten under the same name, not doubled.

The DAG (tests/reliability/dags/reliability_archive.py) runs with ``dag.test()`` in a fresh
process (tests.reliability.run_dag). Its first try SIGKILLs that process once its second file is
renamed into place, before the position moves past it. The test process then runs the same DAG
run again (same logical date and run id): Airflow retries the task, which resumes the run's plan
from the committed position.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators.file_writers import file_name
from tests.airflow_support import xcom_of

from .run_dag import LOGICAL_DATE
from .scenarios import run_dag_subprocess

# A dag.test() process (Airflow starts again in it), then the retry in this one: hence slow.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.usefixtures("airflow_db")]
SIZES = {0: 2500, 1: 700}  # partition 0: files 0-999, 1000-1999, 2000-2499; partition 1: 0-699


def archived(directory: Path) -> Counter[tuple[int, int, int]]:
    """(partition, offset, order number) of every row of every Parquet file in ``directory``."""
    rows: Counter[tuple[int, int, int]] = Counter()
    for path in directory.glob("*.parquet"):
        table = pq.read_table(path, columns=["partition", "offset", "n"]).to_pydict()
        rows.update(zip(table["partition"], table["offset"], table["n"], strict=True))
    return rows


def test_archive_task_sigkilled_after_a_file_then_retried_holds_each_message_once(
    lb_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = f"archive-kill-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="reliability-archive-"))
    archive, marker, out = work / "archive", work / "first-try", work / "result.json"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream, stream, partitions=2)
        for partition, count in SIZES.items():
            values = [json.dumps({"n": partition * 10_000 + i}).encode() for i in range(count)]
            client.publish_many(stream, values, partition=partition)
        env = dict(os.environ) | {
            "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).parent / "dags"),
            "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": lb_address}),
            "EO_DAG_ID": f"liftbridge_reliability_archive.{stream}",
            "EO_STREAM": stream,
            "EO_ARCHIVE": f"file://{archive}",
            "EO_ROWS_PER_FILE": "1000",
            "EO_KILL_AFTER_FILE": "2",
            "EO_MARKER": str(marker),
            "EO_OUT": str(out),
        }
        killed = run_dag_subprocess(env)
        assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL, by the task itself
        second = archive / file_name(stream, 0, 1000, 1999, "parquet")
        assert sorted(os.listdir(archive)) == [file_name(stream, 0, 0, 999, "parquet"), second.name]
        assert client.fetch_cursor("archive", stream, 0) == 999  # the second file is not committed
        before = second.stat().st_mtime_ns

        for name, value in env.items():
            monkeypatch.setenv(name, value)  # the DAG file reads them when it is parsed here
        from airflow.dag_processing.dagbag import DagBag

        dag = DagBag(env["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag(env["EO_DAG_ID"])
        dag_run = dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)  # the same DAG run
        archive_xcom = xcom_of(dag_run, "archive")
        positions = [client.fetch_cursor("archive", stream, p) for p in SIZES]

    assert str(dag_run.state) == "success"
    assert archive_xcom["partitions"]["0"]["resumed"] is True  # the run's plan, from 1000
    expected_files = [(0, 0, 999), (0, 1000, 1999), (0, 2000, 2499), (1, 0, 699)]
    assert sorted(os.listdir(archive)) == sorted(file_name(stream, p, a, b, "parquet") for p, a, b in expected_files)
    assert second.stat().st_mtime_ns != before  # the retry rewrote it under the same name
    rows = archived(archive)
    assert max(rows.values()) == 1, "a message is in the archive twice"
    assert sorted(rows) == [(p, o, p * 10_000 + o) for p, count in SIZES.items() for o in range(count)]
    files = archive_xcom["files"]
    assert [(f["partition"], f["first_offset"], f["last_offset"]) for f in files] == expected_files
    assert positions == [2499, 699]
