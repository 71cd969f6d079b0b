"""The dev server's own gRPC transport (grpcserver) as gRPC clients see it: statuses, deadlines, big messages,
flow control and many streams on one connection. Raw generated stubs over real HTTP/2."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc

from .helpers import TIMEOUT, create, publish, rpc_error, subscribe

Stub = api_pb2_grpc.APIStub


def test_unknown_method_is_unimplemented(channel: grpc.Channel) -> None:
    call = channel.unary_unary("/proto.API/NoSuchMethod", request_serializer=bytes, response_deserializer=bytes)
    err = rpc_error(call, b"", timeout=TIMEOUT)
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED


def test_status_message_with_non_ascii_and_percent_round_trips(stub: Stub) -> None:
    err = rpc_error(publish, stub, "naïve-100%-missing", b"x")
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert err.details() == "no such stream: naïve-100%-missing"


def test_server_honours_the_client_deadline_on_a_waiting_subscription(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    got = subscribe(stub, pb.SubscribeRequest(stream=stream_name), timeout=0.3)
    assert got.handshake and got.data == []
    assert got.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_large_messages_cross_frame_and_window_limits(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    big = bytes(range(256)) * 4096  # 1 MiB: many HTTP/2 frames each way
    for i in range(20):  # 20 MiB to read back: more than one flow-control window
        assert publish(stub, stream_name, big + bytes([i])).ack.offset == i
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    got = subscribe(stub, req, timeout=30)
    assert [m.value[-1] for m in got.data] == list(range(20))
    assert all(m.value[:-1] == big for m in got.data)
    assert got.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_many_streams_on_one_connection(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    results: dict[int, list[int]] = {}

    def read(i: int) -> None:
        req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST)
        results[i] = subscribe(stub, req, count=50, timeout=20).offsets

    threads = [threading.Thread(target=read, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()

    def requests() -> Iterator[pb.PublishRequest]:
        for i in range(50):
            yield pb.PublishRequest(stream=stream_name, value=b"v%d" % i, correlationId=str(i))

    responses = list(stub.PublishAsync(requests(), timeout=20))
    for t in threads:
        t.join(30)
    assert [r.correlationId for r in responses] == [str(i) for i in range(50)]
    assert results == {i: list(range(50)) for i in range(40)}


def test_cancelled_subscription_leaves_the_connection_usable(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    call = stub.Subscribe(pb.SubscribeRequest(stream=stream_name), timeout=TIMEOUT)
    assert next(call).ByteSize() == 0  # the handshake
    call.cancel()
    assert publish(stub, stream_name, b"after").ack.offset == 0
