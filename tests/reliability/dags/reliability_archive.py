"""The DAG of the archive-kill scenario: one LiftbridgeStreamToFileOperator (retried once) whose
first try SIGKILLs its own process after a file is complete (``EO_*`` environment variables,
tests/reliability/test_archive_killed.py). ``EO_READ_BY=interval`` with ``EO_START``/``EO_END``
and ``EO_LAYOUT`` make it an interval read into a folder layout.

The DAG id names the stream (``liftbridge_reliability_archive.<EO_STREAM>``): the stream is part of
the serialized DAG, so each test's DAG is a version of its own, and under one id a worker's
metadata database would hold several versions of one DAG. Airflow's ``DagRun.serialized_dag``
joins on the DAG id alone (``uselist=False``), and ``dag.test()`` deleting the killed try's run
then warned ``SAWarning: Multiple rows returned with uselist=False`` (docs/testing.md)."""

from __future__ import annotations

import datetime as dt
import os

from airflow.sdk import DAG

from airflow_provider_liftbridge.operators import DataInterval, Parquet, SinceLastRun
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

STREAM = os.environ.get("EO_STREAM", "reliability")

with DAG(
    f"liftbridge_reliability_archive.{STREAM}",
    schedule=None,
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
):
    LiftbridgeStreamToFileOperator(
        task_id="archive",
        stream=STREAM,
        read=(
            DataInterval(
                start_time=os.environ.get("EO_START") or None,
                end_time=os.environ.get("EO_END") or None,
                cursor_id="archive",
            )
            if os.environ.get("EO_READ_BY", "position") == "interval"
            else SinceLastRun("archive")
        ),
        path=os.environ.get("EO_ARCHIVE", "/tmp/reliability-archive"),
        format=Parquet(row_group_rows=250),
        value_format="json",
        batch_size=int(os.environ.get("EO_ROWS_PER_FILE", "1000")),
        on_file="tests.reliability.dag_support.kill_first_try_after_file",
        on_file_kwargs={"after": int(os.environ.get("EO_KILL_AFTER_FILE", "2"))},
        retries=1,
        retry_delay=dt.timedelta(seconds=0),
        path_layout=os.environ.get("EO_LAYOUT") or None,
    )
