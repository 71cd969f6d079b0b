"""Every hour, archive exactly that hour's messages of a stream to Parquet, in ``dt=/hour=``
folders a data lake prunes by, the Airflow way: each run reads its data interval.

1. ``create_stream``: the ``sensor-readings`` stream (2 partitions), if missing;
2. ``archive_hour``: ``LiftbridgeStreamToFileOperator`` with ``read=DataInterval(...)`` takes every
   message whose Liftbridge timestamp (its reception time on the partition's leader) falls in the
   run's data interval, found by Liftbridge's time index, and writes it under
   ``params.archive_url``/``dt=YYYY-MM-DD/hour=HH/``, files named by partition and offset range.
   It waits (``deferrable=True``: in the triggerer) until every partition is complete for the hour:
   a committed message at or after the hour's end, or the end plus the ``lateness`` (2
   minutes here) passed with everything committed. A retry, a clear and a backfill of the hour all
   write the same files;
3. ``hour_report``: counts the rows of the hour's files per folder (pyarrow).

A backfill of three past hours (Airflow 3: ``airflow backfill create --dag-id
liftbridge_interval_archive --from-date 2026-03-02T10:00:00+00:00 --to-date
2026-03-02T12:00:00+00:00``) runs three runs, one per hour; each archives that hour's messages,
once, into its own folder, whatever the stream's position or today's traffic. ``docs/consume.md``
("A backfill of three hours") shows one, with its output.

Runs on the dev server::

    liftbridge-devserver --port 9292 --nats-port 4222 --data-dir /tmp/lb &
    export AIRFLOW_CONN_LIFTBRIDGE_DEFAULT='{"conn_type": "liftbridge", "host": "127.0.0.1", "port": 9292}'
    airflow dags test liftbridge_interval_archive 2026-03-02T11:00:00+00:00
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import dag, task
from airflow.timetables.interval import CronDataIntervalTimetable

from airflow_provider_liftbridge.operators import DataInterval
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

READINGS = "sensor-readings"
DEFAULT_ARCHIVE = (Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "liftbridge-lake").as_uri()


@dag(
    dag_id="liftbridge_interval_archive",
    # Data intervals of one hour (Airflow 3's "@hourly" is a point in time, without an interval).
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,  # runs of different hours may overlap: they never share a message
    params={"stream": READINGS, "archive_url": f"{DEFAULT_ARCHIVE}/{READINGS}"},
    tags=["liftbridge", "example"],
)
def liftbridge_interval_archive() -> None:
    create = LiftbridgeCreateStreamOperator(task_id="create_stream", stream="{{ params.stream }}", partitions=2)

    archive = LiftbridgeStreamToFileOperator(
        task_id="archive_hour",
        stream="{{ params.stream }}",
        read=DataInterval(lateness=timedelta(minutes=2)),  # the run's data interval, not "since the last run"
        deferrable=True,
        path="{{ params.archive_url }}",
        path_layout="dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}",
        format="parquet",
        value_format="json",
        batch_size=100_000,  # messages per file
        retries=2,
        retry_delay=timedelta(seconds=10),
    )

    @task
    def hour_report(archived: dict[str, Any]) -> dict[str, Any]:
        """Rows per folder of this run's files."""
        import pyarrow.parquet as pq
        from airflow.sdk import ObjectStoragePath

        rows: Counter[str] = Counter()
        for entry in archived["files"]:
            path = ObjectStoragePath(entry["path"])
            rows[f"{path.parent.parent.name}/{path.parent.name}"] += pq.read_metadata(path.open("rb")).num_rows
        print(f"interval {archived['interval']}: {archived['processed']} message(s); per folder {dict(rows)}")
        return {
            "interval": archived["interval"],
            "processed": archived["processed"],
            "rows": dict(sorted(rows.items())),
        }

    create >> archive
    hour_report(archive.output)


liftbridge_interval_archive()
