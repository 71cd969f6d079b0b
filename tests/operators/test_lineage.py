"""OpenLineage of the publish operators and the stream-reading sensors (airflow_provider_liftbridge/lineage.py).

Read through the OpenLineage provider's own ``DefaultExtractor`` (the code Airflow's listener runs), with
the provider installed; and, in a child interpreter where it cannot be imported, checked that nothing breaks.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from airflow.providers.openlineage.extractors.base import DefaultExtractor

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.lineage import file_dataset, stream_namespace
from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor
from airflow_provider_liftbridge.spark.sources import DataFrameSource
from tests.processes import run_child

pytestmark = pytest.mark.usefixtures("liftbridge_conn")


def _names(datasets: list[object]) -> list[tuple[str, str]]:
    return [(d.namespace, d.name) for d in datasets]  # type: ignore[attr-defined]


def test_publish_operator_writes_the_stream(
    stream_name: str, lb_address: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    op = LiftbridgePublishOperator(task_id="p", stream=stream_name, records=[{"id": 1}])
    start = DefaultExtractor(op).extract()
    assert start is not None and start.inputs == []
    assert _names(start.outputs) == [(f"liftbridge://{lb_address}", stream_name)]
    op.execute({})
    done = DefaultExtractor(op).extract_on_complete(None)
    assert done is not None and _names(done.outputs) == [(f"liftbridge://{lb_address}", stream_name)]


def test_file_operator_reads_each_file_and_writes_the_stream(tmp_path: Path, lb_address: str) -> None:
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / name).write_text('{"x": 1}\n')
    op = LiftbridgePublishFileOperator(task_id="f", stream="orders", path=str(tmp_path / "*.jsonl"))
    lineage = DefaultExtractor(op).extract()
    assert lineage is not None
    assert sorted(_names(lineage.inputs)) == [("file", str(tmp_path / "a.jsonl")), ("file", str(tmp_path / "b.jsonl"))]
    assert _names(lineage.outputs) == [(f"liftbridge://{lb_address}", "orders")]


def test_consume_operator_reads_the_stream_and_writes_its_dead_letters(lb_address: str) -> None:
    plain = LiftbridgeConsumeOperator(task_id="c", stream="orders", read=SinceLastRun("c"), apply_function=print)
    lineage = DefaultExtractor(plain).extract()
    assert lineage is not None and lineage.outputs == []
    assert _names(lineage.inputs) == [(f"liftbridge://{lb_address}", "orders")]
    dead = LiftbridgeConsumeOperator(
        task_id="d", stream="orders", read=SinceLastRun("c"), apply_function=print, dead_letters=DeadLetterStream("dlq")
    )
    lineage = DefaultExtractor(dead).extract()
    assert lineage is not None and _names(lineage.outputs) == [(f"liftbridge://{lb_address}", "dlq")]


def test_archive_operator_reads_the_stream_and_writes_the_directory(tmp_path: Path, lb_address: str) -> None:
    op = LiftbridgeStreamToFileOperator(
        task_id="a", stream="orders", read=SinceLastRun("a"), path=str(tmp_path), dead_letters=DeadLetterStream("dlq")
    )
    lineage = DefaultExtractor(op).extract()
    assert lineage is not None
    assert _names(lineage.inputs) == [(f"liftbridge://{lb_address}", "orders")]
    assert _names(lineage.outputs) == [("file", str(tmp_path)), (f"liftbridge://{lb_address}", "dlq")]


def test_spark_operator_reports_its_input_path(lb_address: str) -> None:
    op = LiftbridgeSparkPublishOperator(
        task_id="s", stream="events", source=DataFrameSource(input_path="s3a://lake/raw/events.parquet")
    )
    lineage = DefaultExtractor(op).extract()
    assert lineage is not None
    assert _names(lineage.inputs) == [("s3a://lake", "raw/events.parquet")]
    assert _names(lineage.outputs) == [(f"liftbridge://{lb_address}", "events")]


def test_sensors_read_the_stream(lb_address: str) -> None:
    message = LiftbridgeMessageSensor(
        task_id="m", stream="orders", apply_function="airflow_provider_liftbridge.sensors.matchers.any_message"
    )
    offset = LiftbridgeOffsetSensor(task_id="o", target_offset={"stream": "orders", "partitions": {}})
    for sensor in (message, offset):
        lineage = DefaultExtractor(sensor).extract()
        assert lineage is not None
        assert (_names(lineage.inputs), lineage.outputs) == ([(f"liftbridge://{lb_address}", "orders")], [])


def test_naming_rules() -> None:
    assert stream_namespace(["h1:9292", "h2:9292"]) == "liftbridge://h1:9292"
    with pytest.raises(ValueError, match="at least one broker"):
        stream_namespace([])
    assert (file_dataset("/data/x.csv").namespace, file_dataset("/data/x.csv").name) == ("file", "/data/x.csv")


def test_without_the_openlineage_provider_nothing_breaks() -> None:
    """A child interpreter in which the OpenLineage client and the provider's extractors cannot be imported."""
    code = textwrap.dedent(
        """
        import sys
        # Every import of the OpenLineage client and of the provider's extractors fails, as when the
        # extra is not installed (the provider's metadata module stays, for Airflow's provider discovery).
        sys.modules["openlineage"] = None
        sys.modules["airflow.providers.openlineage.extractors"] = None
        from tests.airflow_support import configure_airflow
        configure_airflow()
        from airflow_provider_liftbridge.lineage import openlineage_available
        from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
        from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
        assert not openlineage_available()
        op = LiftbridgePublishOperator(task_id="p", stream="s", records=[1])
        assert op.get_openlineage_facets_on_start() is None
        assert op.get_openlineage_facets_on_complete(None) is None
        sensor = LiftbridgeMessageSensor(task_id="m", stream="s", apply_function="x.y")
        assert sensor.get_openlineage_facets_on_start() is None
        print("ok")
        """
    )
    out = run_child([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
