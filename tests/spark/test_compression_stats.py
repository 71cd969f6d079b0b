"""Spark publishing with ``compression`` and its write statistics; the data source reads the rows back whole."""

from __future__ import annotations

import json
from collections.abc import Callable

import grpc
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc
from airflow_provider_liftbridge.spark import ConnectionSettings, SparkOptionError, publish_dataframe
from airflow_provider_liftbridge.spark.settings import to_options

pytestmark = pytest.mark.spark


def _read_until_stop(call: object) -> list[api_pb2.Message]:
    out: list[api_pb2.Message] = []
    try:
        out.extend(call)  # type: ignore[call-overload]
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # "Stop offset reached"
    return out


def test_compressed_rows_arrive_whole_with_write_statistics(
    spark: SparkSession, lb_settings: ConnectionSettings, lb_address: str, make_stream: Callable[[int], str]
) -> None:
    stream = make_stream(2)
    rows = 2000
    df = spark.range(rows, numPartitions=3).select(
        F.col("id").alias("order_id"), F.concat(F.lit("note for order "), F.col("id").cast("string")).alias("note")
    )
    summary = publish_dataframe(df, stream, settings=lb_settings, compression="gzip", window=128)
    stats = summary.to_dict()["write_stats"]
    json.dumps(stats)
    assert stats["acks"] == rows and stats["records_per_second"] > 0
    assert 0 <= stats["to_leader_ms"]["p50"] <= stats["to_leader_ms"]["max"]
    assert stats["to_commit_ms"]["p99"] <= stats["to_commit_ms"]["max"]
    back = spark.read.format("liftbridge").options(**to_options(lb_settings)).option("stream", stream).load()
    values = sorted(json.loads(r["value"])["order_id"] for r in back.select("value").collect())
    assert values == list(range(rows))
    # Stored compressed and marked: a raw gRPC reader (no decompression) sees the header.
    with grpc.insecure_channel(lb_address) as channel:
        req = api_pb2.SubscribeRequest(stream=stream, startPosition=api_pb2.OFFSET, stopPosition=api_pb2.STOP_OFFSET)
        call = api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=10)
        stored = [m for m in _read_until_stop(call) if m.ByteSize()]
    assert stored[0].headers["content-encoding"] == b"gzip" and not stored[0].value.startswith(b"{")
    with pytest.raises(SparkOptionError, match="'gzip', 'zstd' or None"):
        publish_dataframe(df, stream, settings=lb_settings, compression="lz4")
