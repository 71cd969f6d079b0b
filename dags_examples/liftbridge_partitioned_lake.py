"""A pair of DAGs on Airflow's partitioned runs (3.2+, AIP-76): every hour, archive exactly that
hour's messages of a stream into its own ``dt=/hour=`` folder; once a day's hours are archived,
roll the day up with Spark, reading exactly that day's folders.

``liftbridge_hourly_partitions`` (``CronPartitionTimetable("0 * * * *")``: each run is the
partition ``2026-03-10T09:00:00``, a point in time without a data interval):

1. ``create_stream``: the ``page-views`` stream (2 partitions), if missing;
2. ``archive_hour``: ``LiftbridgeStreamToFileOperator`` with ``read=DataInterval(...)`` reads the
   partition's hour (from the key's time to the schedule's next time: 09:00 to 10:00) and writes
   it under ``dt=2026-03-10/hour=09/`` (``path_layout`` names ``{partition_date:...}``). Its outlet,
   the asset ``liftbridge_page_views_hourly``, gets an asset event for the partition
   ``2026-03-10T09:00:00`` (Airflow gives an outlet event the run's partition key).

``liftbridge_daily_rollup`` (``PartitionedAssetTimetable`` on that asset, Airflow 3.3's
``RollupMapper(StartOfDayMapper(), DayWindow())``): the hourly events of a day map to the day's
partition ``2026-03-10``; the run starts when all 24 hours are archived (``WaitForAll``) and
``roll_up_day`` (``@task.pyspark``) reads ``dt=2026-03-10/`` and nothing else, counts the views per
hour and page and writes them to the daily folder ``dt=2026-03-10/`` of ``page-views-daily``.
``LIFTBRIDGE_ROLLUP_MIN_HOURS=N`` starts it once N hours are in (``MinimumCount``; the system test
archives three hours). Airflow 3.2 has no ``RollupMapper``: there the roll-up maps each hour's
event to its day with ``StartOfDayMapper`` alone, so it does not wait for the day's hours (the DAGs
parse on 3.2; the pair was run under a 3.3.2 scheduler only).

A backfill of three past hours (``airflow backfill create --dag-id liftbridge_hourly_partitions
--from-date 2026-03-10T09:00:00+00:00 --to-date 2026-03-10T11:00:00+00:00``) makes one run per
partition key (tests/system/test_partitioned_lake.py runs it, then the roll-up). The lake is
``$LIFTBRIDGE_LAKE_URL`` (default ``$AIRFLOW_HOME/liftbridge-lake``, fine on one machine;
give a shared store such as ``s3://...`` when workers share no disk).
"""

from __future__ import annotations

import os
import sys
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import Asset, CronPartitionTimetable, PartitionedAssetTimetable, StartOfDayMapper, dag, task

from airflow_provider_liftbridge.operators import DataInterval
from airflow_provider_liftbridge.operators.stream import LiftbridgeCreateStreamOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

STREAM = "page-views"
LAKE = os.environ.get("LIFTBRIDGE_LAKE_URL") or (
    (Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "liftbridge-lake").as_uri()
)
HOURLY_URL = f"{LAKE}/{STREAM}"
DAILY_URL = f"{LAKE}/{STREAM}-daily"
#: Folders named by the partition's time (in the timetable's zone): Spark reads dt and hour as
#: columns. (``{partition_key}`` names the key as it is, but a ':' in a folder name is not readable
#: by Hadoop-based readers such as Spark.)
LAYOUT = "dt={partition_date:%Y-%m-%d}/hour={partition_date:%H}"
HOURLY = Asset(name="liftbridge_page_views_hourly", uri=HOURLY_URL)
MIN_HOURS = int(os.environ.get("LIFTBRIDGE_ROLLUP_MIN_HOURS") or 0)
LOCAL_SPARK = {
    "spark.master": "local[2]",
    "spark.pyspark.python": sys.executable,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",  # a day of views is small: not Spark's 200 tasks per group-by
}


def day_mapper() -> Any:
    """The hourly keys of a day to the day's key (``2026-03-10``), the run waiting for the day's
    hours where Airflow can say so (3.3's ``RollupMapper``)."""
    try:
        from airflow.sdk import DayWindow, MinimumCount, RollupMapper, WaitForAll
    except ImportError:  # Airflow 3.2: the day's key, without waiting for the day's hours
        return StartOfDayMapper()
    policy = MinimumCount(MIN_HOURS) if MIN_HOURS else WaitForAll()
    return RollupMapper(upstream_mapper=StartOfDayMapper(), window=DayWindow(), wait_policy=policy)


@dag(
    dag_id="liftbridge_hourly_partitions",
    schedule=CronPartitionTimetable("0 * * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,  # partitions never share a message: several may run at once
    tags=["liftbridge", "example", "partitions"],
)
def liftbridge_hourly_partitions() -> None:
    create = LiftbridgeCreateStreamOperator(task_id="create_stream", stream=STREAM, partitions=2)
    archive = LiftbridgeStreamToFileOperator(
        task_id="archive_hour",
        stream=STREAM,
        read=DataInterval(lateness=timedelta(minutes=2)),  # the partition's hour: no data interval on a partitioned run
        deferrable=True,
        path=HOURLY_URL,
        path_layout=LAYOUT,
        format="parquet",
        value_format="json",
        outlets=[HOURLY],  # its event carries the run's partition key
        retries=2,
        retry_delay=timedelta(seconds=10),
    )
    create >> archive


@dag(
    dag_id="liftbridge_daily_rollup",
    schedule=PartitionedAssetTimetable(assets=HOURLY, default_partition_mapper=day_mapper()),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["liftbridge", "example", "partitions", "spark"],
)
def liftbridge_daily_rollup() -> None:
    @task.pyspark(config_kwargs=LOCAL_SPARK)
    def roll_up_day(spark: Any = None, sc: Any = None, dag_run: Any = None) -> dict[str, Any]:
        """Views per hour and page of the run's day, from exactly the day's folders."""
        from pyspark.sql import functions as F

        day = str(dag_run.partition_key)
        date.fromisoformat(day)  # a day's key, or fail here with nothing read
        views = (
            spark.read.option("basePath", HOURLY_URL)
            .parquet(f"{HOURLY_URL}/dt={day}")
            .withColumn("folder", F.regexp_extract(F.input_file_name(), r"(dt=[^/]+/hour=[^/]+)/[^/]+$", 1))
        )
        per_page = views.groupBy("hour", "page").agg(F.count("*").alias("views"))
        per_page.write.mode("overwrite").parquet(f"{DAILY_URL}/dt={day}")
        folders = sorted(r["folder"] for r in views.select("folder").distinct().collect())
        hours = per_page.groupBy("hour").agg(F.sum("views").alias("views")).collect()
        per_hour = {f"{r['hour']:02d}": r["views"] for r in hours}
        print(f"day {day}: read {folders}; views per hour {per_hour}")
        return {"day": day, "folders": folders, "views_per_hour": dict(sorted(per_hour.items()))}

    roll_up_day()


liftbridge_hourly_partitions()
liftbridge_daily_rollup()
