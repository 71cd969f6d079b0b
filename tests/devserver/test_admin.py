"""CreateStream / DeleteStream / PauseStream / SetStreamReadonly: results and status codes of the semantics table."""

from __future__ import annotations

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc

from .helpers import TIMEOUT, create, partition_meta, publish, rpc_error

Stub = api_pb2_grpc.APIStub


def test_create_existing_name_is_already_exists_even_with_another_subject(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    for subject in (stream_name, stream_name + ".other"):
        err = rpc_error(create, stub, stream_name, subject=subject)
        assert err.code() == grpc.StatusCode.ALREADY_EXISTS
        assert err.details() == "stream already exists"


def test_create_invalid_arguments(stub: Stub, stream_name: str) -> None:
    cases = [
        (dict(name="", subject="x"), "Name cannot be empty"),
        (dict(name=stream_name, subject=""), "Subject is invalid"),
        (dict(name=stream_name, subject="a..b"), "Subject is invalid"),
        (dict(name=stream_name, subject="has space"), "Subject is invalid"),
        (dict(name=stream_name, subject="s", replicationFactor=3), "Invalid replicationFactor 3, cluster size 1"),
        (dict(name="__cursors", subject="s"), "Stream is reserved"),
    ]
    for fields, message in cases:
        err = rpc_error(stub.CreateStream, pb.CreateStreamRequest(**fields), timeout=TIMEOUT)
        assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message), fields


def test_zero_partitions_means_one_and_replication_factor_minus_one_is_all_brokers(
    stub: Stub, stream_name: str
) -> None:
    create(stub, stream_name, partitions=0, replicationFactor=-1)
    meta = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
    partitions = meta.streamMetadata[0].partitions
    assert list(partitions) == [0]
    assert list(partitions[0].replicas) == [b.id for b in meta.brokers]


def test_delete_missing_stream_and_second_delete_are_not_found(stub: Stub, stream_name: str) -> None:
    err = rpc_error(stub.DeleteStream, pb.DeleteStreamRequest(name=stream_name), timeout=TIMEOUT)
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "stream does not exist")
    create(stub, stream_name)
    stub.DeleteStream(pb.DeleteStreamRequest(name=stream_name), timeout=TIMEOUT)
    err = rpc_error(stub.DeleteStream, pb.DeleteStreamRequest(name=stream_name), timeout=TIMEOUT)
    assert err.code() == grpc.StatusCode.NOT_FOUND


def test_delete_reserved_stream_is_invalid(stub: Stub) -> None:
    err = rpc_error(stub.DeleteStream, pb.DeleteStreamRequest(name="__cursors"), timeout=TIMEOUT)
    assert (err.code(), err.details()) == (grpc.StatusCode.INVALID_ARGUMENT, "Stream is reserved")


def test_recreated_stream_starts_empty(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    for i in range(3):
        publish(stub, stream_name, b"%d" % i)
    assert partition_meta(stub, stream_name).newestOffset == 2
    stub.DeleteStream(pb.DeleteStreamRequest(name=stream_name), timeout=TIMEOUT)
    create(stub, stream_name)
    meta = partition_meta(stub, stream_name)
    assert (meta.highWatermark, meta.newestOffset) == (-1, -1)


def test_pause_and_readonly_of_missing_stream_or_partition_are_not_found(stub: Stub, stream_name: str) -> None:
    for req in (pb.PauseStreamRequest(name=stream_name), pb.PauseStreamRequest(name=stream_name, partitions=[0])):
        assert rpc_error(stub.PauseStream, req, timeout=TIMEOUT).code() == grpc.StatusCode.NOT_FOUND
    for ro in (
        pb.SetStreamReadonlyRequest(name=stream_name),
        pb.SetStreamReadonlyRequest(name=stream_name, partitions=[0]),
    ):
        assert rpc_error(stub.SetStreamReadonly, ro, timeout=TIMEOUT).code() == grpc.StatusCode.NOT_FOUND
    create(stub, stream_name)
    err = rpc_error(stub.PauseStream, pb.PauseStreamRequest(name=stream_name, partitions=[5]), timeout=TIMEOUT)
    assert err.code() == grpc.StatusCode.NOT_FOUND
    ro = pb.SetStreamReadonlyRequest(name=stream_name, partitions=[5], readonly=True)
    assert rpc_error(stub.SetStreamReadonly, ro, timeout=TIMEOUT).code() == grpc.StatusCode.NOT_FOUND
