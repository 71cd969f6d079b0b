"""The publishing operators' one vocabulary: ``batch_size`` is records per batch, ``options`` (one
``PublishOptions``) is how records travel, and every keyword removed before the first release is
refused with the form to write instead (CHANGELOG.md)."""

from __future__ import annotations

import warnings

import pytest

from airflow_provider_liftbridge.client import AckPolicy, ConnectionSettings, PublishOptions
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeUnknownArgumentError
from airflow_provider_liftbridge.operators.file_formats import FileFormat
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from airflow_provider_liftbridge.operators.publishing_base import DEFAULT_BATCH_SIZE, MAX_IN_FLIGHT
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.spark.sources import DataFrameSource

SETTINGS = ConnectionSettings(["127.0.0.1:1"], timeout=7.0)


def _publish(**kwargs: object) -> LiftbridgePublishOperator:
    return LiftbridgePublishOperator(task_id="p", stream="s", records=[], **kwargs)  # type: ignore[arg-type]


def test_batch_size_is_the_records_per_batch_and_bounds_the_window() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing of the new forms warns
        op = _publish(batch_size=50)
    assert op.batch_size == 50
    assert op.publish_options(SETTINGS).window == 50
    assert _publish(batch_size=5000).publish_options(SETTINGS).window == MAX_IN_FLIGHT
    assert _publish().batch_size == DEFAULT_BATCH_SIZE
    # The records in flight are the options' window, whatever the batch size.
    assert _publish(batch_size=50, options=PublishOptions(window=8)).publish_options(SETTINGS).window == 8


def test_options_is_the_one_home_of_the_transport() -> None:
    given = PublishOptions(path="grpc", timeout=3.0, compression="gzip", window=64, ack_policy=AckPolicy.ALL)
    made = _publish(options=given, partition=1, partitioner="key").publish_options(SETTINGS)
    assert (made.path, made.timeout, made.compression, made.window, made.ack_policy, made.partition) == (
        "grpc",
        3.0,
        "gzip",
        64,
        AckPolicy.ALL,
        1,
    )
    assert made.partitioner is not None
    # Unset: the connection's timeout and ack policy, the window from the batch size.
    plain = _publish(batch_size=10).publish_options(SETTINGS)
    assert (plain.path, plain.timeout, plain.window, plain.ack_policy) == ("auto", 7.0, 10, SETTINGS.ack_policy)


@pytest.mark.parametrize(("field", "value"), [("partition", 2), ("partitioner", object())])
def test_where_records_go_is_said_once_by_the_operator(field: str, value: object) -> None:
    from airflow_provider_liftbridge.client import KeyPartitioner

    given = PublishOptions(**{field: KeyPartitioner() if field == "partitioner" else value})
    with pytest.raises(LiftbridgeArgumentError, match=f"not options.{field}"):
        _publish(options=given)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"window": 20}, "write batch_size=N for records per batch"),
        ({"publish_timeout": 2.5}, r"write options=PublishOptions\(timeout=...\)"),
        ({"publish_path": "grpc"}, r"write options=PublishOptions\(path=...\)"),
        ({"compression": "gzip"}, r"write options=PublishOptions\(compression=...\)"),
        ({"ack_policy": "all"}, r"write options=PublishOptions\(ack_policy=...\)"),
        ({"records_callable_args": [1]}, r"write records_callable_kwargs=\{...\}"),
    ],
)
def test_a_removed_publish_keyword_names_the_new_form(old: dict[str, object], new: str) -> None:
    with pytest.raises(LiftbridgeUnknownArgumentError, match=f"no longer takes {next(iter(old))}=.*: {new}"):
        _publish(**old)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"progress_every": 100}, "progress is logged every 10,000 rows"),
        ({"csv_delimiter": ";"}, r"format=FileFormat\(<format>, csv_delimiter=...\)"),
        ({"encoding": "latin-1"}, r"format=FileFormat\(<format>, encoding=...\)"),
        ({"window": 5}, "batch_size=N"),
    ],
)
def test_a_removed_file_keyword_names_the_new_form(old: dict[str, object], new: str) -> None:
    with pytest.raises(LiftbridgeUnknownArgumentError, match=new):
        LiftbridgePublishFileOperator(task_id="f", stream="s", path="x.csv", **old)  # type: ignore[arg-type]


def test_a_file_format_is_one_value() -> None:
    op = LiftbridgePublishFileOperator(
        task_id="f", stream="s", path="x.csv", format=FileFormat("csv", csv_delimiter=";")
    )
    assert op.format == FileFormat("csv", csv_delimiter=";")
    with pytest.raises(LiftbridgeArgumentError, match="format 'xml' is unknown"):
        FileFormat("xml")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"key_col": "id"}, "write key_field=<the key column>"),
        ({"partitioning": "key"}, "write partitioner=..."),
        ({"window": 64}, r"options=PublishOptions\(window=...\)"),
        ({"publish_timeout": 3}, r"options=PublishOptions\(timeout=...\)"),
        ({"ack_policy": "all"}, r"options=PublishOptions\(ack_policy=...\)"),
        ({"sql": "SELECT 1"}, r"source=DataFrameSource\(sql=...\)"),
        ({"input_path": "/in"}, r"source=DataFrameSource\(input_path=...\)"),
    ],
)
def test_a_removed_spark_keyword_names_the_new_form(old: dict[str, object], new: str) -> None:
    with pytest.raises(LiftbridgeUnknownArgumentError, match=new):
        LiftbridgeSparkPublishOperator(task_id="s", stream="s", **old)  # type: ignore[arg-type]


def test_the_spark_operator_shares_the_publish_options() -> None:
    given = PublishOptions(window=64, compression="gzip", ack_policy="all")
    op = LiftbridgeSparkPublishOperator(
        task_id="s", stream="s", source=DataFrameSource(table="t"), key_field="id", options=given
    )
    assert op.publish_options() is given
    with pytest.raises(LiftbridgeArgumentError, match="exactly_once=True needs acknowledgements"):
        LiftbridgeSparkPublishOperator(
            task_id="s2",
            stream="s",
            source=DataFrameSource(table="t"),
            exactly_once=True,
            options=PublishOptions(ack_policy="none"),
        )
    with pytest.raises(LiftbridgeArgumentError, match="source is required"):
        LiftbridgeSparkPublishOperator(task_id="s3", stream="s")
