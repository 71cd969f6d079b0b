"""Spark Connect: a Spark Connect server started from the installed pyspark (its Python workers
run the Airflow-free executor archive); publishing and the ``liftbridge`` data source from a
Connect session, and the publish operator through a ``spark_connect`` connection in a process
that cannot start a JVM."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
from pyspark.sql.connect import functions as F  # this process also runs a classic session

from airflow_provider_liftbridge.spark import ConnectionSettings, publish_dataframe, to_options
from airflow_provider_liftbridge.spark.session import spark_session_scope
from tests.airflow_support import REPO, conn_env_name, liftbridge_conn_json
from tests.processes import run_child
from tests.spark.test_publish_dataframe import read_partition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def python_of_the_workers(_: object) -> str:
    """The interpreter running this UDF, and whether it can import Airflow."""
    import importlib.util
    import sys

    return f"{sys.executable}|{importlib.util.find_spec('airflow') is not None}"


python_of_the_workers.__module__ = "__main__"  # shipped by value: the server cannot import tests


@pytest.fixture(scope="module")
def connect(spark_connect_url: str) -> Iterator[SparkSession]:
    # The scope, not build_spark_session: it also clears pyspark's process-wide Connect mark,
    # which would otherwise send every later classic session of this process (and of the Airflow
    # deployments it starts) to Spark Connect.
    with spark_session_scope(spark_connect_url) as session:
        yield session


def test_publish_and_data_source_from_a_connect_session(
    connect: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    assert type(connect).__module__.startswith("pyspark.sql.connect")
    # useArrow given: a plain UDF, and no inference from type hints (which are text here, from a
    # module Spark cannot import: pyspark warned "Cannot infer the eval type from type hints")
    probe = F.udf(python_of_the_workers, "string", useArrow=False)
    python, airflow_importable = connect.range(1).select(probe("id")).first()[0].split("|")
    assert python.endswith("/lbenv/bin/python") and airflow_importable == "False"
    stream = make_stream(2)
    df = connect.range(1000, numPartitions=2).select(F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("k"))

    summary = publish_dataframe(df, stream, settings=lb_settings, key_field="k")

    assert (summary.count, summary.acknowledged) == (1000, 1000)
    (
        connect.range(500, 700, numPartitions=2)
        .select(F.col("id").cast("string").alias("v"))
        .write.format("liftbridge")
        .mode("append")
        .options(**to_options(lb_settings))
        .option("stream", stream)
        .option("valueColumn", "v")
        .save()
    )
    read = connect.read.format("liftbridge").options(**to_options(lb_settings)).option("stream", stream).load()
    assert read.count() == 1200
    assert sum(len(read_partition(lb_address, stream, p)) for p in (0, 1)) == 1200


def test_operator_over_a_spark_connect_connection_needs_no_jvm(
    spark_connect_url: str, lb_address: str, nats_url: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(1)
    host, port = spark_connect_url.removeprefix("sc://").rsplit(":", 1)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        conn_env_name("liftbridge_default"): liftbridge_conn_json(lb_address, nats_url=nats_url),
        conn_env_name("spark_connect_test"): json.dumps({"conn_type": "spark_connect", "host": host, "port": port}),
        # No Java here: a task that tried to start its own JVM would fail.
        "JAVA_HOME": "/nonexistent",
        "PATH": os.path.dirname(sys.executable),
    }
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)  # a fresh task process, whatever this one did
    script = f"""
import json
import pyspark
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.spark.sources import DataFrameSource
op = LiftbridgeSparkPublishOperator(
    task_id="publish", stream={stream!r}, spark_conn_id="spark_connect_test",
    source=DataFrameSource(dataframe_callable="tests.spark.helpers.orders", callable_kwargs={{"rows": 300}}),
    key_field="customer",
)
summary = op.execute({{}})
assert pyspark.SparkContext._gateway is None, "a JVM was started"
import os
assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ, "the process was left in Spark Connect mode"
print(json.dumps(summary))
"""
    done = run_child([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert (summary["count"], summary["acknowledged"]) == (300, 300)
    assert len(read_partition(lb_address, stream, 0)) == 300
