"""``dataframe_callable`` is checked for its shape when the DAG is parsed and imported on the
worker (the Spark driver) when the task starts, before Spark does; the ``spark-submit`` job's
source imports it on the driver, naming it in the error."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.spark import SparkOptionError
from airflow_provider_liftbridge.spark.sources import DataFrameSource
from tests.worker_module import WorkerModule

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("liftbridge_conn")]


def test_a_dataframe_callable_absent_at_parse_time_is_imported_where_the_task_runs(
    spark: SparkSession, lb_address: str, make_stream: Callable[[int], str], tmp_path: Path
) -> None:
    module = WorkerModule(tmp_path)
    stream = make_stream(1)
    # Made (parsed) where the module does not exist: only the shape is checked.
    op = LiftbridgeSparkPublishOperator(
        task_id="p",
        stream=stream,
        source=DataFrameSource(dataframe_callable=module.path("numbers"), callable_kwargs={"rows": 5}),
        value_col="value",
        value_format="bytes",
    )
    with pytest.raises(LiftbridgeArgumentError) as raised:
        op.execute({})  # a worker without it: fails before Spark builds anything
    assert (
        f"source.dataframe_callable='{module.path('numbers')}' cannot be imported on the Airflow worker "
        "(where the task runs)" in str(raised.value)
    )
    with LiftbridgeClient(lb_address) as client:
        assert client.fetch_partition_metadata(stream, 0).high_watermark == -1  # nothing published
    with module.on_path():
        summary = op.execute({})
    assert (summary["count"], summary["acknowledged"]) == (5, 5)
    assert module.calls() == [{"function": "numbers", "rows": 5}]


def test_the_submit_jobs_source_imports_the_callable_on_the_spark_driver(spark: SparkSession, tmp_path: Path) -> None:
    module = WorkerModule(tmp_path)
    source = DataFrameSource(dataframe_callable=module.path("numbers"), callable_kwargs={"rows": 3})  # no import
    with pytest.raises(
        SparkOptionError, match=r"cannot be imported on the Spark driver \(where the DataFrame is built\)"
    ):
        source.load(spark)
    with module.on_path():
        assert source.load(spark).count() == 3
