"""Flow control, backpressure and call lifecycle of the dev server's ``h2`` gRPC transport, seen from grpcio.

Every test uses real grpcio clients (sync and grpc.aio) against a dev server of its own module,
so the transport statistics (:meth:`DevServer.grpc_stats`) count only this module's calls.
ADR 4 tells why these exist: an earlier transport overran grpc-core's flow-control window on a
slow reader; ADR 5 is the ``h2`` transport they guard.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator

import grpc
import pytest
from grpc import aio

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.devserver.grpc_h2 import MAX_MESSAGE, TransportStats
from tests import margins

BACKLOG = 100_000
#: grpc-core channel arguments for a small, fixed receive window: no BDP probing (which grows the
#: window), 8 KiB lookahead (advertised as SETTINGS_INITIAL_WINDOW_SIZE 8192, an eighth of HTTP/2's default).
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 8192)]


@pytest.fixture(scope="module")
def server() -> Iterator[DevServer]:
    srv = DevServer(grpc_transport="h2")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def backlog(server: DevServer) -> str:
    """A stream holding ``BACKLOG`` 100-byte messages (value = offset as text, zero-padded)."""
    name = "flow-backlog"
    with LiftbridgeClient(server.address, nats_servers=[server.nats_url]) as client:
        client.create_stream(name, name)
        client.publish_many(name, [str(i).zfill(100).encode() for i in range(BACKLOG)], window=4096)
    return name


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    margins.wait_until(predicate, timeout, what, interval=0.02)


def _stats(server: DevServer) -> TransportStats:
    stats = server.grpc_stats()
    assert stats is not None, "the h2 transport keeps statistics"
    return stats


def _subscribe_all(stream: str) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)


def test_slow_reader_with_a_small_window_gets_the_whole_backlog_in_order(server: DevServer, backlog: str) -> None:
    offsets: list[int] = []
    values_ok = True
    with grpc.insecure_channel(server.address, options=SMALL_WINDOW) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(_subscribe_all(backlog), timeout=120)
        with pytest.raises(grpc.RpcError) as end:
            for msg in call:
                if not msg.value:
                    continue  # the handshake
                offsets.append(msg.offset)
                values_ok &= int(msg.value) == msg.offset
                if len(offsets) % 25_000 == 1:
                    time.sleep(0.3)  # the server's sends pile up against an 8 KiB window
                    assert _stats(server).buffered_bytes < 2 << 20
    assert end.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, end.value.details()
    assert offsets == list(range(BACKLOG))
    assert values_ok


def test_a_client_that_never_reads_does_not_make_the_server_buffer_without_bound(
    server: DevServer, backlog: str
) -> None:
    backlog_bytes = BACKLOG * 130
    with grpc.insecure_channel(server.address, options=SMALL_WINDOW) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(_subscribe_all(backlog), timeout=60)
        first = next(call)  # the handshake: the call is running; from now on nothing is read
        assert first.ByteSize() == 0
        samples = []
        for _ in range(5):
            time.sleep(0.1)
            samples.append(_stats(server).buffered_bytes)
        # Queued for flow control plus the socket buffer: a bounded amount, far below the backlog.
        assert max(samples) < 2 << 20 < backlog_bytes, samples
        assert samples[-1] == samples[-2], f"the server kept queueing for a reader that reads nothing: {samples}"
        # Reading resumes the stream where it stopped.
        assert [next(call).offset for _ in range(3)] == [0, 1, 2]
        call.cancel()
    _wait_for(lambda: _stats(server).active_calls == 0, "the cancelled call to end")


def test_cancelling_mid_stream_frees_the_handler(server: DevServer, backlog: str) -> None:
    with grpc.insecure_channel(server.address) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(_subscribe_all(backlog), timeout=60)
        got = [m.offset for _, m in zip(range(1001), call, strict=False)][1:]
        assert got == list(range(1000))
        assert _stats(server).active_calls == 1
        call.cancel()
        _wait_for(lambda: _stats(server).active_calls == 0, "the server to drop the cancelled Subscribe")
        assert _stats(server).buffered_bytes == 0


def test_deadline_exceeded_ends_a_waiting_subscription_on_the_server(server: DevServer) -> None:
    name = "flow-deadline"
    with grpc.insecure_channel(server.address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), timeout=5)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Subscribe(pb.SubscribeRequest(stream=name), timeout=0.5):
                pass
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - start < 3.0
        _wait_for(lambda: _stats(server).active_calls == 0, "the server to end the expired call")


def test_the_server_reports_deadline_exceeded_in_its_own_status(server: DevServer) -> None:
    """The grpc-timeout header reaches the handler: the server's status, not just the client's timer."""
    name = "flow-deadline-server"

    async def run() -> tuple[grpc.StatusCode, str]:
        async with aio.insecure_channel(server.address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), timeout=5)
            # A PublishToSubject to a subject no stream listens on waits for an ack until the deadline.
            call = stub.PublishToSubject(
                pb.PublishToSubjectRequest(subject="flow.nobody.listens", value=b"x", ackPolicy=pb.LEADER), timeout=0.3
            )
            with pytest.raises(aio.AioRpcError) as info:
                await call
            return info.value.code(), info.value.details() or ""

    code, _details = asyncio.run(run())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait_for(lambda: _stats(server).active_calls == 0, "the server to end the expired call")


def test_oversized_request_is_refused_with_resource_exhausted(server: DevServer) -> None:
    name = "flow-oversized"
    with grpc.insecure_channel(server.address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), timeout=5)
        with pytest.raises(grpc.RpcError) as info:
            stub.Publish(pb.PublishRequest(stream=name, value=b"x" * (MAX_MESSAGE + 1)), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (info.value.details() or "")
        # The connection is still good, and nothing was stored.
        meta = stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=name), timeout=5).metadata
        assert meta.newestOffset == -1
    _wait_for(lambda: _stats(server).active_calls == 0, "the refused call to end")


def test_unknown_method_and_service_are_unimplemented(server: DevServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        for path in ("/proto.API/NoSuchMethod", "/other.Service/Publish"):
            call = channel.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            with pytest.raises(grpc.RpcError) as info:
                call(b"", timeout=5)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, path
            assert path in (info.value.details() or "")


def test_error_details_keep_non_ascii_and_percent_signs(server: DevServer) -> None:
    """grpc-message is percent-encoded on the wire and decoded by the client back to the same text."""
    name = "no-such-strëam-100%"
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            api_pb2_grpc.APIStub(channel).Publish(pb.PublishRequest(stream=name, value=b"x"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == f"no such stream: {name}"


def test_one_thousand_subscriptions_on_one_channel_all_get_the_message(server: DevServer) -> None:
    name = "flow-many"
    count = 1000

    async def run() -> list[list[int]]:
        async with aio.insecure_channel(server.address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), timeout=5)
            calls = [stub.Subscribe(pb.SubscribeRequest(stream=name), timeout=30) for _ in range(count)]
            for call in calls:
                assert (await call.read()).ByteSize() == 0  # every subscription is open
            await stub.Publish(pb.PublishRequest(stream=name, value=b"wake"), timeout=5)
            got = await asyncio.gather(*(c.read() for c in calls))
            for call in calls:
                call.cancel()
            return [[m.offset] for m in got if m.value == b"wake"]

    got = asyncio.run(run())
    assert got == [[0]] * count
    _wait_for(lambda: _stats(server).active_calls == 0, "the cancelled subscriptions to end", timeout=10)


def test_publish_async_bidi_stream_over_grpc_aio(server: DevServer) -> None:
    name = "flow-bidi"
    n = 2000

    async def run() -> list[pb.PublishResponse]:
        async with aio.insecure_channel(server.address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            await stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), timeout=5)

            async def requests() -> AsyncIterator[pb.PublishRequest]:
                for i in range(n):
                    yield pb.PublishRequest(stream=name, value=b"v%d" % i, correlationId=str(i))
                yield pb.PublishRequest(stream="flow-missing", value=b"x", correlationId="bad")

            return [r async for r in stub.PublishAsync(requests(), timeout=30)]

    responses = asyncio.run(run())
    assert len(responses) == n + 1
    # The refusal is answered at once, the acks once their batch is written: compare by correlation id.
    by_cid = {r.correlationId: r for r in responses}
    assert [by_cid[str(i)].ack.offset for i in range(n)] == list(range(n))
    assert by_cid["bad"].asyncError.code == pb.PublishAsyncError.NOT_FOUND


def test_server_streaming_over_grpc_aio_with_a_small_window(server: DevServer, backlog: str) -> None:
    async def run() -> list[int]:
        async with aio.insecure_channel(server.address, options=SMALL_WINDOW) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            req = pb.SubscribeRequest(
                stream=backlog, startPosition=pb.OFFSET, startOffset=500, stopPosition=pb.STOP_OFFSET, stopOffset=20_499
            )
            call = stub.Subscribe(req, timeout=30)
            offsets = []
            with pytest.raises(aio.AioRpcError) as end:
                async for msg in call:
                    if msg.value:
                        offsets.append(msg.offset)
            assert end.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            return offsets

    assert asyncio.run(run()) == list(range(500, 20_500))


def test_stopping_the_server_ends_running_calls(tmp_path: object) -> None:
    srv = DevServer(grpc_transport="h2")
    srv.start()
    try:
        with grpc.insecure_channel(srv.address) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            stub.CreateStream(pb.CreateStreamRequest(name="s", subject="s"), timeout=5)
            call = stub.Subscribe(pb.SubscribeRequest(stream="s"), timeout=30)
            assert next(call).ByteSize() == 0
            ended: list[grpc.StatusCode] = []

            def read() -> None:
                try:
                    for _ in call:
                        pass
                except grpc.RpcError as err:
                    ended.append(err.code())

            reader = threading.Thread(target=read)
            reader.start()
            srv.stop()
            reader.join(5)
            assert ended == [grpc.StatusCode.UNAVAILABLE]
    finally:
        srv.stop()


def test_messages_larger_than_every_window_go_both_ways(server: DevServer) -> None:
    """3 MiB requests and responses: larger than the server's 1 MiB stream window (requests) and the
    client's 8 KiB window (responses), so both sides must hand window back mid-message."""
    name = "flow-large"
    big = [bytes([65 + i]) * (3 << 20) for i in range(3)]
    options = [*SMALL_WINDOW, ("grpc.max_receive_message_length", 16 << 20)]
    with grpc.insecure_channel(server.address, options=options) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(pb.CreateStreamRequest(name=name, subject=name), timeout=5)
        assert stub.Publish(pb.PublishRequest(stream=name, value=big[0]), timeout=30).ack.offset == 0
        reqs = iter([pb.PublishRequest(stream=name, value=v, correlationId=str(i)) for i, v in enumerate(big[1:])])
        acks = {r.correlationId: r.ack.offset for r in stub.PublishAsync(reqs, timeout=30)}
        assert acks == {"0": 1, "1": 2}
        req = pb.SubscribeRequest(stream=name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
        values = []
        with pytest.raises(grpc.RpcError) as end:
            for msg in stub.Subscribe(req, timeout=30):
                if msg.value:
                    values.append(msg.value)
        assert end.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert values == big
