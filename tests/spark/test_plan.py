"""Publish plans, record building, read bounds and settings: the Spark room's pure logic (no SparkSession)."""

from __future__ import annotations

import datetime as dt
import json
import pickle
import zlib
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from airflow_provider_liftbridge.client import AckPolicy, TlsConfig
from airflow_provider_liftbridge.spark import (
    ConnectionSettings,
    PublishPlan,
    SparkOptionError,
    from_options,
    to_options,
)
from airflow_provider_liftbridge.spark.plan import RecordBuilder, plan_from_options
from airflow_provider_liftbridge.spark.reading import ReadBounds, parse_time_ns

SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("payload", BinaryType()),
        StructField("p", IntegerType()),
        StructField("region", StringType()),
    ]
)


def test_defaults_follow_the_columns_given() -> None:
    assert PublishPlan("s").value_format == "json" and PublishPlan("s").partitioner == "round_robin"
    keyed = PublishPlan("s", key_field="id", value_col="payload")
    assert (keyed.value_format, keyed.partitioner) == ("bytes", "key")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"value_format": "avro"}, "value_format"),
        ({"value_format": "bytes"}, "value_col"),
        ({"value_format": "text"}, "value_col"),
        ({"value_format": "raw"}, "value_format='raw' is now value_format='bytes'"),
        ({"partitioner": "key"}, "key_field"),
        ({"options": {"window": 8}}, "options must be a PublishOptions"),
    ],
)
def test_bad_plans_name_the_option(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(SparkOptionError, match=words):
        PublishPlan("s", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"key_field": "missing"}, "key column 'missing' is not in the DataFrame"),
        ({"value_col": "p", "value_format": "bytes"}, "value column 'p' is int"),
        ({"partitioner": "region"}, "partition column 'region' is string"),
    ],
)
def test_schema_checks_name_the_column(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(SparkOptionError, match=words):
        PublishPlan("s", **kwargs).validate_schema(SCHEMA)  # type: ignore[arg-type]


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": ["a", "b", None],
            "payload": [b"\x00\x01", b"", None],
            "p": [2, 0, 1],
            "region": ["eu", None, "us"],
            "when": [dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)] * 3,
            "price": pa.array([Decimal("1.50"), None, Decimal("2")], type=pa.decimal128(5, 2)),
            "tags": pa.array([[("k", 1)], [], None], type=pa.map_(pa.string(), pa.int32())),
        }
    )


def test_key_partitioning_matches_the_go_formula() -> None:
    records, size = RecordBuilder(PublishPlan("s", key_field="id", value_col="payload", partitions=3)).build(_batch())
    assert [r.partition for r in records] == [zlib.crc32(b"a") % 3, zlib.crc32(b"b") % 3, 0]
    assert [r.key for r in records] == [b"a", b"b", None]
    assert [r.value for r in records] == [b"\x00\x01", b"", b""]
    assert size == 2 + 1 + 1


def test_round_robin_starts_at_the_seed_and_continues_across_batches() -> None:
    builder = RecordBuilder(PublishPlan("s", partitions=3), seed=4)
    first, _ = builder.build(_batch())
    second, _ = builder.build(_batch())
    assert [r.partition for r in [*first, *second]] == [1, 2, 0, 1, 2, 0]


def test_explicit_partition_column_and_headers() -> None:
    plan = PublishPlan("s", value_col="region", partitioner="p", header_cols=("id", "region"), partitions=3)
    records, _ = RecordBuilder(plan).build(_batch())
    assert [r.partition for r in records] == [2, 0, 1]
    assert [dict(r.headers or {}) for r in records] == [{"id": b"a", "region": b"eu"}, {"id": b"b"}, {"region": b"us"}]


def test_text_values_are_the_columns_string_form() -> None:
    plan = PublishPlan("s", value_col="p", value_format="text", partitions=3)
    plan.validate_schema(SCHEMA)  # any atomic column, where "bytes" takes binary or string only
    records, _ = RecordBuilder(plan).build(_batch())
    assert [r.value for r in records] == [b"2", b"0", b"1"]


def test_explicit_partition_out_of_range_is_refused() -> None:
    with pytest.raises(SparkOptionError, match=r"holds 2, but stream 's' has partitions 0\.\.1"):
        RecordBuilder(PublishPlan("s", partitioner="p", partitions=2)).build(_batch())


def test_json_rows_encode_spark_types() -> None:
    records, _ = RecordBuilder(PublishPlan("s", partitions=1)).build(_batch())
    first = json.loads(records[0].value)
    assert first == {
        "id": "a",
        "payload": "AAE=",
        "p": 2,
        "region": "eu",
        "when": "2024-01-02T03:04:05+00:00",
        "price": "1.50",
        "tags": {"k": 1},
    }
    assert json.loads(records[2].value)["tags"] is None


def test_data_source_write_options() -> None:
    plan = plan_from_options(
        {"STREAM": "s", "keycolumn": "id", "headerColumns": "a, b", "ackPolicy": "ALL", "window": "8"}
    )
    assert (plan.stream, plan.key_field, plan.header_cols, plan.ack_policy, plan.options.window) == (
        "s",
        "id",
        ("a", "b"),
        AckPolicy.ALL,
        8,
    )
    with pytest.raises(SparkOptionError, match="'stream'"):
        plan_from_options({"brokers": "h:1"})
    with pytest.raises(SparkOptionError, match="ackPolicy='most' is not valid: not an ack policy"):
        plan_from_options({"stream": "s", "ackPolicy": "most"})
    with pytest.raises(SparkOptionError, match="window='0' is not valid"):
        plan_from_options({"stream": "s", "window": "0"})
    with pytest.raises(SparkOptionError, match="publishTimeout='soon' is not valid"):
        plan_from_options({"stream": "s", "publishTimeout": "soon"})
    assert plan_from_options({"stream": "s"}).options.window == 256
    with pytest.raises(SparkOptionError, match="'partitioning' is now 'partitioner'"):
        plan_from_options({"stream": "s", "partitioning": "key"})


def test_settings_round_trip_through_options_and_pickle() -> None:
    settings = ConnectionSettings(
        "h1:1, h2:2",  # type: ignore[arg-type]  # a string of brokers is normalised to a tuple
        nats_servers=("nats://n:4222",),
        tls=TlsConfig(ca_file="/ca.pem"),
        ack_policy=AckPolicy.ALL,
        timeout=2.5,
        resubscribe_wait=4.0,
        keepalive_time=3.0,
        keepalive_timeout=7.5,
    )
    assert settings.brokers == ("h1:1", "h2:2")
    assert from_options(to_options(settings)) == settings
    assert pickle.loads(pickle.dumps(settings)) == settings
    with pytest.raises(SparkOptionError, match="brokers"):
        from_options({"stream": "s"})
    with pytest.raises(SparkOptionError, match="'timeout' must be a float"):
        from_options({"brokers": "h:1", "timeout": "soon"})
    with pytest.raises(SparkOptionError, match="timeout must be a positive"):
        from_options({"brokers": "h:1", "timeout": "0"})


def test_read_bounds_split_offset_ranges_up_to_the_high_watermark() -> None:
    bounds = ReadBounds.from_options({"startingOffset": "3", "endingOffset": "100", "maxRecordsPerSplit": "4"})
    ranges = [(s.start_offset, s.stop_offset) for s in bounds.splits(0, high_watermark=11)]
    assert ranges == [(3, 6), (7, 10), (11, 11)]
    assert ReadBounds().splits(0, high_watermark=-1) == []
    assert [(s.start_offset, s.stop_offset) for s in ReadBounds().splits(2, 5)] == [(0, 5)]


def test_read_bounds_reject_bad_values() -> None:
    with pytest.raises(SparkOptionError, match="'startingOffset' must be an integer"):
        ReadBounds.from_options({"startingOffset": "first"})
    with pytest.raises(SparkOptionError, match="'partitions'"):
        ReadBounds.from_options({"partitions": "0,x"})
    with pytest.raises(SparkOptionError, match="ISO-8601"):
        parse_time_ns("startingTimestamp", "yesterday")


def test_times_parse_as_epoch_nanoseconds() -> None:
    assert parse_time_ns("t", "1000") == 1_000_000_000
    assert parse_time_ns("t", "1970-01-01T00:00:01.5Z") == 1_500_000_000
    assert parse_time_ns("t", "1970-01-01T00:00:01") == 1_000_000_000


def test_nats_security_travels_to_executors_as_options_and_pickled() -> None:
    from airflow_provider_liftbridge.client import ConnectionSettings
    from airflow_provider_liftbridge.nats_security import NatsSecurity
    from airflow_provider_liftbridge.spark.settings import from_options, to_options

    security = NatsSecurity(tls=True, tls_ca_file="/ca.pem", user="u", password="pw-never-shown")
    settings = ConnectionSettings(brokers=("h:1",), nats_servers=("nats://h:4222",), nats_security=security)
    options = to_options(settings)
    assert options["natsPassword"] == "pw-never-shown" and options["natsTls"] == "true"  # Spark redacts *password*
    assert from_options(options).nats_security == security
    assert pickle.loads(pickle.dumps(settings)).nats_security == security
    assert "pw-never-shown" not in repr(settings)


def test_the_submit_job_reads_nats_security_with_secrets_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow_provider_liftbridge.nats_security import NatsSecurity, NatsSecurityError
    from airflow_provider_liftbridge.spark.submit import build_parser, nats_security_of

    parser = build_parser()
    base = ["--stream", "s", "--brokers", "h:1", "--input", "x"]
    assert nats_security_of(parser.parse_args(base)) is None
    monkeypatch.setenv("LIFTBRIDGE_NATS_PASSWORD", "pw-from-env")
    args = parser.parse_args([*base, "--nats-user", "u", "--nats-tls-ca-file", "/ca.pem"])
    assert nats_security_of(args) == NatsSecurity(user="u", password="pw-from-env", tls_ca_file="/ca.pem")
    monkeypatch.setenv("LIFTBRIDGE_NATS_TOKEN", "t")
    with pytest.raises(NatsSecurityError, match="one form of authentication"):
        nats_security_of(args)


def test_arrow_batches_are_joined_into_groups_by_rows_or_bytes_in_order() -> None:
    from airflow_provider_liftbridge.spark.publish import _groups

    batches = [pa.record_batch({"n": pa.array(range(i * 3, i * 3 + 3))}) for i in range(5)]
    empty = batches[0].slice(0, 0)

    by_rows = list(_groups([batches[0], empty, *batches[1:]], rows=6))
    by_bytes = list(_groups(batches, rows=100, size=batches[0].nbytes))

    assert [g.num_rows for g in by_rows] == [6, 6, 3]
    assert [n for g in by_rows for n in g.column(0).to_pylist()] == list(range(15))
    assert [g.num_rows for g in by_bytes] == [3] * 5
