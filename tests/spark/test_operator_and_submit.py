"""LiftbridgeSparkPublishOperator and the spark-submit job, on local[2] against the dev server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from airflow_provider_liftbridge.client import LiftbridgeClient, partition_for_key
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.sensors.offset import summary_offsets
from airflow_provider_liftbridge.spark import SparkOptionError
from airflow_provider_liftbridge.spark.session import spark_session_scope
from airflow_provider_liftbridge.spark.sources import DataFrameSource
from airflow_provider_liftbridge.spark.submit import main as submit_main
from tests.spark import helpers

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("liftbridge_conn")]


def test_operator_publishes_from_a_callable_and_returns_a_sensor_ready_summary(
    spark: SparkSession, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(2)
    op = LiftbridgeSparkPublishOperator(
        task_id="publish",
        stream=stream,
        source=DataFrameSource(dataframe_callable="tests.spark.helpers.orders", callable_kwargs={"rows": 200}),
        key_field="customer",
    )

    summary = op.execute({})

    assert (summary["stream"], summary["count"], summary["acknowledged"], summary["ack_policy"]) == (
        stream,
        200,
        200,
        "LEADER",
    )
    json.dumps(summary)  # XCom-safe
    # The offset sensor accepts it, and its targets are the partitions' real high watermarks.
    _, offsets = summary_offsets(summary)
    with LiftbridgeClient(lb_address) as client:
        assert offsets == {
            str(p): client.fetch_partition_metadata(stream, p).high_watermark for p in range(2) if str(p) in offsets
        }
    expected = {p: sum(1 for c in range(10) if partition_for_key(f"c{c}".encode(), 2) == p) * 20 for p in range(2)}
    assert {int(p): span["count"] for p, span in summary["partitions"].items()} == {
        p: n for p, n in expected.items() if n
    }
    # The session the test suite owns is still usable: the operator did not stop a session it did not start.
    assert spark.range(3).count() == 3


def test_operator_refuses_bad_arguments_when_the_dag_is_parsed() -> None:
    with pytest.raises(SparkOptionError, match="exactly one DataFrame source"):
        LiftbridgeSparkPublishOperator(task_id="p", stream="s", source=DataFrameSource(table="t", sql="select 1"))
    with pytest.raises(SparkOptionError, match="value_col"):
        LiftbridgeSparkPublishOperator(task_id="p", stream="s", source=DataFrameSource(table="t"), value_format="bytes")


def test_operator_rejects_a_callable_that_returns_no_dataframe(spark: SparkSession, stream_name: str) -> None:
    op = LiftbridgeSparkPublishOperator(
        task_id="p",
        stream=stream_name,
        source=DataFrameSource(dataframe_callable="tests.spark.helpers.not_a_dataframe"),
    )
    with pytest.raises(SparkOptionError, match="returned list, not a DataFrame"):
        op.execute({})


def test_submit_job_publishes_a_parquet_folder(
    spark: SparkSession,
    lb_address: str,
    nats_url: str,
    make_stream: Callable[[int], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    stream = make_stream(1)
    helpers.orders(spark, 50).write.parquet(str(tmp_path / "orders"))

    code = submit_main(
        [
            "--stream", stream, "--brokers", lb_address, "--nats-servers", nats_url,
            "--input", str(tmp_path / "orders"), "--format", "parquet", "--key-field", "customer",
        ]
    )  # fmt: skip

    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (summary["count"], summary["partitions"]["0"]["last_offset"]) == (50, 49)


def test_submit_job_fails_with_exit_code_1_naming_the_missing_stream(
    spark: SparkSession, lb_address: str, stream_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = submit_main(["--stream", stream_name, "--brokers", lb_address, "--sql", "select 1 as x"])
    assert code == 1
    assert f"stream '{stream_name}' does not exist" in capsys.readouterr().err


def test_operator_exactly_once_skips_what_an_earlier_try_published(
    spark: SparkSession, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    """A retry of the same task (same producer id) finds every row already stored and writes none."""
    stream = make_stream(2)

    def run() -> dict[str, object]:
        op = LiftbridgeSparkPublishOperator(
            task_id="publish",
            stream=stream,
            source=DataFrameSource(dataframe_callable="tests.spark.helpers.orders", callable_kwargs={"rows": 120}),
            key_field="customer",
            exactly_once=True,
            producer_id="dag/publish/run-1",
        )
        return op.execute({})

    first, retry = run(), run()
    assert first["count"] == 120 and first.get("skipped", 0) == 0
    assert retry.get("skipped") == 120
    with LiftbridgeClient(lb_address) as client:
        stored = sum(client.fetch_partition_metadata(stream, p).newest_offset + 1 for p in range(2))
    assert stored == 120


def test_a_job_in_another_thread_leaves_the_running_session_running(spark: SparkSession) -> None:
    """The operator and the submit job reuse a session already running in the process and leave
    it running, whichever thread they run in. The JVM's active session is per thread (and the JVM
    thread behind a Python thread can change): a new thread has none, and a scope that took that
    for "no session here" stopped the suite's session at its end."""
    counted: list[int] = []

    def job() -> None:
        with spark_session_scope("local[1]", app_name="another-thread") as session:
            counted.append(session.range(2).count())

    worker = threading.Thread(target=job)
    worker.start()
    worker.join(120)
    assert counted == [2]
    assert spark.sparkContext._jsc is not None and spark.range(3).count() == 3  # not stopped


def test_a_job_on_the_running_session_sets_its_runtime_settings_back(spark: SparkSession) -> None:
    """PySpark's ``getOrCreate`` applies a job's runtime SQL settings to a session that already
    runs: the job sees them, and the scope sets them back (or unsets them) when it ends, so they do
    not stay for the next job (before, a job's Arrow batch size stayed in the shared session)."""
    batch, per_file = "spark.sql.execution.arrow.maxRecordsPerBatch", "spark.sql.files.maxRecordsPerFile"
    before = {batch: spark.conf.get(batch, None), per_file: spark.conf.get(per_file, None)}
    assert before[batch] not in (None, "123") and before[per_file] is None  # the suite sets one, not the other
    config = {batch: "123", per_file: "77", "spark.ui.enabled": "false"}  # the last one is static
    with spark_session_scope("local[1]", config=config) as session:
        assert (session.conf.get(batch), session.conf.get(per_file)) == ("123", "77")
    assert {batch: spark.conf.get(batch, None), per_file: spark.conf.get(per_file, None)} == before
