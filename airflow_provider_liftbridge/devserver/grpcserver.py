"""A small gRPC server on asyncio with its own HTTP/2 framing: what the dev server's API runs on.

Why not ``grpc.aio``: gRPC Python sends every streamed message as its own operation through
the completion queue — a thread hand-off, an event-loop wake-up and a socket write per
message — which cost the server ~75 µs of CPU per message on a server stream whatever the
handler did (measured with a bare handler yielding constant bytes, on grpc.aio and on the
thread-pool server alike; see docs/devserver.md). Why not the ``h2`` library: its
per-frame bookkeeping (and an eager ``repr`` of every received frame) cost ~30 µs per
frame, and gRPC clients send one DATA frame per streamed request.

Here a handler can yield a batch of already-serialized messages, which go out as one DATA
frame; everything a loop turn produces goes out in one socket write; requests that arrive
together are parsed from one read. Request headers are decoded with ``hpack``; response
headers are encoded by hand from the static table and literals (no dynamic table).

Implemented: unary-unary, unary-stream and stream-stream methods; deadlines
(``grpc-timeout``); cancellation (RST_STREAM, connection loss); status and message in
trailers (trailers-only when nothing was sent); flow control both ways; SETTINGS, PING,
WINDOW_UPDATE, GOAWAY, CONTINUATION, padding; TLS with ALPN ``h2`` (optionally requiring
client certificates). Compressed messages are refused with UNIMPLEMENTED.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import ssl
import struct
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import quote

import grpc
import hpack

log = logging.getLogger(__name__)

#: Largest request message accepted (as the former grpc.aio server's max_receive_message_length).
MAX_RECEIVE_MESSAGE = 64 * 1024 * 1024

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MSG_PREFIX = struct.Struct(">BI")
_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")

# Frame types and flags (RFC 9113, section 6).
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONT = range(10)
_END_STREAM = 0x1
_ACK = 0x1
_END_HEADERS = 0x4
_PADDED = 0x8
_PRIORITY_FLAG = 0x20
# Settings and error codes.
_S_HEADER_TABLE_SIZE, _S_INITIAL_WINDOW_SIZE, _S_MAX_FRAME_SIZE = 0x1, 0x4, 0x5
_S_MAX_CONCURRENT_STREAMS, _S_MAX_HEADER_LIST_SIZE = 0x3, 0x6
_NO_ERROR, _PROTOCOL_ERROR, _FLOW_CONTROL_ERROR, _FRAME_SIZE_ERROR, _COMPRESSION_ERROR = 0x0, 0x1, 0x3, 0x6, 0x9

_DEFAULT_WINDOW = 65_535
_WINDOW = 16 * 1024 * 1024  # what we let a client send ahead, per stream and per connection
_WINDOW_REFILL = _WINDOW // 4  # refill once this much was consumed
_MAX_FRAME = 1 << 20  # largest frame we accept
_MAX_HEADER_BLOCK = 1 << 20

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# ":status: 200" is static-table entry 8; content-type (entry 31) as a literal without indexing.
_RESPONSE_HEADERS = b"\x88" + b"\x0f\x10" + bytes([16]) + b"application/grpc"
_MESSAGE_SAFE = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"


class Arity(enum.Enum):
    """The shape of a method: how many requests and responses it has."""

    UNARY_UNARY = 1
    UNARY_STREAM = 2
    STREAM_STREAM = 3


@dataclass(frozen=True)
class Method:
    """One RPC: its shape, its handler and how to parse its request bytes.

    Handlers get ``(request_or_request_iterator, context)``. A unary handler returns one
    response; a streaming handler is an async generator, or — for stream-stream methods — a
    coroutine that sends its responses with :meth:`CallContext.send_nowait` (``push``). A
    response is ``bytes`` (already serialized), a protobuf message, or a list/tuple of
    ``bytes`` sent together (a batch).
    """

    arity: Arity
    handler: Callable[..., Any]
    parse: Callable[[bytes], Any]
    push: bool = False


class AbortError(Exception):
    """Raised by :meth:`CallContext.abort`: ends the call with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _ConnectionError(Exception):
    """A connection-level HTTP/2 error: GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class CallContext:
    """What a handler can ask about its call (the subset of ``grpc.aio.ServicerContext`` the API uses)."""

    __slots__ = ("_deadline", "_loop", "_push")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float | None, push: Callable[[bytes], None]) -> None:
        self._loop = loop
        self._deadline = deadline
        self._push = push

    def send_nowait(self, response: Any) -> None:
        """Queue a response (or a list of serialized responses); everything queued in one loop turn
        goes out together, as flow control allows. For push-style stream-stream handlers.

        :raises ConnectionResetError: the client is gone.
        """
        self._push(_frame_messages(response))

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


_HEAD9 = struct.Struct(">BHBBI")


def _head(length: int, ftype: int, flags: int, sid: int) -> bytes:
    """The 9-byte frame header: 24-bit length, type, flags, 31-bit stream id."""
    return _HEAD9.pack(length >> 16, length & 0xFFFF, ftype, flags, sid)


def _literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header field without indexing, new name, no Huffman (names/values < 127 bytes
    use one length byte; longer ones the integer continuation)."""
    return b"\x00" + _hpack_int(len(name)) + name + _hpack_int(len(value)) + value


def _hpack_int(n: int) -> bytes:
    """HPACK integer with a 7-bit prefix (the string-length form, Huffman bit clear)."""
    if n < 127:
        return bytes([n])
    out = bytearray([127])
    n -= 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _frame_messages(item: Any) -> bytes:
    """gRPC length-prefixed framing of one response or a batch of serialized responses."""
    if isinstance(item, bytes):
        return _MSG_PREFIX.pack(0, len(item)) + item
    if isinstance(item, list | tuple):
        pack = _MSG_PREFIX.pack
        return b"".join([b for body in item for b in (pack(0, len(body)), body)])
    body = item.SerializeToString()
    return _MSG_PREFIX.pack(0, len(body)) + body


class _Call:
    """One stream (RPC) on a connection."""

    __slots__ = (
        "buf",
        "deadline",
        "ended",
        "headers_sent",
        "inbox",
        "method",
        "pending",
        "recv_unacked",
        "send_window",
        "sid",
        "task",
        "timed_out",
        "timer",
        "wakeup",
        "window_waiter",
    )

    def __init__(self, sid: int, method: Method | None, deadline: float | None, send_window: int) -> None:
        self.sid = sid
        self.method = method
        self.deadline = deadline
        self.buf = bytearray()
        self.inbox: deque[bytes] = deque()
        self.ended = False
        self.headers_sent = False
        self.pending = bytearray()  # framed responses not sent yet (flow control, or queued this turn)
        self.send_window = send_window
        self.recv_unacked = 0
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timed_out = False
        self.wakeup: asyncio.Future[None] | None = None
        self.window_waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        fut = self.wakeup
        if fut is not None:
            self.wakeup = None
            if not fut.done():
                fut.set_result(None)

    def wake_drained(self) -> None:
        fut = self.window_waiter
        if fut is not None:
            self.window_waiter = None
            if not fut.done():
                fut.set_result(None)


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/2 framing, and a task per call."""

    def __init__(self, server: GrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, _Call] = {}
        self.closed = False
        self._buf = bytearray()
        self._preface = False
        self._out: list[bytes] = []
        self._write_handle: asyncio.Handle | None = None
        self._to_drain: dict[_Call, None] = {}  # calls with responses queued by send_nowait
        self._decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_BLOCK)
        self._header_block: bytearray | None = None  # HEADERS waiting for CONTINUATION
        self._header_sid = 0
        self._header_end_stream = False
        self._peer_window = _DEFAULT_WINDOW  # initial send window of new streams (peer's setting)
        self._peer_max_frame = 16_384
        self._send_window = _DEFAULT_WINDOW  # connection-level send window
        self._recv_unacked = 0
        self._last_sid = 0

    # -- connection -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.server._connections.add(self)
        settings = b"".join(
            _SETTING.pack(k, v)
            for k, v in (
                (_S_MAX_CONCURRENT_STREAMS, 10_000),
                (_S_INITIAL_WINDOW_SIZE, _WINDOW),
                (_S_MAX_FRAME_SIZE, _MAX_FRAME),
                (_S_MAX_HEADER_LIST_SIZE, _MAX_HEADER_BLOCK),
            )
        )
        self._send_frame(_SETTINGS, 0, 0, settings)
        self._send_frame(_WINDOW_UPDATE, 0, 0, _U32.pack(_WINDOW - _DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server._connections.discard(self)
        for call in list(self.calls.values()):
            self._cancel(call)
        self.calls.clear()

    def close(self, code: int = _NO_ERROR) -> None:
        """End the connection now (server stop, or a protocol error): calls are cancelled; the client
        sees UNAVAILABLE."""
        if self.closed:
            return
        self._send_frame(_GOAWAY, 0, 0, _U32.pack(self._last_sid) + _U32.pack(code))
        self._write()
        if self.transport is not None:
            self.transport.close()
        self.connection_lost(None)

    # -- output -----------------------------------------------------------------------
    def _send_frame(self, ftype: int, flags: int, sid: int, payload: bytes = b"") -> None:
        self._out.append(_head(len(payload), ftype, flags, sid))
        if payload:
            self._out.append(payload)
        if self._write_handle is None:
            # Everything this loop turn produces (headers, data and trailers of a unary call;
            # batches of several calls; window updates) goes out in one socket write.
            self._write_handle = self.loop.call_soon(self._write)

    def _write(self) -> None:
        if self._to_drain:
            calls, self._to_drain = self._to_drain, {}
            for call in calls:
                if self.calls.get(call.sid) is call:
                    self._drain(call)
        self._write_handle = None
        if self._out and self.transport is not None and not self.closed:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))

    def _send_headers(self, sid: int, block: bytes, end_stream: bool) -> None:
        limit = self._peer_max_frame
        flags = _END_STREAM if end_stream else 0
        if len(block) <= limit:
            self._send_frame(_HEADERS, flags | _END_HEADERS, sid, block)
            return
        self._send_frame(_HEADERS, flags, sid, block[:limit])
        rest = block[limit:]
        while rest:
            chunk, rest = rest[:limit], rest[limit:]
            self._send_frame(_CONT, 0 if rest else _END_HEADERS, sid, chunk)

    # -- input ------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        try:
            if not self._preface:
                if len(buf) < len(_PREFACE):
                    return
                if buf[: len(_PREFACE)] != _PREFACE:
                    raise _ConnectionError(_PROTOCOL_ERROR, "not an HTTP/2 client preface")
                del buf[: len(_PREFACE)]
                self._preface = True
            pos, end = 0, len(buf)
            try:
                while end - pos >= 9:
                    hi, lo, ftype, flags, sid = _HEAD9.unpack_from(buf, pos)
                    length = (hi << 16) | lo
                    if length > _MAX_FRAME:
                        raise _ConnectionError(_FRAME_SIZE_ERROR, f"frame of {length} bytes")
                    if end - pos - 9 < length:
                        break
                    start = pos + 9
                    pos = start + length
                    self._frame(ftype, flags, sid & 0x7FFFFFFF, buf, start, pos)
            finally:
                del buf[:pos]
        except _ConnectionError as err:
            log.debug("HTTP/2 connection error from a client: %s", err)
            self.close(err.code)
            return
        if self._recv_unacked >= _WINDOW_REFILL:
            self._send_frame(_WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked))
            self._recv_unacked = 0

    def _frame(self, ftype: int, flags: int, sid: int, buf: bytearray, start: int, end: int) -> None:
        if self._header_block is not None and ftype != _CONT:
            raise _ConnectionError(_PROTOCOL_ERROR, "expected CONTINUATION")
        if ftype == _DATA:
            self._data(flags, sid, buf, start, end)
        elif ftype == _HEADERS:
            if flags & _PADDED:
                pad = buf[start]
                start += 1
                end -= pad
            if flags & _PRIORITY_FLAG:
                start += 5
            if start > end:
                raise _ConnectionError(_PROTOCOL_ERROR, "bad HEADERS padding")
            self._header_block = bytearray(buf[start:end])
            self._header_sid = sid
            self._header_end_stream = bool(flags & _END_STREAM)
            if flags & _END_HEADERS:
                self._headers_done()
        elif ftype == _CONT:
            if self._header_block is None or sid != self._header_sid:
                raise _ConnectionError(_PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._header_block += buf[start:end]
            if len(self._header_block) > _MAX_HEADER_BLOCK:
                raise _ConnectionError(_PROTOCOL_ERROR, "header block too large")
            if flags & _END_HEADERS:
                self._headers_done()
        elif ftype == _WINDOW_UPDATE:
            if end - start != 4:
                raise _ConnectionError(_FRAME_SIZE_ERROR, "bad WINDOW_UPDATE")
            inc = _U32.unpack_from(buf, start)[0] & 0x7FFFFFFF
            if sid == 0:
                self._send_window += inc
                for waiting in list(self.calls.values()):
                    if waiting.pending:
                        self._drain(waiting)
            else:
                target = self.calls.get(sid)
                if target is not None:
                    target.send_window += inc
                    if target.pending:
                        self._drain(target)
        elif ftype == _SETTINGS:
            if not flags & _ACK:
                self._settings(buf, start, end)
        elif ftype == _PING:
            if not flags & _ACK:
                self._send_frame(_PING, _ACK, 0, bytes(buf[start:end]))
        elif ftype == _RST_STREAM:
            reset = self.calls.pop(sid, None)
            if reset is not None:
                self._cancel(reset)
        elif ftype == _GOAWAY:
            pass  # the client stops opening streams; running calls finish, then it closes
        # PRIORITY, PUSH_PROMISE (never sent by clients) and unknown types are ignored.

    def _settings(self, buf: bytearray, start: int, end: int) -> None:
        if (end - start) % 6:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "bad SETTINGS")
        for pos in range(start, end, 6):
            key, value = _SETTING.unpack_from(buf, pos)
            if key == _S_INITIAL_WINDOW_SIZE:
                delta = value - self._peer_window
                self._peer_window = value
                for call in list(self.calls.values()):
                    call.send_window += delta
                    if call.pending:
                        self._drain(call)
            elif key == _S_MAX_FRAME_SIZE:
                self._peer_max_frame = value
            # HEADER_TABLE_SIZE: our responses never use the dynamic table, nothing to resize.
        self._send_frame(_SETTINGS, _ACK, 0)

    def _headers_done(self) -> None:
        block, sid, end_stream = self._header_block, self._header_sid, self._header_end_stream
        self._header_block = None
        assert block is not None
        try:
            headers = self._decoder.decode(bytes(block), raw=True)
        except hpack.HPACKError as exc:
            raise _ConnectionError(_COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        call = self.calls.get(sid)
        if call is not None:  # trailers from the client end its stream
            if end_stream:
                self._ended(call)
            return
        self._last_sid = max(self._last_sid, sid)
        path, deadline = b"", None
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = _parse_timeout(value)
                if timeout is not None:
                    deadline = self.loop.time() + timeout
        method = self.server.methods.get(path.decode(errors="replace"))
        call = _Call(sid, method, deadline, self._peer_window)
        self.calls[sid] = call
        if method is None:
            self._finish(call, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
            return
        if deadline is not None:
            call.timer = self.loop.call_at(deadline, self._expire, call)
        if method.arity is Arity.STREAM_STREAM:
            self._start(call)
        if end_stream:
            self._ended(call)

    def _data(self, flags: int, sid: int, buf: bytearray, start: int, end: int) -> None:
        flow = end - start
        self._recv_unacked += flow
        if flags & _PADDED and flow:
            end -= buf[start]
            start += 1
            if start > end:
                raise _ConnectionError(_PROTOCOL_ERROR, "bad DATA padding")
        call = self.calls.get(sid)
        if call is None or call.method is None:
            return  # a stream we already finished or reset: the bytes still count for the connection
        call.recv_unacked += flow
        if call.recv_unacked >= _WINDOW_REFILL and not flags & _END_STREAM:
            self._send_frame(_WINDOW_UPDATE, 0, sid, _U32.pack(call.recv_unacked))
            call.recv_unacked = 0
        cbuf = call.buf
        cbuf += buf[start:end]
        pos, cend = 0, len(cbuf)
        while cend - pos >= 5:
            flag, size = _MSG_PREFIX.unpack_from(cbuf, pos)
            if flag:
                self._fail(call, grpc.StatusCode.UNIMPLEMENTED, "the dev server does not support compressed messages")
                return
            if size > MAX_RECEIVE_MESSAGE:
                self._fail(
                    call,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Received message larger than max ({size} vs. {MAX_RECEIVE_MESSAGE})",
                )
                return
            if cend - pos - 5 < size:
                break
            call.inbox.append(bytes(cbuf[pos + 5 : pos + 5 + size]))
            pos += 5 + size
        del cbuf[:pos]
        call.wake()
        if flags & _END_STREAM:
            self._ended(call)

    def _ended(self, call: _Call) -> None:
        if call.method is None or call.ended:
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
        ctx = CallContext(self.loop, call.deadline, lambda data: self._push(call, data, later=True))
        try:
            try:
                if method.arity is Arity.UNARY_UNARY:
                    response = await method.handler(method.parse(call.inbox.popleft()), ctx)
                    self._push(call, _frame_messages(response))
                elif method.push:
                    await method.handler(self._requests(call), ctx)
                else:
                    arity = method.arity
                    arg = method.parse(call.inbox.popleft()) if arity is Arity.UNARY_STREAM else self._requests(call)
                    async with contextlib.aclosing(method.handler(arg, ctx)) as responses:
                        async for item in responses:
                            self._push(call, _frame_messages(item))
                            if call.pending:  # blocked by flow control: the handler waits
                                await self._drained(call)
                code, details = grpc.StatusCode.OK, ""
            except AbortError as err:
                code, details = err.code, err.details
            except Exception as exc:
                if isinstance(exc, ConnectionResetError):
                    raise
                log.exception("unexpected error in %s", getattr(method.handler, "__name__", method.handler))
                code, details = grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}"
            await self._drained(call)  # the status goes after every response
            self._finish(call, code, details)
        except asyncio.CancelledError:
            if call.timed_out:
                self._finish(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        except ConnectionResetError:
            pass  # the client went away while we were sending
        finally:
            if call.timer is not None:
                call.timer.cancel()

    def _push(self, call: _Call, data: bytes, *, later: bool = False) -> None:
        """Queue framed responses of ``call``; send them now, or (``later``) with this turn's write."""
        if self.closed or self.calls.get(call.sid) is not call:
            raise ConnectionResetError("the client connection or stream is gone")
        if not call.headers_sent:
            call.headers_sent = True
            self._send_headers(call.sid, _RESPONSE_HEADERS, False)
        call.pending += data
        if later:
            self._to_drain[call] = None
            if self._write_handle is None:
                self._write_handle = self.loop.call_soon(self._write)
        else:
            self._drain(call)

    def _drain(self, call: _Call) -> None:
        """Send as much of ``call``'s queued responses as the flow-control windows allow."""
        pending, sid = call.pending, call.sid
        while pending:
            size = min(self._send_window, call.send_window, self._peer_max_frame, len(pending))
            if size <= 0:
                return
            self._send_frame(_DATA, 0, sid, bytes(pending[:size]))
            del pending[:size]
            self._send_window -= size
            call.send_window -= size
        call.wake_drained()

    async def _drained(self, call: _Call) -> None:
        """Wait until everything queued for ``call`` went out.

        :raises ConnectionResetError: the client connection or stream is gone.
        """
        while call.pending or call in self._to_drain:
            if self.closed or self.calls.get(call.sid) is not call:
                raise ConnectionResetError("the client connection or stream is gone")
            call.window_waiter = self.loop.create_future()
            await call.window_waiter

    def _finish(self, call: _Call, code: grpc.StatusCode, details: str) -> None:
        if self.calls.pop(call.sid, None) is None or self.closed:
            return
        block = _literal(b"grpc-status", str(code.value[0]).encode())
        if details:
            block += _literal(b"grpc-message", quote(details, safe=_MESSAGE_SAFE).encode())
        if not call.headers_sent:
            block = _RESPONSE_HEADERS + block  # trailers-only response
        self._send_headers(call.sid, block, True)


class GrpcServer:
    """Serves ``methods`` (keyed by ``/package.Service/Method``) on one address.

    :param methods: the RPCs.
    :param ssl_context: TLS settings (see :func:`server_ssl_context`); ``None`` serves plaintext.
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
    """A TLS context for :class:`GrpcServer`: the server certificate, ALPN ``h2``, TLS 1.2+, and
    client certificates required and checked against ``client_ca_file`` when it is given.

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
    handler: Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any] | Awaitable[None]],
    parse: Callable[[bytes], Any],
) -> Method:
    """A stream-stream method: an async generator of responses, or a coroutine that pushes them
    with :meth:`CallContext.send_nowait`."""
    return Method(Arity.STREAM_STREAM, handler, parse, push=not inspect.isasyncgenfunction(handler))


def method_table(service: str, methods: Iterable[tuple[str, Method]]) -> dict[str, Method]:
    """Key ``methods`` by their HTTP/2 path, ``/service/name``."""
    return {f"/{service}/{name}": m for name, m in methods}
