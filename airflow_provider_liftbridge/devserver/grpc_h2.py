"""A gRPC server transport on asyncio and the ``h2`` library: what the dev server's API runs on by default.

Why not only ``grpc.aio``: grpcio sends every streamed response as its own operation and its
own DATA frame, which costs the server ~75 µs of CPU per message and makes every grpcio client
pay for one frame per message too. Here responses queued during one event-loop turn go out
together, in as few DATA frames and socket writes as the flow-control windows allow, a streaming
handler's in writes of up to 32 KiB (``_SEND_CHUNK``, as grpc-go's server writes).

Why ``h2``: it owns every piece of HTTP/2 state — framing, HPACK, stream states, SETTINGS,
PING acknowledgements and both directions of flow control. This module never sends more than
``local_flow_control_window(stream)`` bytes nor frames larger than ``max_outbound_frame_size``,
parks a stream's writer until the peer opens its window, and hands received bytes back with
``acknowledge_received_data`` once they are consumed (see ADR 5, and ADR 4 for what happened
when the dev server did its own flow-control accounting).

The servicer methods are the ones ``grpc.aio`` runs (``grpc.RpcMethodHandler`` objects, keyed
by ``/package.Service/Method``); they get an :class:`H2ServicerContext`, the subset of
``grpc.aio.ServicerContext`` they use. Implemented: unary-unary, unary-stream and
stream-stream methods; ``grpc-timeout`` deadlines; cancellation by RST_STREAM or connection
loss; status and percent-encoded message in trailers (trailers-only when nothing was sent);
the request size limit; TLS with ALPN ``h2``; grpc-go's keepalive enforcement (a client that PINGs
more often than once per :data:`PING_MIN_TIME` while the server writes nothing gets GOAWAY
``too_many_pings``, see :meth:`_Connection._ping`). Compressed messages are refused.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from airflow_provider_liftbridge.extras import needs_extra

with needs_extra("devserver", "the dev server"):
    import h2.config
    import h2.connection
    import h2.events
    import h2.exceptions
    import h2.settings
    from h2.errors import ErrorCodes
    from h2.settings import SettingCodes

log = logging.getLogger(__name__)

#: Largest message accepted or sent (as the grpc.aio server's ``max_receive/send_message_length``).
MAX_MESSAGE = 64 * 1024 * 1024

_PREFIX = struct.Struct(">BI")
#: What a client may send ahead on one stream before its messages are consumed (our INITIAL_WINDOW_SIZE).
_STREAM_WINDOW = 1 << 20
#: What a client may send ahead on the whole connection.
_CONNECTION_WINDOW = 16 << 20
#: Largest frame we accept (fewer, larger frames from clients that honour it).
_MAX_INBOUND_FRAME = 1 << 20
#: Concurrent streams per connection (1,000 trigger subscriptions share one channel).
_MAX_STREAMS = 10_000
#: A streaming handler is paused once this many response bytes wait for one stream (backpressure).
_SEND_HIGH_WATER = 256 * 1024
#: A streaming handler's responses go to the socket once this many bytes are queued, with a loop turn
#: before the next ones: grpc-go's default write buffer (``defaultWriteBufSize``), so a fast handler's
#: responses arrive in writes of at most this size, as a Liftbridge server sends them, and a client
#: reads them in as many pieces (its cost per read shows here too, issue 43). Without it, a handler
#: reading a log from memory filled ``_SEND_HIGH_WATER`` before anything was written.
_SEND_CHUNK = 32 * 1024
#: Received request messages waiting for a streaming handler, in bytes, before we stop
#: handing window back to the client.
_RECV_HIGH_WATER = 1 << 20
#: asyncio transport buffer limits: above the high mark the connection stops writing DATA.
_TRANSPORT_HIGH_WATER = 1 << 20

#: grpc-go's server keepalive enforcement with Liftbridge's (default) policy: PINGs closer together
#: than this, on a connection with calls open and nothing written since the last PING, are strikes
#: (``keepalive.EnforcementPolicy.MinTime``, 5 minutes)...
PING_MIN_TIME = 300.0
#: ... and closer than this on a connection without calls (``PermitWithoutStream`` false: grpc-go's
#: ``defaultPingTimeout``, 2 hours)...
PING_MIN_TIME_IDLE = 7200.0
#: ... and one strike more than this ends the connection with GOAWAY ``too_many_pings`` (grpc-go's
#: ``maxPingStrikes``).
MAX_PING_STRIKES = 2

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_RESPONSE_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_STATUS_TEXT = {code: str(code.value[0]).encode() for code in grpc.StatusCode}
# Headers that are transport business, not call metadata (gRPC over HTTP/2 spec).
_RESERVED = frozenset(
    (b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding", b"user-agent")
)


def _percent_encode(message: str) -> bytes:
    """``grpc-message`` encoding: UTF-8, then every byte outside printable ASCII and ``%`` as ``%XX``."""
    out = bytearray()
    for b in message.encode():
        if 0x20 <= b <= 0x7E and b != 0x25:
            out.append(b)
        else:
            out += b"%%%02X" % b
    return bytes(out)


def _parse_timeout(value: bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` value (``1S``, ``250m``, ...); ``None`` when malformed."""
    unit = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * unit


class AbortError(Exception):
    """Raised by :meth:`H2ServicerContext.abort`: ends the call with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class _StreamGoneError(Exception):
    """The client reset the stream or the connection went away while a response was being sent."""


class H2ServicerContext:
    """What a servicer method can ask about its call: the subset of ``grpc.aio.ServicerContext`` the API uses."""

    __slots__ = ("_stream",)

    def __init__(self, stream: _Stream) -> None:
        self._stream = stream

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        """End the call with ``code`` and ``details``.

        :raises AbortError: always; the transport turns it into the call's status.
        """
        raise AbortError(code, details)

    def time_remaining(self) -> float | None:
        """Seconds until the client's deadline; ``None`` when the client set none."""
        deadline = self._stream.deadline
        if deadline is None:
            return None
        return max(0.0, deadline - self._stream.conn.loop.time())

    def cancelled(self) -> bool:
        """Whether the client cancelled the call, its deadline passed, or its connection is gone."""
        return self._stream.cancelled

    def done(self) -> bool:
        """Whether the call has ended (status sent, or cancelled)."""
        return self._stream.finished or self._stream.cancelled

    def peer(self) -> str:
        """The client's address in gRPC's form (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
        return self._stream.conn.peer

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """The call's metadata: ``(key, value)`` pairs, binary (``-bin``) values decoded to bytes."""
        return self._stream.metadata


class _Stream:
    """One RPC on a connection: its request bytes, queued responses and handler task."""

    __slots__ = (
        "cancelled",
        "conn",
        "deadline",
        "finished",
        "handler",
        "headers_sent",
        "inbox",
        "inbox_bytes",
        "metadata",
        "partial",
        "pending",
        "pending_size",
        "remote_ended",
        "request_waiter",
        "sid",
        "task",
        "timed_out",
        "timer",
        "unacked",
        "write_waiter",
    )

    def __init__(self, conn: _Connection, sid: int, handler: grpc.RpcMethodHandler) -> None:
        self.conn = conn
        self.sid = sid
        self.handler = handler
        self.deadline: float | None = None
        self.metadata: tuple[tuple[str, str | bytes], ...] = ()
        self.partial = bytearray()  # bytes of a request message not complete yet
        self.inbox: collections.deque[bytes] = collections.deque()
        self.inbox_bytes = 0
        self.unacked = 0  # flow-controlled bytes received but not handed back to the client yet
        self.remote_ended = False
        self.pending: list[bytes] = []  # framed responses not given to h2 yet
        self.pending_size = 0
        self.headers_sent = False
        self.finished = False
        self.cancelled = False
        self.timed_out = False
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.request_waiter: asyncio.Future[None] | None = None
        self.write_waiter: asyncio.Future[None] | None = None

    def wake_requests(self) -> None:
        fut, self.request_waiter = self.request_waiter, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def wake_writer(self) -> None:
        fut, self.write_waiter = self.write_waiter, None
        if fut is not None and not fut.done():
            fut.set_result(None)


class _Connection(asyncio.Protocol):
    """One client connection: an ``h2`` state machine, and one task per call."""

    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=config)
        # Our SETTINGS must hold from the first frame: h2 enforces MAX_CONCURRENT_STREAMS on
        # streams a client opens before it has seen them.
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: _MAX_STREAMS,
                SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
                SettingCodes.MAX_FRAME_SIZE: _MAX_INBOUND_FRAME,
                SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 16,
            },
        )
        self.h2.max_inbound_frame_size = _MAX_INBOUND_FRAME
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self.streams: dict[int, _Stream] = {}
        self.closed = False
        self.draining = False  # server stopping: new streams are refused
        self._paused = False  # the transport's buffer is above its high-water mark
        self._dirty: dict[_Stream, None] = {}  # streams with responses not given to h2 yet
        self._to_ack: dict[_Stream, None] = {}  # streams whose received bytes are to be acknowledged
        self._flush_handle: asyncio.Handle | None = None
        # Keepalive enforcement (see _ping): strikes so far, when the last PING came, and whether
        # HEADERS or DATA went out since (grpc-go's resetPingStrikes).
        self._ping_strikes = 0
        self._last_ping_at: float | None = None
        self._wrote = False

    # -- connection ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        if self.server.stopped:
            # Accepted just before the server stopped listening, made just after (asyncio sets a
            # connection up a few loop turns after accepting it): a stopped broker serves nothing,
            # so it is reset at once instead of serving calls the server no longer answers for.
            self.closed = True
            transport.abort()
            return
        self.transport = transport
        transport.set_write_buffer_limits(high=_TRANSPORT_HIGH_WATER)
        self.peer = _peer_name(transport.get_extra_info("peername"))
        self.server._connections.add(self)
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(_CONNECTION_WINDOW - 65_535)
        self._write()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._connections.discard(self)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for stream in list(self.streams.values()):
            self._cancel(stream)
        self.streams.clear()
        self._dirty.clear()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for stream in list(self.streams.values()):
            stream.wake_writer()
        self._flush()

    def close(self, code: ErrorCodes = ErrorCodes.NO_ERROR, debug: bytes = b"") -> None:
        """End the connection now: GOAWAY with ``code`` and ``debug`` data, cancel every call, close
        the socket. Clients see UNAVAILABLE."""
        if self.closed:
            return
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.close_connection(code, additional_data=debug or None)
        self._write()
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    # -- input --------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 has queued a GOAWAY naming the error; send it and drop the connection.
            log.info("HTTP/2 protocol error from %s: %s", self.peer, exc)
            self._write()
            if self.transport is not None:
                self.transport.close()
            self.connection_lost(None)
            return
        for event in events:
            if self.closed:  # GOAWAY sent or received: nothing more on this connection
                return
            try:
                self._dispatch(event)
            except Exception:  # one bad event must not take down the server or the connection's other calls
                log.exception("error handling %s from %s", type(event).__name__, self.peer)
        if self._to_ack:
            streams, self._to_ack = self._to_ack, {}
            for stream in streams:
                if not stream.finished:
                    self._acknowledge(stream)
        self._flush()

    def _dispatch(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                self._remote_ended(stream)
        elif isinstance(event, h2.events.StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                self._dirty.pop(stream, None)
                self._cancel(stream)
                self._acknowledge(stream)  # bytes held back for the handler still count for the connection
        elif isinstance(event, h2.events.PingReceived):
            self._ping()
        elif isinstance(event, h2.events.TrailersReceived):
            pass  # gRPC clients send none; END_STREAM arrives as its own StreamEnded event
        elif isinstance(event, h2.events.ConnectionTerminated):
            # The client sent GOAWAY: h2 allows nothing more on this connection.
            if self.transport is not None:
                self.transport.close()
            self.connection_lost(None)
        # WINDOW_UPDATE and SETTINGS need nothing here: the _flush() that ends data_received sends
        # what the new windows allow and wakes the writers. PING is acknowledged by h2 itself.

    def _ping(self) -> None:
        """Keepalive enforcement, as grpc-go's server (``http2Server.handlePing``) does it with
        Liftbridge's policy: a PING after HEADERS or DATA were sent clears the strikes and is not
        judged; otherwise a PING sooner than :data:`PING_MIN_TIME` after the previous one
        (:data:`PING_MIN_TIME_IDLE` when no call is open) is a strike, and the strike after
        :data:`MAX_PING_STRIKES` ends the connection with GOAWAY ENHANCE_YOUR_CALM
        ``too_many_pings`` (its PING already acknowledged, as grpc-go does). Without it a client's
        keepalive looked welcome here and was not on Liftbridge (issue 59)."""
        now = self.loop.time()
        last, self._last_ping_at = self._last_ping_at, now
        if self._wrote:
            self._wrote = False
            self._ping_strikes = 0
            return
        min_time = PING_MIN_TIME if self.streams else PING_MIN_TIME_IDLE
        if last is not None and now - last < min_time:
            self._ping_strikes += 1
        if self._ping_strikes > MAX_PING_STRIKES:
            log.info("GOAWAY too_many_pings to %s: %d PINGs with nothing sent", self.peer, self._ping_strikes + 1)
            self.close(ErrorCodes.ENHANCE_YOUR_CALM, b"too_many_pings")

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        headers = event.headers or []
        path = method = content_type = b""
        timeout: bytes | None = None
        encoding = b"identity"
        metadata: list[tuple[str, str | bytes]] = []
        for name, value in headers:
            name_b = bytes(name)
            value_b = bytes(value)
            if name_b == b":path":
                path = value_b
            elif name_b == b":method":
                method = value_b
            elif name_b == b"content-type":
                content_type = value_b
            elif name_b == b"grpc-timeout":
                timeout = value_b
            elif name_b == b"grpc-encoding":
                encoding = value_b
            elif not name_b.startswith(b":") and name_b not in _RESERVED:
                key = name_b.decode("latin-1")
                if key.endswith("-bin"):
                    metadata.append((key, base64.b64decode(value_b + b"==")))
                else:
                    metadata.append((key, value_b.decode(errors="replace")))
        if self.draining:
            self.h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)  # the client retries elsewhere
            return
        if method != b"POST" or not content_type.startswith(b"application/grpc"):
            # Not a gRPC request: an HTTP answer, as the gRPC spec asks (405 / 415).
            status = b"405" if method != b"POST" else b"415"
            self.h2.send_headers(sid, [(b":status", status)], end_stream=True)
            self._wrote = True
            if event.stream_ended is None:
                self.h2.reset_stream(sid, ErrorCodes.NO_ERROR)
            return
        handler = self.server.methods.get(path.decode("latin-1"))
        stream = _Stream(self, sid, handler)
        self.streams[sid] = stream
        stream.metadata = tuple(metadata)
        if handler is None:
            self._finish(stream, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path.decode('latin-1')}")
            return
        if encoding != b"identity":
            self._finish(
                stream,
                grpc.StatusCode.UNIMPLEMENTED,
                f"the dev server does not support {encoding.decode()} compression",
            )
            return
        if timeout is not None:
            seconds = _parse_timeout(timeout)
            if seconds is not None:
                stream.deadline = self.loop.time() + seconds
                stream.timer = self.loop.call_at(stream.deadline, self._expire, stream)
        if handler.request_streaming:
            stream.task = self.loop.create_task(self._run(stream))

    def _data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id
        flow = event.flow_controlled_length
        stream = self.streams.get(sid)
        if stream is None or stream.finished:
            # A call we already ended: its bytes still count against the connection window.
            if flow:
                self.h2.acknowledge_received_data(flow, sid)
            return
        stream.unacked += flow
        buf = stream.partial
        buf += event.data
        pos, end = 0, len(buf)
        while end - pos >= 5:
            compressed, size = _PREFIX.unpack_from(buf, pos)
            if compressed:
                self._fail(stream, grpc.StatusCode.UNIMPLEMENTED, "the dev server does not support compressed messages")
                return
            if size > MAX_MESSAGE:
                self._fail(
                    stream,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({size} vs. {MAX_MESSAGE})",
                )
                return
            if end - pos - 5 < size:
                break
            stream.inbox.append(bytes(buf[pos + 5 : pos + 5 + size]))
            stream.inbox_bytes += size
            pos += 5 + size
        del buf[:pos]
        # Give the window back unless complete messages are piling up for a slow streaming handler;
        # bytes of an incomplete message are always acknowledged, so a large message can arrive.
        if stream.inbox_bytes <= _RECV_HIGH_WATER or not stream.handler.request_streaming:
            self._to_ack[stream] = None  # once per stream per socket read, not per frame
        stream.wake_requests()

    def _acknowledge(self, stream: _Stream) -> None:
        if stream.unacked:
            self.h2.acknowledge_received_data(stream.unacked, stream.sid)
            stream.unacked = 0
            self._schedule_flush()

    def _remote_ended(self, stream: _Stream) -> None:
        stream.remote_ended = True
        if stream.finished:
            return
        if stream.handler.request_streaming:
            stream.wake_requests()
        elif len(stream.inbox) != 1:
            self._fail(stream, grpc.StatusCode.INTERNAL, f"expected one request message, got {len(stream.inbox)}")
        else:
            stream.task = self.loop.create_task(self._run(stream))

    # -- calls --------------------------------------------------------------------------
    async def _requests(self, stream: _Stream) -> AsyncIterator[Any]:
        """The request iterator of a client-streaming call."""
        parse = stream.handler.request_deserializer or _identity
        inbox = stream.inbox
        while True:
            while inbox:
                body = inbox.popleft()
                stream.inbox_bytes -= len(body)
                if stream.unacked and stream.inbox_bytes <= _RECV_HIGH_WATER:
                    self._acknowledge(stream)
                yield _deserialize(parse, body)
            if stream.remote_ended or stream.finished:
                return
            stream.request_waiter = self.loop.create_future()
            await stream.request_waiter

    async def _run(self, stream: _Stream) -> None:
        handler = stream.handler
        ctx = H2ServicerContext(stream)
        code, details = grpc.StatusCode.OK, ""
        try:
            try:
                if handler.request_streaming:
                    request: Any = self._requests(stream)
                else:
                    request = _deserialize(handler.request_deserializer or _identity, stream.inbox.popleft())
                serialize = handler.response_serializer or _identity
                if handler.response_streaming:
                    fn = handler.stream_stream if handler.request_streaming else handler.unary_stream
                    async with contextlib.aclosing(fn(request, ctx)) as responses:
                        async for item in responses:
                            self._queue(stream, serialize(item))
                            if stream.pending_size >= _SEND_CHUNK or self._paused:
                                await self._writable(stream)
                else:
                    fn = handler.stream_unary if handler.request_streaming else handler.unary_unary
                    self._queue(stream, serialize(await fn(request, ctx)))
            except AbortError as err:
                code, details = err.code, err.details
            except (_StreamGoneError, asyncio.CancelledError):
                raise
            except Exception as exc:
                log.exception("unexpected error in %s", getattr(handler, "__qualname__", handler))
                code, details = grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}"
            await self._drained(stream)  # the status goes after every response
            self._finish(stream, code, details)
        except asyncio.CancelledError:
            if stream.timed_out and not stream.finished:
                self._finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                self._flush()
        except _StreamGoneError:
            pass  # the client is gone: nobody to tell
        finally:
            if stream.timer is not None:
                stream.timer.cancel()

    def _queue(self, stream: _Stream, body: bytes) -> None:
        """Frame one response of ``stream``; it goes out with this loop turn's write."""
        if stream.finished or stream.cancelled or self.closed:
            raise _StreamGoneError
        size = len(body)
        if size > MAX_MESSAGE:
            raise AbortError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"Sent message larger than max ({size} vs. {MAX_MESSAGE})"
            )
        if not stream.headers_sent:
            stream.headers_sent = True
            self.h2.send_headers(stream.sid, _RESPONSE_HEADERS)
            self._wrote = True
        stream.pending.append(_PREFIX.pack(0, size))
        stream.pending.append(body)
        stream.pending_size += size + 5
        if stream not in self._dirty:
            self._dirty[stream] = None
            self._schedule_flush()

    async def _writable(self, stream: _Stream) -> None:
        """Backpressure for streaming handlers: send what the windows allow, then wait while too much is queued.

        :raises _StreamGoneError: the stream or connection went away meanwhile.
        """
        self._flush()
        if stream.pending_size < _SEND_HIGH_WATER and not self._paused:
            await asyncio.sleep(0)  # a handler with endless data must still let the loop run
        while stream.pending_size >= _SEND_HIGH_WATER or self._paused:
            if stream.cancelled or self.closed:
                raise _StreamGoneError
            stream.write_waiter = self.loop.create_future()
            await stream.write_waiter
            self._flush()

    async def _drained(self, stream: _Stream) -> None:
        """Wait until every queued response of ``stream`` is in h2's hands.

        :raises _StreamGoneError: the stream or connection went away meanwhile.
        """
        while stream.pending_size:
            # Into h2 now (the socket write waits for the end of this loop turn, with the trailers).
            if not self._paused and self._send_pending(stream):
                self._dirty.pop(stream, None)
                return
            if stream.cancelled or self.closed:
                raise _StreamGoneError
            stream.write_waiter = self.loop.create_future()
            await stream.write_waiter

    def _send_pending(self, stream: _Stream) -> bool:
        """Give h2 as much of ``stream``'s queued responses as the windows and frame size allow,
        writing to the socket at every ``_SEND_CHUNK`` of them, as grpc-go's write buffer does when a
        window reopens on a backlog.

        :returns: whether everything queued was sent.
        """
        if len(stream.pending) == 1:
            data = stream.pending[0]
        else:
            data = b"".join(stream.pending)
        view = memoryview(data)
        sent, total, unwritten = 0, len(data), 0
        h2conn, sid = self.h2, stream.sid
        while sent < total:
            size = min(h2conn.local_flow_control_window(sid), h2conn.max_outbound_frame_size, total - sent)
            if size <= 0:
                break
            h2conn.send_data(sid, view[sent : sent + size])
            self._wrote = True
            sent += size
            unwritten += size
            if unwritten >= _SEND_CHUNK:
                self._write()
                unwritten = 0
        if sent == total:
            stream.pending.clear()
            stream.pending_size = 0
            return True
        stream.pending = [data[sent:]] if sent else [data]
        stream.pending_size = total - sent
        return False

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and not self.closed:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Hand queued responses to h2 (unless the socket buffer is full) and write what h2 has to send."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self.closed:
            return
        if self._dirty and not self._paused:
            for stream in list(self._dirty):
                if self._send_pending(stream):
                    del self._dirty[stream]
                if stream.pending_size < _SEND_HIGH_WATER:
                    stream.wake_writer()
        self._write()

    def _write(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def _expire(self, stream: _Stream) -> None:
        stream.timed_out = True
        stream.cancelled = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        else:
            self._finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self._flush()

    def _cancel(self, stream: _Stream) -> None:
        stream.cancelled = True
        if stream.timer is not None:
            stream.timer.cancel()
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        stream.wake_writer()
        stream.wake_requests()

    def _fail(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        """End a call from the transport side (bad request bytes): stop its handler and send the status."""
        self._cancel(stream)
        self._finish(stream, code, details)

    def _finish(self, stream: _Stream, code: grpc.StatusCode, details: str) -> None:
        """Send the call's status in trailers (trailers-only when no response was sent) and forget the call."""
        if stream.finished:
            return
        stream.finished = True
        self._dirty.pop(stream, None)
        stream.pending.clear()
        stream.pending_size = 0
        stream.partial.clear()
        if stream.timer is not None:
            stream.timer.cancel()
        if stream.unacked:  # what the handler never consumed still counts against the connection window
            self.h2.acknowledge_received_data(stream.unacked, stream.sid)
            stream.unacked = 0
        if self.streams.pop(stream.sid, None) is None or self.closed:
            return
        trailers = [(b"grpc-status", _STATUS_TEXT[code])]
        if details:
            trailers.append((b"grpc-message", _percent_encode(details)))
        block = trailers if stream.headers_sent else [*_RESPONSE_HEADERS, *trailers]
        try:
            self.h2.send_headers(stream.sid, block, end_stream=True)
            self._wrote = True
            if not stream.remote_ended:
                # The client may still be sending: tell it to stop (as grpc-go does) so the stream closes.
                self.h2.reset_stream(stream.sid, ErrorCodes.NO_ERROR)
        except h2.exceptions.StreamClosedError:
            pass  # reset by the client meanwhile
        self._schedule_flush()


def _identity(data: bytes) -> bytes:
    return data


def _deserialize(parse: Callable[[bytes], Any], body: bytes) -> Any:
    try:
        return parse(body)
    except Exception as exc:
        raise AbortError(grpc.StatusCode.INTERNAL, f"Exception deserializing request: {exc}") from exc


def _peer_name(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{peername}" if peername else "unknown"


@dataclass(frozen=True)
class TransportStats:
    """A snapshot of an :class:`H2GrpcServer`.

    :param connections: open client connections.
    :param active_calls: calls not finished yet (handler running or request still arriving).
    :param buffered_bytes: response bytes waiting to be sent: queued for flow control plus the
        sockets' write buffers. Bounded per call by backpressure, whatever the clients do.
    """

    connections: int
    active_calls: int
    buffered_bytes: int


class H2GrpcServer:
    """Serves gRPC methods on one address with the ``h2`` transport.

    :param methods: ``grpc.RpcMethodHandler`` per HTTP/2 path (``/proto.API/Subscribe``); their
        behaviours are async functions or async generators, as for ``grpc.aio``.
    :param ssl_context: TLS settings (see :func:`server_ssl_context`); ``None`` serves plaintext.
    """

    def __init__(self, methods: Mapping[str, grpc.RpcMethodHandler], ssl_context: ssl.SSLContext | None = None) -> None:
        self.methods = dict(methods)
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        #: Set by :meth:`stop`: connections made from then on are refused (see ``connection_made``).
        self.stopped = False

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0 picks a free port) and return the port.

        :raises OSError: the address cannot be bound.
        """
        loop = asyncio.get_running_loop()
        self.stopped = False
        self._server = await loop.create_server(lambda: _Connection(self), host, port, ssl=self.ssl_context)
        return int(self._server.sockets[0].getsockname()[1])

    def stats(self) -> TransportStats:
        """Connections, unfinished calls and bytes buffered for clients, now. Call it on the server's loop."""
        connections = list(self._connections)
        calls = sum(len(c.streams) for c in connections)
        buffered = sum(
            sum(st.pending_size for st in c.streams.values())
            + (c.transport.get_write_buffer_size() if c.transport is not None else 0)
            for c in connections
        )
        return TransportStats(len(connections), calls, buffered)

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening and end every connection. Idempotent.

        With ``grace``, new calls are refused (REFUSED_STREAM, which clients retry) and running
        calls get up to ``grace`` seconds to finish; then, or at once without ``grace``, every
        connection gets GOAWAY, its calls are cancelled and it is closed. A connection accepted
        before the listening socket closed but set up only after this began (asyncio makes it a few
        loop turns later) is reset as it is made: no connection outlives a stopped server.
        """
        self.stopped = True
        server, self._server = self._server, None
        if server is not None:
            await _stop_accepting(server)
            server.close()
        connections = list(self._connections)
        if grace:
            for conn in connections:
                conn.draining = True
            tasks = [s.task for c in connections for s in c.streams.values() if s.task is not None]
            if tasks:
                await asyncio.wait(tasks, timeout=grace)
        tasks = [s.task for c in connections for s in c.streams.values() if s.task is not None]
        for conn in connections:
            conn.close()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)  # let cancelled calls run their cleanup
        if server is not None:
            await server.wait_closed()


#: Loop turns asyncio takes from accepting a connection to making it (``_accept_connection2``
#: starts, then creates the transport, which calls ``connection_made`` on the next turn), plus one.
_ACCEPT_TURNS = 3


async def _stop_accepting(server: asyncio.Server) -> None:
    """Stop accepting on ``server``'s sockets and let the connections it already accepted be made
    (they are then refused: :attr:`H2GrpcServer.stopped`). Closing the server first would leave
    them half made: asyncio (3.11) fails to create the transport of a connection accepted just
    before ``close()``, swallows the error and leaves the socket open, unserved, until the garbage
    collector closes it; a client's calls on it wait for their deadline meanwhile."""
    loop = asyncio.get_running_loop()
    for sock in server.sockets:
        loop.remove_reader(sock.fileno())
    for _ in range(_ACCEPT_TURNS):
        await asyncio.sleep(0)


def method_table(service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> dict[str, grpc.RpcMethodHandler]:
    """Key ``handlers`` (by method name) by their HTTP/2 path, ``/service/name``."""
    return {f"/{service}/{name}": h for name, h in handlers.items()}


def server_ssl_context(cert_file: str, key_file: str, client_ca_file: str | None = None) -> ssl.SSLContext:
    """A TLS context for :class:`H2GrpcServer`: the server certificate, ALPN ``h2``, TLS 1.2 or later,
    and client certificates required and checked against ``client_ca_file`` when it is given.

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


__all__ = [
    "MAX_MESSAGE",
    "MAX_PING_STRIKES",
    "PING_MIN_TIME",
    "PING_MIN_TIME_IDLE",
    "AbortError",
    "H2GrpcServer",
    "H2ServicerContext",
    "TransportStats",
    "method_table",
    "server_ssl_context",
]
