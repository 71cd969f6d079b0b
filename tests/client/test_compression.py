"""Payload compression (client/compression.py): values marked by a content-encoding header are
decompressed by this client's subscriptions; other readers get the stored bytes and the header."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient, Record, StopPosition
from airflow_provider_liftbridge.client.compression import (
    COMPRESSION_HEADER,
    check_compression,
    compress_record,
    compressor,
)
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from tests.raw_read import stored_messages

ROWS = [json.dumps({"id": i, "name": f"customer-{i}", "tags": ["a", "b", "c"] * 5}).encode() for i in range(20)]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_subscribers_get_the_original_records_back(lb_address: str, stream_name: str, codec: str) -> None:
    squeeze = compressor(codec)
    assert squeeze is not None
    records = [compress_record(Record(v, key=b"k", headers={"h": b"1"}), squeeze, codec) for v in ROWS]
    assert all(len(r.value) < len(v) for r, v in zip(records, ROWS, strict=True))
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, records)
        got = list(client.subscribe(stream_name, start_at=0, stop_at=StopPosition.LATEST))
    assert [m.value for m in got] == ROWS
    assert all(m.headers["h"] == b"1" and COMPRESSION_HEADER not in m.headers and m.key == b"k" for m in got)
    # A reader that knows nothing of compression (a raw gRPC stub) gets the stored bytes and the header.
    raw = stored_messages(lb_address, stream_name)
    assert raw[0].headers[COMPRESSION_HEADER] == codec.encode()
    restored = (
        gzip.decompress(raw[0].value) if codec == "gzip" else zstandard.ZstdDecompressor().decompress(raw[0].value)
    )
    assert restored == ROWS[0]


def test_an_unreadable_value_is_delivered_as_stored(lb_address: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(
            stream_name,
            [
                Record(b"not gzip", headers={COMPRESSION_HEADER: b"gzip"}),
                Record(b"x", headers={COMPRESSION_HEADER: b"br"}),
            ],
        )
        got = list(client.subscribe(stream_name, start_at=0, stop_at=StopPosition.LATEST))
    assert [(m.value, m.headers[COMPRESSION_HEADER]) for m in got] == [(b"not gzip", b"gzip"), (b"x", b"br")]


def test_compression_argument_is_checked() -> None:
    assert check_compression(None) is None and check_compression("none") is None
    assert check_compression("GZIP") == "gzip" and check_compression("zstd") == "zstd"
    with pytest.raises(InvalidArgumentError, match="'gzip', 'zstd' or None"):
        check_compression("lz4")


@pytest.mark.parametrize(("codec", "path"), [("gzip", "grpc"), ("zstd", "nats"), ("gzip", "nats")])
def test_publish_many_compresses_before_sending(
    lb_address: str, nats_url: str, stream_name: str, codec: str, path: str
) -> None:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        client.create_stream(stream_name, stream_name)
        acks = client.publish_many(
            stream_name, [Record(v, key=b"k") for v in ROWS[:5]] + ROWS[5:], path=path, compression=codec
        )
        assert len(acks) == len(ROWS)
        got = list(client.subscribe(stream_name, start_at=0, stop_at=StopPosition.LATEST))
    assert [m.value for m in got] == ROWS and [m.key for m in got[:5]] == [b"k"] * 5
    stored = stored_messages(lb_address, stream_name)[0]
    assert stored.headers[COMPRESSION_HEADER] == codec.encode() and len(stored.value) < len(ROWS[0])


def test_batch_publisher_measures_latencies_from_acks(lb_address: str, nats_url: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        client.create_stream(stream_name, stream_name)
        for path in ("nats", "grpc"):
            publisher = client.batch_publisher(
                stream_name, PublishOptions(path=path, compression="gzip"), write_stats=True
            )
            publisher.send_all(ROWS, batch=7)
            assert publisher.stats is not None
            summary = publisher.stats.summary()
            json.dumps(summary)
            assert summary["acks"] == len(ROWS) and 0 < summary["bytes"] < sum(map(len, ROWS))
            lead, com = summary["to_leader_ms"], summary["to_commit_ms"]
            assert 0 <= lead["p50"] <= lead["p99"] <= lead["max"] and lead["max"] <= com["max"] + 1.0
            assert summary["records_per_second"] > 0
        assert client.batch_publisher(stream_name).stats is None  # measured only when asked
