"""An interval archive laid out by time (``dt=/hour=`` folders, written by hourly runs of
LiftbridgeStreamToFileOperator through ``dag.test()``) read back by Spark with partition discovery:
``spark.read.parquet(root)`` gives ``dt`` and ``hour`` columns, and a filter on them reads only
that hour's files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from tests.operators.interval_support import hourly_dag, logical_date_of, publish_three_hours

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(300)]


def test_spark_discovers_dt_and_hour_from_the_archive_layout(
    spark: SparkSession, stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    per_hour = publish_three_hours(liftbridge_client, stream_name)
    root = tmp_path / "lake"
    dag = hourly_dag(
        LiftbridgeStreamToFileOperator,
        "archive",
        stream_name,
        path=str(root),
        format="parquet",
        value_format="json",
        batch_size=3,
        path_layout="dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}",
    )
    for hour in range(3):
        assert str(dag.test(logical_date=logical_date_of(hour)).state) == "success"

    frame = spark.read.parquet(f"file://{root}")
    assert {"dt", "hour", "partition", "offset", "minute", "country"} <= set(frame.columns)
    got = {(str(r["dt"]), int(r["hour"]), int(r["partition"]), int(r["offset"])) for r in frame.collect()}
    expected = {("2026-03-02", 10 + h, p, o) for h, pairs in per_hour.items() for p, o in pairs}
    assert got == expected
    eleven = frame.where("hour = 11")
    assert {(int(r["partition"]), int(r["offset"])) for r in eleven.collect()} == per_hour[1]
    assert "PartitionFilters: [isnotnull(hour" in eleven._jdf.queryExecution().executedPlan().toString()
