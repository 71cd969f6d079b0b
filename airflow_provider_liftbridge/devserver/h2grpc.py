"""A small gRPC server on asyncio and the ``h2`` HTTP/2 library: what the dev server's API runs on.

Why not ``grpc.aio``: gRPC Python sends every streamed message as its own operation through
the completion queue — a thread hand-off, an event-loop wake-up and a socket write per
message — which cost the server ~75 µs of CPU per message on a server stream whatever the
handler did (measured with a bare handler yielding constant bytes, on grpc.aio and on the
thread-pool server alike; see docs/devserver.md). Here a handler can yield a batch of
already-serialized messages, which go out as one HTTP/2 DATA frame, and requests that
arrive together are parsed from one read.

Only what gRPC clients need of a server is implemented: unary-unary, unary-stream and
stream-stream methods; deadlines (``grpc-timeout``); cancellation (RST_STREAM, connection
loss); status and message in trailers (trailers-only when nothing was sent); HTTP/2 flow
control both ways; TLS with ALPN ``h2`` (optionally requiring client certificates).
Compressed messages are refused with UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import quote

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

log = logging.getLogger(__name__)

_PREFIX = struct.Struct(">BI")
#: Largest request message accepted (as the former grpc.aio server's max_receive_message_length).
MAX_RECEIVE_MESSAGE = 64 * 1024 * 1024
_WINDOW = 16 * 1024 * 1024
_FRAME = 1 << 20
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


class Arity(enum.Enum):
    """The shape of a method: how many requests and responses it has."""

    UNARY_UNARY = 1
    UNARY_STREAM = 2
    STREAM_STREAM = 3


@dataclass(frozen=True)
class Method:
    """One RPC: its shape, its handler and how to parse its request bytes.

    Handlers get ``(request_or_request_iterator, context)``. A unary handler returns one
    response; a streaming handler is an async generator. A response is ``bytes`` (already
    serialized), a protobuf message, or a list/tuple of ``bytes`` sent together (a batch).
    """

    arity: Arity
    handler: Callable[..., Any]
    parse: Callable[[bytes], Any]


class AbortError(Exception):
    """Raised by :meth:`CallContext.abort`: ends the call with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """What a handler can ask about its call (the subset of ``grpc.aio.ServicerContext`` the API uses)."""

    __slots__ = ("_deadline", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        self._loop = loop
        self._deadline = deadline

    def time_remaining(self) -> float | None:
        """Seconds until the client's deadline, ``None`` when the client set none."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the call with ``code`` and ``details``.

        :raises AbortError: always (the transport turns it into the call's status).
        """
        raise AbortError(code, details)


def _parse_timeout(value: bytes) -> float | None:
    try:
        return int(value[:-1]) * _TIMEOUT_UNITS[value[-1:]]
    except (KeyError, ValueError):
        return None


def _frame(item: Any) -> bytes:
    """gRPC length-prefixed framing of one response or a batch of serialized responses."""
    if isinstance(item, bytes):
        return _PREFIX.pack(0, len(item)) + item
    if isinstance(item, list | tuple):
        pack = _PREFIX.pack
        return b"".join([b for body in item for b in (pack(0, len(body)), body)])
    body = item.SerializeToString()
    return _PREFIX.pack(0, len(body)) + body


class _Call:
    """One stream (RPC) on a connection."""

    __slots__ = (
        "buf",
        "deadline",
        "ended",
        "headers_sent",
        "inbox",
        "method",
        "sid",
        "task",
        "timer",
        "timed_out",
        "wakeup",
        "window",
    )

    def __init__(self, sid: int, method: Method | None, deadline: float | None) -> None:
        self.sid = sid
        self.method = method
        self.deadline = deadline
        self.buf = bytearray()
        self.inbox: deque[bytes] = deque()
        self.ended = False
        self.headers_sent = False
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.wakeup: asyncio.Future[None] | None = None
        self.window: asyncio.Future[None] | None = None

    def wake(self) -> None:
        fut = self.wakeup
        if fut is not None:
            self.wakeup = None
            if not fut.done():
                fut.set_result(None)

    def wake_window(self) -> None:
        fut = self.window
        if fut is not None:
            self.window = None
            if not fut.done():
                fut.set_result(None)


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/2 framing, and a task per call."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None, validate_inbound_headers=False)
        )
        self.calls: dict[int, _Call] = {}
        self.closed = False
        self._write_handle: asyncio.Handle | None = None

    # -- connection -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._connections.add(self)
        conn = self.h2
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 10_000,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: _FRAME,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 20,
            },
        )
        # Settings sent in the preface are in force at once for the client; h2 only reads the
        # frame-size limit from settings at construction or on acknowledgement of a change.
        conn.max_inbound_frame_size = _FRAME
        conn.initiate_connection()
        conn.increment_flow_control_window(_WINDOW)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._connections.discard(self)
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()

    def flush(self) -> None:
        """Send what h2 has queued at the end of this loop turn: one socket write for everything
        the turn produced (headers, data and trailers of a unary call; batches of several calls)."""
        if self._write_handle is None:
            self._write_handle = self.loop.call_soon(self._write)

    def _write(self) -> None:
        self._write_handle = None
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        """End the connection now (server stop): calls are cancelled, the client sees UNAVAILABLE."""
        if self.closed:
            return
        with contextlib.suppress(Exception):
            self.h2.close_connection()
            self._write()
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    # -- incoming ---------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            log.debug("HTTP/2 protocol error from a client: %s", exc)
            self._write()
            if self.transport is not None:
                self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self._data(event)
            elif isinstance(event, h2.events.RequestReceived):
                self._request(event)
            elif isinstance(event, h2.events.StreamEnded):
                self._ended(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                call = self.calls.pop(event.stream_id, None)
                if call is not None:
                    self._cancel(call)
            elif isinstance(event, h2.events.WindowUpdated):
                if event.stream_id:
                    call = self.calls.get(event.stream_id)
                    if call is not None:
                        call.wake_window()
                else:
                    for call in self.calls.values():
                        call.wake_window()
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                for call in self.calls.values():
                    call.wake_window()
            elif isinstance(event, h2.events.ConnectionTerminated):
                if self.transport is not None:
                    self.transport.close()
        self.flush()

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        path = b""
        deadline = None
        for name, value in event.headers or ():
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = _parse_timeout(value)
                if timeout is not None:
                    deadline = self.loop.time() + timeout
        method = self.server.methods.get(path.decode(errors="replace"))
        call = _Call(sid, method, deadline)
        self.calls[sid] = call
        if method is None:
            self._finish(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if deadline is not None:
            call.timer = self.loop.call_at(deadline, self._expire, call)
        if method.arity is Arity.STREAM_STREAM:
            self._start(call)

    def _data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self.h2.acknowledge_received_data(event.flow_controlled_length, sid)
        call = self.calls.get(sid)
        if call is None or call.method is None:
            return
        buf = call.buf
        buf += event.data
        pos, end = 0, len(buf)
        while end - pos >= 5:
            flag, size = _PREFIX.unpack_from(buf, pos)
            if flag:
                self._fail(
                    call, grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not supported by the dev server"
                )
                return
            if size > MAX_RECEIVE_MESSAGE:
                self._fail(
                    call,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({size} vs. {MAX_RECEIVE_MESSAGE})",
                )
                return
            if end - pos - 5 < size:
                break
            call.inbox.append(bytes(buf[pos + 5 : pos + 5 + size]))
            pos += 5 + size
        del buf[:pos]
        call.wake()

    def _ended(self, sid: int) -> None:
        call = self.calls.get(sid)
        if call is None or call.method is None:
            return
        call.ended = True
        if call.method.arity is Arity.STREAM_STREAM:
            call.wake()
        elif len(call.inbox) != 1:
            self._fail(call, grpc.StatusCode.INTERNAL, f"expected one request message, got {len(call.inbox)}")
        else:
            self._start(call)

    # -- calls ------------------------------------------------------------------------
    def _start(self, call: _Call) -> None:
        call.task = self.loop.create_task(self._run(call))

    def _cancel(self, call: _Call) -> None:
        if call.timer is not None:
            call.timer.cancel()
        if call.task is not None and not call.task.done():
            call.task.cancel()

    def _expire(self, call: _Call) -> None:
        call.timed_out = True
        if call.task is not None and not call.task.done():
            call.task.cancel()
        else:
            self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _fail(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        self._cancel(call)
        self._finish(call, code, details)

    async def _requests(self, call: _Call) -> AsyncIterator[Any]:
        assert call.method is not None
        parse, inbox = call.method.parse, call.inbox
        while True:
            while inbox:
                yield parse(inbox.popleft())
            if call.ended:
                return
            call.wakeup = self.loop.create_future()
            await call.wakeup

    async def _run(self, call: _Call) -> None:
        method = call.method
        assert method is not None
        ctx = CallContext(self.loop, call.deadline)
        try:
            if method.arity is Arity.UNARY_UNARY:
                await self._send(call, _frame(await method.handler(method.parse(call.inbox.popleft()), ctx)))
            else:
                arg = method.parse(call.inbox.popleft()) if method.arity is Arity.UNARY_STREAM else self._requests(call)
                async with contextlib.aclosing(method.handler(arg, ctx)) as responses:
                    async for item in responses:
                        await self._send(call, _frame(item))
            self._finish(call, grpc.StatusCode.OK, "")
        except AbortError as err:
            self._finish(call, err.code, err.details)
        except asyncio.CancelledError:
            if call.timed_out:
                self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except (ConnectionResetError, h2.exceptions.StreamClosedError):
            pass  # the client went away while we were sending
        except Exception as exc:
            log.exception("unexpected error in %s", method.handler.__name__)
            self._finish(call, grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}")
        finally:
            if call.timer is not None:
                call.timer.cancel()

    async def _send(self, call: _Call, data: bytes) -> None:
        conn, sid = self.h2, call.sid
        if not call.headers_sent:
            call.headers_sent = True
            conn.send_headers(sid, _RESPONSE_HEADERS)
        view = memoryview(data)
        while view:
            if self.closed:
                raise ConnectionResetError("the client connection is gone")
            size = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(view))
            if size <= 0:
                self.flush()
                call.window = self.loop.create_future()
                await call.window
                continue
            conn.send_data(sid, view[:size].tobytes())
            view = view[size:]
        self.flush()

    def _finish(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        if self.calls.pop(call.sid, None) is None or self.closed:
            return
        trailers = [(b"grpc-status", str(code.value[0]).encode())]
        if details:
            trailers.append((b"grpc-message", quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode()))
        try:
            if call.headers_sent:
                self.h2.send_headers(call.sid, trailers, end_stream=True)
            else:
                self.h2.send_headers(call.sid, _RESPONSE_HEADERS + trailers, end_stream=True)
        except h2.exceptions.H2Error:  # the client reset the stream meanwhile
            return
        self.flush()


class GrpcServer:
    """Serves ``methods`` (keyed by ``/package.Service/Method``) on one address.

    :param methods: the RPCs.
    :param ssl_context: TLS settings (ALPN ``h2`` is set here); ``None`` serves plaintext.
    """

    def __init__(self, methods: dict[str, Method], ssl_context: ssl.SSLContext | None = None) -> None:
        self.methods = methods
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port) and return the port.

        :raises OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, ssl=self.ssl_context, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and end every connection (their calls are cancelled). Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self._connections):
            conn.close()
        if server is not None:
            await server.wait_closed()
        await asyncio.sleep(0)  # let cancelled calls run their cleanup


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """A TLS context for :class:`GrpcServer`: the server certificate, ALPN ``h2``, and client
    certificates required and checked against ``client_ca_file`` when it is given.

    :raises OSError, ssl.SSLError: a file is missing or does not hold what it should.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca_file:
        ctx.load_verify_locations(client_ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    return ctx


def unary(handler: Callable[[Any, CallContext], Awaitable[Any]], parse: Callable[[bytes], Any]) -> Method:
    """A unary-unary method."""
    return Method(Arity.UNARY_UNARY, handler, parse)


def server_stream(handler: Callable[[Any, CallContext], AsyncIterator[Any]], parse: Callable[[bytes], Any]) -> Method:
    """A unary-stream method."""
    return Method(Arity.UNARY_STREAM, handler, parse)


def bidi_stream(
    handler: Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any]], parse: Callable[[bytes], Any]
) -> Method:
    """A stream-stream method."""
    return Method(Arity.STREAM_STREAM, handler, parse)


def method_table(service: str, methods: Iterable[tuple[str, Method]]) -> dict[str, Method]:
    """Key ``methods`` by their HTTP/2 path, ``/service/name``."""
    return {f"/{service}/{name}": m for name, m in methods}
