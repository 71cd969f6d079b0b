"""The interval archiver (read=DataInterval(...), a dt=/hour= layout) SIGKILLed mid-run, then retried
through Airflow for the same DAG run: every message of the interval is in the archive exactly
once, in its hour's folder; nothing of the hours around it is; the file the killed try completed
but did not commit is rewritten under the same name. The pattern of test_archive_killed.py, with
messages stamped in the past by the dev server's reception clock (devserver/clock.py)."""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import set_reception_clock
from airflow_provider_liftbridge.operators.file_writers import file_name
from tests.airflow_support import xcom_of

from .run_dag import LOGICAL_DATE
from .scenarios import run_dag_subprocess

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.usefixtures("airflow_db")]
T10 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
#: Messages per partition received at 09:30 (before), 10:30 (the interval) and 11:30 (after).
BEFORE, INSIDE, AFTER = 100, {0: 2500, 1: 700}, 50
FOLDER = "dt=2026-03-02/hour=10"


def archived(directory: Path) -> Counter[tuple[str, int, int, int]]:
    """(folder, partition, offset, n) of every row of every Parquet file under ``directory``."""
    rows: Counter[tuple[str, int, int, int]] = Counter()
    for path in directory.rglob("*.parquet"):
        table = pq.read_table(path, columns=["partition", "offset", "n"]).to_pydict()
        folder = str(path.parent.relative_to(directory))
        rows.update((folder, p, o, n) for p, o, n in zip(table["partition"], table["offset"], table["n"], strict=True))
    return rows


def test_interval_archive_sigkilled_after_a_file_then_retried_holds_each_message_once(
    lb_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = f"archive-kill-interval-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="reliability-archive-interval-"))
    archive, marker, out = work / "archive", work / "first-try", work / "result.json"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream, stream, partitions=2)
        try:
            for when, counts in (
                (T10 - dt.timedelta(minutes=30), {0: BEFORE, 1: BEFORE}),
                (T10 + dt.timedelta(minutes=30), INSIDE),
                (T10 + dt.timedelta(minutes=90), {0: AFTER, 1: AFTER}),
            ):
                set_reception_clock(stream, when)
                for partition, count in counts.items():
                    values = [json.dumps({"n": partition * 10_000 + i}).encode() for i in range(count)]
                    client.publish_many(stream, values, partition=partition)
        finally:
            set_reception_clock(stream, None)
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
            "EO_READ_BY": "interval",
            "EO_START": T10.isoformat(),
            "EO_END": (T10 + dt.timedelta(hours=1)).isoformat(),
            "EO_LAYOUT": "dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}",
        }
        killed = run_dag_subprocess(env)
        assert killed.returncode == -9, killed.stderr[-2000:]  # SIGKILL, by the task itself
        folder = archive / FOLDER
        first = file_name(stream, 0, BEFORE, BEFORE + 999, "parquet")
        second = folder / file_name(stream, 0, BEFORE + 1000, BEFORE + 1999, "parquet")
        assert sorted(os.listdir(folder)) == [first, second.name]
        before = second.stat().st_mtime_ns

        for name, value in env.items():
            monkeypatch.setenv(name, value)  # the DAG file reads them when it is parsed here
        from airflow.dag_processing.dagbag import DagBag

        dag = DagBag(env["AIRFLOW__CORE__DAGS_FOLDER"]).get_dag(env["EO_DAG_ID"])
        dag_run = dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)  # the same DAG run
        archive_xcom = xcom_of(dag_run, "archive")

    assert str(dag_run.state) == "success"
    assert archive_xcom["partitions"]["0"]["resumed"] is True
    assert second.stat().st_mtime_ns != before  # the retry rewrote it under the same name
    rows = archived(archive)
    assert max(rows.values()) == 1, "a message is in the archive twice"
    expected = sorted((FOLDER, p, BEFORE + i, p * 10_000 + i) for p, count in INSIDE.items() for i in range(count))
    assert sorted(rows) == expected  # the interval's messages, each once, and nothing of 09:30 or 11:30
    assert [name for name in os.listdir(archive)] == ["dt=2026-03-02"]
    assert not [p for p in archive.rglob(".*")]  # no temporary file left
