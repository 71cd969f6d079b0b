"""The ``h2`` gRPC transport on its own: a small echo service, grpc.aio clients, and a raw HTTP/2 client.

The raw client (the ``h2`` library on a plain socket) sends what grpcio never would — a wrong
content type, garbage, PINGs — and reads frames as they arrive, to check what the server puts on
the wire: coalesced DATA frames, trailers, GOAWAY.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import h2.connection
import h2.errors
import h2.events
import pytest
from grpc import aio

from airflow_provider_liftbridge.devserver.grpc_h2 import H2GrpcServer, H2ServicerContext, method_table

_PREFIX = struct.Struct(">BI")


class Echo:
    """Test handlers; bytes in, bytes out (no protobuf)."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}
        self.cancelled = asyncio.Event()

    async def unary(self, req: bytes, ctx: H2ServicerContext) -> bytes:
        self.seen = {"metadata": ctx.invocation_metadata(), "peer": ctx.peer(), "remaining": ctx.time_remaining()}
        if req == b"abort":
            await ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "asked to abort: 100% ✓")
        if req == b"raise":
            raise ValueError("boom")
        return req.upper()

    async def count(self, req: bytes, ctx: H2ServicerContext) -> AsyncIterator[bytes]:
        for i in range(int(req)):
            yield b"%d" % i

    async def forever(self, req: bytes, ctx: H2ServicerContext) -> AsyncIterator[bytes]:
        try:
            yield b"started"
            await asyncio.sleep(3600)
        finally:
            self.cancelled.set()

    async def echo_stream(self, reqs: AsyncIterator[bytes], ctx: H2ServicerContext) -> AsyncIterator[bytes]:
        async for req in reqs:
            yield req[::-1]

    async def sink(self, reqs: AsyncIterator[bytes], ctx: H2ServicerContext) -> AsyncIterator[bytes]:
        yield b"ready"  # and never reads a request
        await asyncio.sleep(3600)

    def methods(self) -> dict[str, grpc.RpcMethodHandler]:
        return method_table(
            "test.Echo",
            {
                "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
                "Count": grpc.unary_stream_rpc_method_handler(self.count),
                "Forever": grpc.unary_stream_rpc_method_handler(self.forever),
                "Stream": grpc.stream_stream_rpc_method_handler(self.echo_stream),
                "Sink": grpc.stream_stream_rpc_method_handler(self.sink),
            },
        )


@pytest.fixture
async def echo() -> AsyncIterator[tuple[Echo, H2GrpcServer, str]]:
    service = Echo()
    server = H2GrpcServer(service.methods())
    port = await server.start("127.0.0.1", 0)
    try:
        yield service, server, f"127.0.0.1:{port}"
    finally:
        await server.stop()


def _method(channel: aio.Channel, kind: str, name: str) -> Any:
    factory = getattr(channel, kind)
    return factory(f"/test.Echo/{name}", request_serializer=None, response_deserializer=None)


async def test_unary_call_sees_metadata_peer_and_deadline(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    service, _server, address = echo
    async with aio.insecure_channel(address) as channel:
        reply = await _method(channel, "unary_unary", "Unary")(
            b"hello", metadata=(("x-team", "data"), ("x-blob-bin", b"\x00\xff")), timeout=5
        )
    assert reply == b"HELLO"
    meta = dict(service.seen["metadata"])
    assert meta["x-team"] == "data" and meta["x-blob-bin"] == b"\x00\xff"
    assert service.seen["peer"].startswith("ipv4:127.0.0.1:")
    # grpc-core rounds the grpc-timeout header up to its unit's precision, so a hair above 5 s is
    # still the deadline the client set; what matters is that it arrived and is about 5 s.
    assert 2 < service.seen["remaining"] <= 5.1


async def test_abort_and_handler_errors_become_statuses(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    _service, _server, address = echo
    async with aio.insecure_channel(address) as channel:
        unary = _method(channel, "unary_unary", "Unary")
        with pytest.raises(aio.AioRpcError) as info:
            await unary(b"abort", timeout=5)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert info.value.details() == "asked to abort: 100% ✓"
        with pytest.raises(aio.AioRpcError) as info:
            await unary(b"raise", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNKNOWN
        assert "boom" in (info.value.details() or "")
        assert await unary(b"still fine", timeout=5) == b"STILL FINE"


async def test_server_and_bidi_streams(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    _service, _server, address = echo
    async with aio.insecure_channel(address) as channel:
        got = [m async for m in _method(channel, "unary_stream", "Count")(b"5000", timeout=10)]
        assert got == [b"%d" % i for i in range(5000)]

        async def requests() -> AsyncIterator[bytes]:
            for i in range(300):
                yield b"abc%d" % i

        replies = [m async for m in _method(channel, "stream_stream", "Stream")(requests(), timeout=10)]
        assert replies == [(b"abc%d" % i)[::-1] for i in range(300)]


async def test_client_cancel_cancels_the_handler(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    service, server, address = echo
    async with aio.insecure_channel(address) as channel:
        call = _method(channel, "unary_stream", "Forever")(b"", timeout=30)
        assert await call.read() == b"started"
        assert server.stats().active_calls == 1
        call.cancel()
        await asyncio.wait_for(service.cancelled.wait(), 5)
    for _ in range(100):
        if server.stats().active_calls == 0:
            break
        await asyncio.sleep(0.01)
    assert server.stats().active_calls == 0


async def test_deadline_cancels_the_handler_and_reports_deadline_exceeded(
    echo: tuple[Echo, H2GrpcServer, str],
) -> None:
    service, _server, address = echo
    async with aio.insecure_channel(address) as channel:
        call = _method(channel, "unary_stream", "Forever")(b"", timeout=0.3)
        with pytest.raises(aio.AioRpcError) as info:
            async for _ in call:
                pass
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(service.cancelled.wait(), 5)


async def test_stop_with_grace_lets_running_calls_finish(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    service, server, address = echo
    async with aio.insecure_channel(address) as channel:
        call = _method(channel, "unary_stream", "Forever")(b"", timeout=30)
        assert await call.read() == b"started"
        await server.stop(grace=0.2)  # the call does not finish by itself: cancelled after the grace
        with pytest.raises(aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert service.cancelled.is_set()


# -- raw HTTP/2 -------------------------------------------------------------------------------


class RawClient:
    """An HTTP/2 client on a blocking socket, frame events as they come (test-only)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.h2 = h2.connection.H2Connection()
        self.h2.initiate_connection()
        self.sock.sendall(self.h2.data_to_send())

    def open(self, path: str, *, content_type: bytes = b"application/grpc") -> int:
        """Send the request headers of a new stream (no body yet)."""
        sid = self.h2.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"test"),
            (b"content-type", content_type),
            (b"te", b"trailers"),
        ]
        self.h2.send_headers(sid, headers)
        self.sock.sendall(self.h2.data_to_send())
        return sid

    def request(self, path: str, body: bytes, *, content_type: bytes = b"application/grpc") -> int:
        """A whole unary request: headers, one message, END_STREAM."""
        sid = self.open(path, content_type=content_type)
        self.h2.send_data(sid, _PREFIX.pack(0, len(body)) + body, end_stream=True)
        self.sock.sendall(self.h2.data_to_send())
        return sid

    def send_until_blocked(self, sid: int, data: bytes, expected: int, quiet: float = 0.05) -> int:
        """Send ``data`` on ``sid`` as far as the server's windows allow; stop once they stay shut
        for ``quiet`` seconds after ``expected`` bytes went out (for 2 s before). Returns the bytes sent."""
        sent = 0
        try:
            while sent < len(data):
                size = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(data) - sent)
                if size > 0:
                    self.h2.send_data(sid, data[sent : sent + size])
                    self.sock.sendall(self.h2.data_to_send())
                    sent += size
                    continue
                # A loaded machine may answer late: be patient until the bytes we expect got through.
                self.sock.settimeout(quiet if sent >= expected else 2.0)
                try:
                    chunk = self.sock.recv(1 << 20)
                except TimeoutError:
                    return sent
                if not chunk:
                    return sent
                self.h2.receive_data(chunk)
                self.sock.sendall(self.h2.data_to_send())
            return sent
        finally:
            self.sock.settimeout(5)

    def events(self) -> Iterator[h2.events.Event]:
        while True:
            # Send what the caller's handling of the last events queued (the WINDOW_UPDATEs of
            # acknowledge_received_data) before blocking: a server that has filled the window waits
            # for them, and would wait for ever if they sat here until more data came in.
            out = self.h2.data_to_send()
            if out:
                self.sock.sendall(out)
            data = self.sock.recv(1 << 20)
            if not data:
                return
            yield from self.h2.receive_data(data)

    def close(self) -> None:
        self.sock.close()


def _response(client: RawClient, sid: int) -> tuple[list[bytes], dict[bytes, bytes], int]:
    """Headers+trailers, DATA payloads of stream ``sid`` and how many DATA frames carried them."""
    chunks: list[bytes] = []
    headers: dict[bytes, bytes] = {}
    for ev in client.events():
        if isinstance(ev, h2.events.ResponseReceived | h2.events.TrailersReceived) and ev.stream_id == sid:
            headers.update(dict(ev.headers or []))
        elif isinstance(ev, h2.events.DataReceived) and ev.stream_id == sid:
            chunks.append(ev.data)
            client.h2.acknowledge_received_data(ev.flow_controlled_length, sid)
        elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
            break
    return chunks, headers, len(chunks)


def _messages(chunks: list[bytes]) -> list[bytes]:
    data, out, pos = b"".join(chunks), [], 0
    while pos < len(data):
        _flag, size = _PREFIX.unpack_from(data, pos)
        out.append(data[pos + 5 : pos + 5 + size])
        pos += 5 + size
    return out


async def test_streamed_responses_are_coalesced_into_few_data_frames(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    _service, _server, address = echo

    def run() -> tuple[list[bytes], dict[bytes, bytes], int]:
        client = RawClient(address)
        try:
            sid = client.request("/test.Echo/Count", b"2000")
            chunks, headers, frames = _response(client, sid)
            return _messages(chunks), headers, frames
        finally:
            client.close()

    messages, headers, frames = await asyncio.to_thread(run)
    assert messages == [b"%d" % i for i in range(2000)]
    assert headers[b"grpc-status"] == b"0"
    assert frames <= 10, f"2,000 messages took {frames} DATA frames"


async def test_non_grpc_content_type_gets_http_415_and_garbage_does_not_hurt_the_server(
    echo: tuple[Echo, H2GrpcServer, str],
) -> None:
    _service, server, address = echo

    def run() -> dict[bytes, bytes]:
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # not HTTP/2: the server sends GOAWAY and closes
            sock.settimeout(5)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        assert received, "expected the server's SETTINGS and GOAWAY before it closed"
        client = RawClient(address)
        try:
            sid = client.request("/test.Echo/Unary", b"x", content_type=b"text/plain")
            _chunks, headers, _ = _response(client, sid)
            return headers
        finally:
            client.close()

    headers = await asyncio.to_thread(run)
    assert headers[b":status"] == b"415"
    async with aio.insecure_channel(address) as channel:
        assert await _method(channel, "unary_unary", "Unary")(b"ok", timeout=5) == b"OK"
        assert server.stats().connections == 1  # this channel's; the bad ones are gone


async def test_ping_is_acknowledged(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    _service, _server, address = echo

    def run() -> bytes:
        client = RawClient(address)
        try:
            client.h2.ping(b"12345678")
            client.sock.sendall(client.h2.data_to_send())
            for ev in client.events():
                if isinstance(ev, h2.events.PingAckReceived):
                    return bytes(ev.ping_data)
            raise AssertionError("connection closed without a PING ack")
        finally:
            client.close()

    assert await asyncio.to_thread(run) == b"12345678"


_ANSWERS = (h2.events.PingAckReceived, h2.events.ConnectionTerminated)


def _ping(client: RawClient, data: bytes, *, to_the_end: bool = False) -> list[h2.events.Event]:
    """Send a PING; the server's answers (its ack, a GOAWAY) up to the ack, or with ``to_the_end``
    up to the connection's end."""
    client.h2.ping(data)
    client.sock.sendall(client.h2.data_to_send())
    answers: list[h2.events.Event] = []
    while chunk := client.sock.recv(1 << 20):
        answers += [ev for ev in client.h2.receive_data(chunk) if isinstance(ev, _ANSWERS)]
        if answers and not to_the_end:
            break
    return answers


async def test_pings_are_policed_as_grpc_go_polices_them(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    """With a call open and nothing written, the first PING is free, the next two are strikes and the
    fourth ends the connection with GOAWAY ENHANCE_YOUR_CALM ``too_many_pings``; a response written
    in between clears the strikes (grpc-go's keepalive enforcement with its default policy)."""
    _service, _server, address = echo

    def run() -> tuple[list[list[str]], list[h2.events.Event]]:
        client = RawClient(address)
        answers = []
        try:
            forever = client.request("/test.Echo/Forever", b"")
            for ev in client.events():  # the call's first message: the server has written
                if isinstance(ev, h2.events.DataReceived) and ev.stream_id == forever:
                    break
            for i in range(3):
                answers.append([type(ev).__name__ for ev in _ping(client, b"first-%02d" % i)])
            chunks, _headers, _ = _response(client, client.request("/test.Echo/Unary", b"x"))
            assert _messages(chunks) == [b"X"]
            for i in range(3):
                answers.append([type(ev).__name__ for ev in _ping(client, b"second%02d" % i)])
            return answers, _ping(client, b"too-many", to_the_end=True)
        finally:
            client.close()

    answers, last = await asyncio.to_thread(run)
    assert answers == [["PingAckReceived"]] * 6
    # Acknowledged, as grpc-go does, then the connection ends.
    assert [type(ev).__name__ for ev in last] == ["PingAckReceived", "ConnectionTerminated"]
    assert last[1].error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert last[1].additional_data == b"too_many_pings"


async def test_stop_sends_goaway(echo: tuple[Echo, H2GrpcServer, str]) -> None:
    _service, server, address = echo
    client = RawClient(address)
    try:
        await asyncio.sleep(0.05)
        await server.stop()

        def read() -> list[type]:
            return [type(ev) for ev in client.events()]

        assert h2.events.ConnectionTerminated in await asyncio.to_thread(read)
    finally:
        client.close()


async def test_a_handler_that_does_not_read_holds_back_its_stream_but_not_the_connection(
    echo: tuple[Echo, H2GrpcServer, str],
) -> None:
    """Requests a handler has not consumed are not acknowledged beyond 1 MiB (backpressure), and a
    reset gives their bytes back to the connection window: twenty such streams (about 40 MiB, more
    than the 16 MiB connection window) leave the connection usable."""
    _service, _server, address = echo
    message = _PREFIX.pack(0, 65_536) + b"z" * 65_536
    blob = message * 48  # 3 MiB

    def run() -> tuple[list[int], bytes]:
        client = RawClient(address)
        try:
            held = []
            for _ in range(20):
                sid = client.open("/test.Echo/Sink")
                # The server acknowledges while at most 1 MiB of requests wait, and its stream window
                # is 1 MiB more: a client gets just over 2 MiB in, and no further.
                held.append(client.send_until_blocked(sid, blob, expected=2 << 20))
                client.h2.reset_stream(sid)
                client.sock.sendall(client.h2.data_to_send())
            sid = client.request("/test.Echo/Unary", b"after")
            chunks, headers, _ = _response(client, sid)
            assert headers[b"grpc-status"] == b"0"
            return held, _messages(chunks)[0]
        finally:
            client.close()

    held, reply = await asyncio.to_thread(run)
    assert reply == b"AFTER"
    # Every stream got past the 1 MiB the server lets pile up, and none got the whole 3 MiB in.
    assert all(2 << 20 <= n < len(blob) for n in held), held


def _ended_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF or reset) within ``within`` s; a live connection
    sends its SETTINGS and then nothing, so reading it runs into the time-out."""
    sock.setblocking(True)
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


async def test_a_connection_accepted_while_the_server_stops_is_not_served() -> None:
    # Seed 5006 of the fault campaign: a full-cluster restart stopped every broker's server while
    # a client was connecting. asyncio sets a connection up a few loop turns after accepting it;
    # one accepted before the listening socket closed but made after stop() had taken its list of
    # connections outlived the server and kept serving the stopped brokers' closed store.
    # Whatever the number of loop turns between the connect and the stop, none may survive.
    turns = range(8)
    survivors = []
    for k in turns:
        server = H2GrpcServer(Echo().methods())
        port = await server.start("127.0.0.1", 0)
        sock = socket.socket()
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.connect(("127.0.0.1", port))
        for _ in range(k):
            await asyncio.sleep(0)
        await server.stop()
        try:
            if not await asyncio.to_thread(_ended_by_server, sock, 10.0):
                survivors.append(k)
        finally:
            sock.close()
    assert survivors == [], f"connections outlived the stopped server after {survivors} loop turn(s)"


async def test_a_fast_streaming_handler_is_written_in_pieces_of_grpc_gos_write_buffer(
    echo: tuple[Echo, H2GrpcServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A handler with all its responses at hand (a log read from memory) has them written at most
    ``_SEND_CHUNK`` (32 KiB, grpc-go's write buffer) at a time, as Liftbridge's server sends them."""
    from airflow_provider_liftbridge.devserver import grpc_h2

    writes: list[int] = []

    def counted(self: Any) -> None:
        data = self.h2.data_to_send()
        if data:
            writes.append(len(data))
            if self.transport is not None and not self.transport.is_closing():
                self.transport.write(data)

    monkeypatch.setattr(grpc_h2._Connection, "_write", counted)
    _service, _server, address = echo

    def run() -> list[bytes]:
        client = RawClient(address)
        try:
            sid = client.request("/test.Echo/Count", b"40000")
            return _messages(_response(client, sid)[0])
        finally:
            client.close()

    messages = await asyncio.to_thread(run)
    assert messages == [b"%d" % i for i in range(40000)]  # ~350 KB in all
    chunk = 32 * 1024
    frame = 9 + chunk // 16384 * 9  # frame headers of at most a chunk's worth of DATA
    assert max(writes) <= chunk + 10 + 2 * frame, writes
    assert len([w for w in writes if w > 1000]) >= 8, writes
