"""FetchMetadata, FetchPartitionMetadata and cursors."""

from __future__ import annotations

import time

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import DevServer

from .helpers import TIMEOUT, create, partition_meta, publish, rpc_error

Stub = api_pb2_grpc.APIStub


def test_partition_metadata_empty_then_after_three(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    meta = partition_meta(stub, stream_name)
    assert (meta.highWatermark, meta.newestOffset) == (-1, -1)
    assert meta.messagesReceivedTimestamps.firstTimestamp == 0
    acks = [publish(stub, stream_name, b"%d" % i).ack for i in range(3)]
    meta = partition_meta(stub, stream_name)
    assert (meta.id, meta.highWatermark, meta.newestOffset) == (0, 2, 2)
    assert meta.leader == "broker-0" and list(meta.replicas) == ["broker-0"] and list(meta.isr) == ["broker-0"]
    assert (meta.paused, meta.readonly) == (False, False)
    assert meta.messagesReceivedTimestamps.firstTimestamp == acks[0].receptionTimestamp
    assert meta.messagesReceivedTimestamps.latestTimestamp == acks[2].receptionTimestamp


def test_partition_metadata_errors(stub: Stub, stream_name: str) -> None:
    err = rpc_error(partition_meta, stub, stream_name)
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "partition not found")
    create(stub, stream_name)
    assert rpc_error(partition_meta, stub, stream_name, 1).code() == grpc.StatusCode.NOT_FOUND
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT)
    err = rpc_error(partition_meta, stub, stream_name)
    assert (err.code(), err.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "The request should be sent to partition leader",
    )


def test_readonly_flag_and_timestamps(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    before = time.time_ns()
    stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=stream_name, readonly=True), timeout=TIMEOUT)
    meta = partition_meta(stub, stream_name)
    assert meta.readonly is True and meta.readonlyTimestamps.latestTimestamp >= before


def test_fetch_metadata_lists_brokers_and_streams(devserver: DevServer, stub: Stub, stream_name: str) -> None:
    before = time.time_ns()
    create(stub, stream_name, partitions=3)
    publish(stub, stream_name, b"v", partition=2)
    meta = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name, "missing-" + stream_name]), timeout=TIMEOUT)
    (broker,) = meta.brokers
    host, port = devserver.address.rsplit(":", 1)
    assert (broker.id, broker.host, broker.port) == ("broker-0", host, int(port))
    assert broker.partitionCount >= 3 and broker.leaderCount >= 3
    sm, missing = meta.streamMetadata
    assert (sm.name, sm.subject, sm.error) == (stream_name, stream_name, pb.StreamMetadata.OK)
    assert before <= sm.creationTimestamp <= time.time_ns()
    assert sorted(sm.partitions) == [0, 1, 2]
    assert sm.partitions[2].newestOffset == 0 and sm.partitions[1].newestOffset == -1
    assert sm.partitions[2].leader == "broker-0"
    assert (missing.name, missing.error, len(missing.partitions)) == (
        "missing-" + stream_name,
        pb.StreamMetadata.UNKNOWN_STREAM,
        0,
    )
    everything = stub.FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT)
    assert stream_name in {s.name for s in everything.streamMetadata}


def test_cursors(stub: Stub, stream_name: str) -> None:
    fetch = pb.FetchCursorRequest(stream=stream_name, partition=1, cursorId="c")
    assert stub.FetchCursor(fetch, timeout=TIMEOUT).offset == -1  # never set; stream need not exist
    stub.SetCursor(pb.SetCursorRequest(stream=stream_name, partition=1, cursorId="c", offset=41), timeout=TIMEOUT)
    assert stub.FetchCursor(fetch, timeout=TIMEOUT).offset == 41
    other = pb.FetchCursorRequest(stream=stream_name, partition=0, cursorId="c")
    assert stub.FetchCursor(other, timeout=TIMEOUT).offset == -1  # identified by (id, stream, partition)
    for bad in (pb.SetCursorRequest(stream="", cursorId="c"), pb.SetCursorRequest(stream="s", cursorId="")):
        assert rpc_error(stub.SetCursor, bad, timeout=TIMEOUT).code() == grpc.StatusCode.INVALID_ARGUMENT
    for bad_f in (pb.FetchCursorRequest(stream="", cursorId="c"), pb.FetchCursorRequest(stream="s", cursorId="")):
        assert rpc_error(stub.FetchCursor, bad_f, timeout=TIMEOUT).code() == grpc.StatusCode.INVALID_ARGUMENT
