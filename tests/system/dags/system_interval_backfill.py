"""A DAG of the system tier for backfills of interval reads under the real scheduler
(tests/system/test_interval_backfill.py): every 20 s data interval of a 2-partition stream is
archived to Parquet files in ``dt=/hour=/minute=`` folders (so three intervals share a minute
folder) and consumed into a file per run and try, both with ``read=DataInterval(lateness=...)``
(a small lateness) and ``deferrable=True``.

The stream and the folder come from the Airflow Variables ``system_interval_backfill_stream`` and
``system_interval_backfill_root`` (scheduled, backfill and manual runs all read them; the test
sets them). The DAG is paused when it is created: only the test unpauses it, while it runs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import dag, get_current_context
from airflow.timetables.interval import DeltaDataIntervalTimetable

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.operators import DataInterval, Parquet
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

DAG_ID = "system_interval_backfill"
#: Length of a data interval (and the schedule).
INTERVAL = timedelta(seconds=20)
#: Seconds after an interval's end at which a partition with no later message counts as complete.
ALLOWED_LATENESS = 5
STREAM = "{{ var.value.system_interval_backfill_stream }}"
ROOT = "{{ var.value.system_interval_backfill_root }}"


def consumed_file(root: str, run_id: str, task_id: str, try_number: int) -> Path:
    """Where a consume try writes what it was handed (one JSON line per message)."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in run_id)
    return Path(root) / "consumed" / safe / f"{task_id}.try-{try_number}.jsonl"


def record_batch(messages: list[Message], root: str) -> None:
    """The consume task's batch function: append partition, offset and timestamp of each message
    to this run's and try's file (the test reads it back)."""
    ti = get_current_context()["ti"]
    path = consumed_file(root, ti.run_id, ti.task_id, ti.try_number)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.writelines(json.dumps({"p": m.partition, "o": m.offset, "ts": m.timestamp}) + "\n" for m in messages)


@dag(
    dag_id=DAG_ID,
    # Data intervals of 20 s (a plain timedelta schedule gives runs without one on Airflow 3).
    schedule=DeltaDataIntervalTimetable(INTERVAL),
    start_date=datetime(2024, 1, 1, tzinfo=UTC),  # intervals start at :00, :20 and :40 of every minute
    catchup=False,
    is_paused_upon_creation=True,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=2)},
)
def system_interval_backfill() -> None:
    reading = {"stream": STREAM, "read": DataInterval(lateness=ALLOWED_LATENESS), "deferrable": True}
    LiftbridgeStreamToFileOperator(
        task_id="archive",
        path=ROOT + "/archive",
        path_layout="dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}/minute={timestamp:%M}",
        # A row group per message: a file is a while under its temporary name, so the runs that
        # archive at the same time (the backfill's) clean up while another's is there (issue 54).
        format=Parquet(row_group_rows=1),
        batch_size=100,
        **reading,
    )
    LiftbridgeConsumeOperator(
        task_id="consume",
        apply_function_batch=record_batch,
        apply_function_kwargs={"root": ROOT},
        batch_size=50,
        **reading,
    )


system_interval_backfill()
