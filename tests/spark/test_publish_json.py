"""The JSON ``publish_dataframe`` publishes, written by Spark's ``to_json`` in the JVM, and the JSON
the Python encoder (``plan.json_values``: the data source writer, the streaming sink) publishes for
the same row: one test per type where they differ (docs/spark.md, "The JSON published"), the
types both write alike, and the keys and partitions computed in the JVM."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge.client import LiftbridgeClient, Message, partition_for_key
from airflow_provider_liftbridge.spark import ConnectionSettings, publish_dataframe, to_options

pytestmark = pytest.mark.spark


def published(lb_address: str, stream: str, partitions: int = 1) -> list[Message]:
    out: list[Message] = []
    with LiftbridgeClient(lb_address) as client:
        for partition in range(partitions):
            high = client.fetch_partition_metadata(stream, partition).high_watermark
            if high >= 0:
                out += client.subscribe(stream, partition=partition, start_at=0, stop_at=high)
    return out


def one_row_json(spark: SparkSession, settings: ConnectionSettings, lb_address: str, stream: str, expr: str) -> str:
    """The message text of one row ``select <expr> as v``, published as whole-row JSON by
    ``publish_dataframe`` (Spark's ``to_json``)."""
    publish_dataframe(spark.range(1).selectExpr(f"{expr} as v"), stream, settings=settings)
    (message,) = published(lb_address, stream)
    return message.value.decode()


def written(df: DataFrame, settings: ConnectionSettings, lb_address: str, stream: str) -> list[Message]:
    """The messages of ``df`` written as whole-row JSON by the data source writer (the Python encoder)."""
    df.write.format("liftbridge").mode("append").options(**to_options(settings)).option("stream", stream).save()
    return published(lb_address, stream)


# (Spark SQL expression, the exact JSON text Spark writes, the exact text the Python encoder writes)
DIFFERING: dict[str, tuple[str, str, str]] = {
    "decimal": ("cast('12.50' as decimal(10,2))", '{"v":12.50}', '{"v":"12.50"}'),
    "timestamp_ntz": (
        "timestamp_ntz'2024-01-02 03:04:05'",
        '{"v":"2024-01-02T03:04:05.000000"}',
        '{"v":"2024-01-02T03:04:05"}',
    ),
    "large double": ("cast(1e20 as double)", '{"v":1.0E20}', '{"v":1e+20}'),
    "small double": ("cast(1e-20 as double)", '{"v":1.0E-20}', '{"v":1e-20}'),
    "NaN": ("cast('NaN' as double)", '{"v":"NaN"}', '{"v":NaN}'),
    "Infinity": ("cast('Infinity' as double)", '{"v":"Infinity"}', '{"v":Infinity}'),
    "-Infinity": ("cast('-Infinity' as double)", '{"v":"-Infinity"}', '{"v":-Infinity}'),
    "float": ("cast(0.1 as float)", '{"v":0.1}', '{"v":0.10000000149011612}'),
}


KINDS = sorted(DIFFERING)


@pytest.fixture(scope="module")
def differing_json(_spark_driver: Callable[[], SparkSession], lb_address: str, nats_url: str) -> str:
    """The message of one row holding every :data:`DIFFERING` expression, column ``k<i>`` for the
    i-th of :data:`KINDS`, published as whole-row JSON: one Spark job for all the cases."""
    from airflow_provider_liftbridge.spark import register

    spark = _spark_driver()
    register(spark)
    stream = f"publish-json-differing-{uuid.uuid4().hex[:12]}"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream, stream)
    settings = ConnectionSettings(brokers=lb_address, nats_servers=[nats_url], timeout=10.0)
    row = spark.range(1).selectExpr(*(f"{DIFFERING[kind][0]} as k{i}" for i, kind in enumerate(KINDS)))
    publish_dataframe(row, stream, settings=settings)
    (message,) = published(lb_address, stream)
    return message.value.decode()


@pytest.mark.parametrize("kind", KINDS)
def test_spark_writes_this_json_where_python_would_differ(kind: str, differing_json: str) -> None:
    _expr, spark_json, _python = DIFFERING[kind]
    value = spark_json.removeprefix('{"v":').removesuffix("}")
    # No value here holds a comma, so the row's fields are its text split at commas.
    fields = differing_json.removeprefix("{").removesuffix("}").split(",")
    assert len(fields) == len(KINDS), differing_json
    assert fields[KINDS.index(kind)] == f'"k{KINDS.index(kind)}":{value}', differing_json


@pytest.mark.parametrize("kind", sorted(DIFFERING))
def test_the_python_encoder_writes_this_json_where_spark_differs(
    kind: str,
    spark: SparkSession,
    lb_settings: ConnectionSettings,
    lb_address: str,
    make_stream: Callable[[int], str],
) -> None:
    expr, spark_json, python_json = DIFFERING[kind]
    (message,) = written(spark.range(1).selectExpr(f"{expr} as v"), lb_settings, lb_address, make_stream(1))
    assert message.value.decode() == python_json != spark_json


def test_timestamps_carry_microseconds_and_the_zone_offset(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    # 2024-01-02T03:04:05.123456Z as an instant; Spark writes it in the session's time zone.
    text = one_row_json(spark, lb_settings, lb_address, make_stream(1), "timestamp_micros(1704164645123456)")
    value = json.loads(text)["v"]
    assert value.split(".")[1][:6] == "123456"
    assert dt.datetime.fromisoformat(value) == dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


def test_the_python_encoder_writes_timestamps_in_utc_with_its_offset(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    df = spark.range(1).selectExpr("timestamp_micros(1704164645123456) as v")
    (message,) = written(df, lb_settings, lb_address, make_stream(1))
    assert message.value.decode() == '{"v":"2024-01-02T03:04:05.123456+00:00"}'


def test_null_fields_binary_dates_maps_and_nesting_are_written_alike_by_both(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(1)
    df = spark.range(1).selectExpr(
        "cast(null as string) as missing",
        "cast(null as double) as no_number",
        "named_struct('a', cast(null as int)) as inner_null",
        "unhex('00FF') as raw",
        "date'2024-01-02' as day",
        "map('a', 1) as tags",
        "named_struct('x', 1, 'y', array(1.5D, null)) as nested",  # 1.5D: a double (1.5 is a decimal)
    )
    publish_dataframe(df, stream, settings=lb_settings)
    (message,) = published(lb_address, stream)
    other = f"{stream}-python"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(other, other)
    (by_python,) = written(df, lb_settings, lb_address, other)
    assert (
        json.loads(message.value)
        == json.loads(by_python.value)
        == {
            "missing": None,
            "no_number": None,
            "inner_null": {"a": None},
            "raw": "AP8=",
            "day": "2024-01-02",
            "tags": {"a": 1},
            "nested": {"x": 1, "y": [1.5, None]},
        }
    )


def test_a_type_spark_cannot_write_as_documented_is_encoded_in_python(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    # to_json writes intervals as SQL literals; the Python encoder writes seconds.
    text = one_row_json(spark, lb_settings, lb_address, make_stream(1), "interval '90' second")
    assert json.loads(text) == {"v": 90.0}


def test_integer_and_null_keys_are_partitioned_in_the_jvm_as_the_go_client(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(3)
    rows = 500
    df = spark.range(rows, numPartitions=2).select(
        F.when(F.col("id") % 10 == 0, None).otherwise(F.col("id") * 7).alias("k"), F.col("id")
    )

    summary = publish_dataframe(df, stream, settings=lb_settings, key_field="k")

    messages = published(lb_address, stream, 3)
    assert summary.count == rows and len(messages) == rows
    seen: dict[int, Any] = {}
    for message in messages:
        body = json.loads(message.value)
        expected_key = None if body["id"] % 10 == 0 else str(body["id"] * 7).encode()
        assert message.key in (expected_key, b"" if expected_key is None else expected_key)
        assert message.partition == partition_for_key(expected_key, 3)
        seen[body["id"]] = body["k"]
    assert sorted(seen) == list(range(rows))


def test_column_names_with_dots_and_backticks_are_names(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(2)
    df = spark.range(1).selectExpr("'k1' as `key.col`", "1 as `odd``name`")

    publish_dataframe(df, stream, settings=lb_settings, key_field="key.col")

    (message,) = published(lb_address, stream, 2)
    assert (message.key, message.partition) == (b"k1", partition_for_key(b"k1", 2))
    assert json.loads(message.value) == {"key.col": "k1", "odd`name": 1}
