"""A pair of DAGs of the system tier for partitioned runs under the real scheduler
(tests/system/test_partitioned_backfill.py): the example pair of
dags_examples/liftbridge_partitioned_lake.py (hours archived, a day rolled up) scaled down to
minutes and an hour, so that an open partition ends within the test.

``system_partition_minutes`` (``CronPartitionTimetable("* * * * *")``: each run is the partition
``2026-03-10T09:41:00``, its window one minute): ``archive`` reads the partition's minute of a
2-partition stream with ``read=DataInterval(lateness=...)`` (a small one) and
``deferrable=True``, and writes it to Parquet files in ``dt=/hour=/minute=`` folders; then
``announce`` (backfill runs only) gives the asset ``system_partition_minutes`` an event for the
run's partition. The runs the scheduler makes while the DAG is unpaused (one a minute, for the
minute just begun) skip both tasks: each would wait out its minute, so while the DAG is unpaused
one would always be running, and the test could not wait for every run to finish; the test's runs
are the backfill's and manual runs with a partition key.

``system_partition_rollup`` (``PartitionedAssetTimetable`` on that asset,
``RollupMapper(StartOfHourMapper(), HourWindow(), MinimumCount(3))``): the events of an hour's
minutes map to the hour's partition ``2026-03-10T09``; the run starts once three of its minutes
are archived, and ``roll_up_hour`` (``@task.pyspark``) reads ``dt=/hour=`` of that hour and
nothing else, and returns the folders it read and the messages in each.

The stream and the folder come from the Airflow Variables ``system_partition_stream`` and
``system_partition_root`` (the test sets them). Both DAGs are paused when they are created.
Airflow 3.3 only (``RollupMapper``): the system tier runs 3.3.2.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import (
    Asset,
    Context,
    CronPartitionTimetable,
    HourWindow,
    MinimumCount,
    PartitionedAssetTimetable,
    RollupMapper,
    StartOfHourMapper,
    dag,
    task,
)
from airflow.sdk.exceptions import AirflowSkipException

from airflow_provider_liftbridge.operators import DataInterval, Parquet
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

MINUTES_DAG = "system_partition_minutes"
ROLLUP_DAG = "system_partition_rollup"
#: Seconds after a minute's end at which a partition with no later message counts as complete.
ALLOWED_LATENESS = 5
#: Minutes of an hour archived before its roll-up starts.
ROLLUP_AFTER = 3
STREAM = "{{ var.value.system_partition_stream }}"
ROOT = "{{ var.value.system_partition_root }}"
LAYOUT = "dt={partition_date:%Y-%m-%d}/hour={partition_date:%H}/minute={partition_date:%M}"
MINUTES = Asset(name="system_partition_minutes", uri="file:///system-partition-minutes")
LOCAL_SPARK = {
    "spark.master": "local[1]",
    "spark.pyspark.python": sys.executable,
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
}


def skip_scheduled(context: Context) -> None:
    """``pre_execute`` of ``archive``: skip it on a scheduled run.

    :raises AirflowSkipException: the run is a scheduled one."""
    if context["dag_run"].run_type == "scheduled":
        raise AirflowSkipException("a scheduled run: the test's runs are backfill and manual ones")


@dag(
    dag_id=MINUTES_DAG,
    schedule=CronPartitionTimetable("* * * * *", timezone="UTC"),
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    is_paused_upon_creation=True,
    max_active_runs=4,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=2)},
)
def system_partition_minutes() -> None:
    archive = LiftbridgeStreamToFileOperator(
        task_id="archive",
        stream=STREAM,
        read=DataInterval(lateness=ALLOWED_LATENESS),  # the partition's minute
        deferrable=True,
        path=ROOT + "/archive",
        path_layout=LAYOUT,
        # A row group per message: a file is a while under its temporary name, so the runs that
        # archive at the same time clean up while another's is there (issue 54).
        format=Parquet(row_group_rows=1),
        batch_size=100,
        pre_execute=skip_scheduled,
    )

    @task.run_if(lambda context: context["dag_run"].run_type == "backfill", skip_message="not a backfill run")
    @task(outlets=[MINUTES])  # the event carries the run's partition key
    def announce() -> None:
        """The minute is archived."""

    archive >> announce()


@dag(
    dag_id=ROLLUP_DAG,
    schedule=PartitionedAssetTimetable(
        assets=MINUTES,
        default_partition_mapper=RollupMapper(
            upstream_mapper=StartOfHourMapper(), window=HourWindow(), wait_policy=MinimumCount(ROLLUP_AFTER)
        ),
    ),
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    is_paused_upon_creation=True,
)
def system_partition_rollup() -> None:
    @task.pyspark(config_kwargs=LOCAL_SPARK)
    def roll_up_hour(root: str, spark: Any = None, sc: Any = None, dag_run: Any = None) -> dict[str, Any]:
        """The hour's folders and, per folder, its messages (partition, offset) and how many rows
        they were, from exactly the hour's folders."""
        from pyspark.sql import functions as F

        hour = datetime.strptime(str(dag_run.partition_key), "%Y-%m-%dT%H")  # or fail, nothing read
        base = f"{root}/archive"
        rows = (
            spark.read.option("basePath", base)
            .parquet(f"{base}/dt={hour:%Y-%m-%d}/hour={hour:%H}")
            .withColumn("folder", F.regexp_extract(F.input_file_name(), r"(dt=[^/]+/hour=[^/]+/minute=[^/]+)/", 1))
        )
        found: dict[str, list[list[int]]] = {}
        for r in rows.select("folder", "partition", "offset").collect():
            found.setdefault(r["folder"], []).append([r["partition"], r["offset"]])
        return {"hour": str(dag_run.partition_key), "folders": {k: sorted(v) for k, v in sorted(found.items())}}

    roll_up_hour(root=ROOT)


system_partition_minutes()
system_partition_rollup()
