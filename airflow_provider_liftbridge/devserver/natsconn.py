"""A small NATS client for the dev server's ingest: subscriptions delivered straight from the socket, batched publishes.

Why not nats-py here: nats-py hands every incoming message to a per-subscription task
through an ``asyncio.Queue`` and builds a ``Msg`` object for it, and every publish is its
own call; on the ingest path that machinery cost more CPU than storing the message.
This client parses ``MSG`` frames in ``data_received`` and calls one function per
message synchronously, and buffers publishes (acks) into one socket write per event-loop
turn. It speaks only what the ingest needs: ``CONNECT`` (no NATS headers; user/password or
token from the URL; no TLS), ``SUB``, ``UNSUB``, ``PUB``, ``PING``/``PONG``, and it reconnects
forever to the same URL, re-subscribing every live subscription, when the connection drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

log = logging.getLogger(__name__)

#: ``handler(subject, reply, payload, received_ns)``, called for every message of its subscription,
#: synchronously; ``received_ns`` is when the socket read that brought it returned (one value per read).
MessageHandler = Callable[[str, str, bytes, int], None]

_CRLF = b"\r\n"
_RECONNECT_WAIT = 0.1


class NatsConnectionError(ConnectionError):
    """The NATS connection is closed or could not be established."""


def _parse_url(url: str) -> tuple[str, int, dict[str, str]]:
    """Host, port and CONNECT credentials (``user:pass@`` or a ``token@``) of a ``nats://`` URL."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if parts.scheme not in ("nats", "tcp"):
        raise ValueError(f"NATS URL {url!r} must use nats:// (TLS and WebSocket NATS are not supported here)")
    auth: dict[str, str] = {}
    if parts.username and parts.password is not None:
        auth = {"user": unquote(parts.username), "pass": unquote(parts.password)}
    elif parts.username:
        auth = {"auth_token": unquote(parts.username)}
    return parts.hostname or "127.0.0.1", parts.port or 4222, auth


def _deliver(handler: MessageHandler, subject: str, reply: str, payload: bytes, now: int) -> None:
    try:
        handler(subject, reply, payload, now)
    except Exception:  # one bad message must not break the connection
        log.exception("handling a NATS message on %r failed", subject)


class _Protocol(asyncio.Protocol):
    """One TCP connection: parses what the server sends and calls back into :class:`NatsConnection`."""

    def __init__(self, owner: NatsConnection) -> None:
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.info: asyncio.Future[dict[str, object]] = asyncio.get_running_loop().create_future()
        self.last_error = ""
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.info.done():
            self.info.set_exception(NatsConnectionError(f"connection closed before INFO: {exc}"))
        self.owner._lost(self)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        end = len(buf)
        handlers = self.owner._handlers
        now = time.time_ns()
        try:
            while pos < end:
                eol = buf.find(_CRLF, pos)
                if eol < 0:
                    break
                if buf[pos] == 0x4D:  # b"M": MSG <subject> <sid> [reply] <#bytes>
                    parts = bytes(buf[pos + 4 : eol]).split()
                    size = int(parts[-1])
                    start = eol + 2
                    stop = start + size
                    if stop + 2 > end:
                        break  # the payload is not all here yet
                    handler = handlers.get(int(parts[1]))
                    if handler is not None:
                        reply = parts[2].decode() if len(parts) == 4 else ""
                        try:
                            handler(parts[0].decode(), reply, bytes(buf[start:stop]), now)
                        except Exception:  # one bad message must not break the connection
                            log.exception("handling a NATS message on %r failed", parts[0])
                    pos = stop + 2
                    continue
                if buf[pos] == 0x48:  # b"H": HMSG <subject> <sid> [reply] <#header bytes> <#total bytes>
                    parts = bytes(buf[pos + 5 : eol]).split()
                    start = eol + 2
                    stop = start + int(parts[-1])
                    if stop + 2 > end:
                        break
                    handler = handlers.get(int(parts[1]))
                    if handler is not None:
                        reply = parts[2].decode() if len(parts) == 5 else ""
                        # NATS headers are not part of a Liftbridge message: only the payload is kept.
                        _deliver(handler, parts[0].decode(), reply, bytes(buf[start + int(parts[-2]) : stop]), now)
                    pos = stop + 2
                    continue
                self._control(bytes(buf[pos:eol]))
                pos = eol + 2
        finally:
            del buf[:pos]

    def _control(self, line: bytes) -> None:
        if line.startswith(b"PING"):
            self.owner._write(b"PONG\r\n")
        elif line.startswith(b"PONG"):
            self.owner._pong()
        elif line.startswith(b"INFO "):
            if not self.info.done():
                self.info.set_result(json.loads(line[5:]))
        elif line.startswith(b"-ERR"):
            self.last_error = line[5:].decode(errors="replace").strip()
            log.warning("NATS server error: %s", self.last_error)
        # +OK and anything else: nothing to do (verbose is off).


class NatsConnection:
    """A NATS connection that delivers subscribed messages to ``handler`` and survives server restarts.

    :param url: ``nats://host:port`` of the server.
    :param name: the client name the server shows.
    """

    def __init__(self, url: str, *, name: str = "liftbridge-devserver") -> None:
        self.url = url
        self.host, self.port, self._auth = _parse_url(url)
        #: The URL without credentials, for messages and logs.
        self.display_url = f"nats://{self.host}:{self.port}"
        self.name = name
        self._proto: _Protocol | None = None
        self._subs: dict[int, tuple[str, str]] = {}
        self._handlers: dict[int, MessageHandler] = {}
        self._next_sid = 1
        self._out: list[bytes] = []
        self._out_handle: asyncio.Handle | None = None
        self._pongs: list[asyncio.Future[None]] = []
        self._closed = False
        self._established = False  # reconnecting starts only once a connection has worked
        self._reconnect_task: asyncio.Task[None] | None = None
        #: Completed (re)connections; the first connect counts as 1.
        self.connects = 0

    @property
    def connected(self) -> bool:
        return self._proto is not None

    async def connect(self, timeout: float = 5.0) -> None:
        """Connect (and subscribe everything subscribed so far).

        :raises NatsConnectionError: the server cannot be reached within ``timeout``.
        """
        try:
            await asyncio.wait_for(self._open(), timeout)
        except (OSError, TimeoutError, NatsConnectionError) as exc:
            raise NatsConnectionError(
                f"cannot connect to NATS at {self.display_url}: {exc or type(exc).__name__}"
            ) from exc

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(lambda: _Protocol(self), self.host, self.port)
        await proto.info
        assert proto.transport is not None
        connect = {
            "verbose": False,
            "pedantic": False,
            "name": self.name,
            "lang": "python",
            "version": "devserver",
            "protocol": 1,
            "headers": False,
            "no_responders": False,
            **self._auth,
        }
        lines = [b"CONNECT " + json.dumps(connect).encode() + _CRLF]
        # Re-subscribe before anything queued meanwhile goes out.
        lines += [self._sub_cmd(sid, subject, queue) for sid, (subject, queue) in self._subs.items()]
        lines.append(b"PING\r\n")
        pong: asyncio.Future[None] = loop.create_future()
        self._pongs = [pong]
        proto.transport.write(b"".join(lines))
        self._proto = proto
        await asyncio.wait({pong, proto.lost}, return_when=asyncio.FIRST_COMPLETED)
        failed = not pong.done() or pong.exception() is not None or proto.lost.done()
        if failed:
            # Refused (bad credentials: the server sends -ERR and closes) or dropped meanwhile.
            if self._proto is proto:
                self._proto = None
            proto.transport.close()
            reason = f": {proto.last_error}" if proto.last_error else ""
            raise NatsConnectionError(f"the NATS server closed the connection during CONNECT{reason}")
        self._established = True
        self.connects += 1
        if self._out:
            self._schedule_out()

    def _lost(self, proto: _Protocol) -> None:
        if self._proto is not proto:
            return
        self._proto = None
        for fut in self._pongs:
            if not fut.done():
                fut.set_exception(NatsConnectionError("the NATS connection was lost"))
        self._pongs = []
        if not self._closed and self._established and self._reconnect_task is None:
            log.warning("lost the NATS connection to %s; reconnecting", self.display_url)
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect())

    async def _reconnect(self) -> None:
        try:
            while not self._closed:
                await asyncio.sleep(_RECONNECT_WAIT)
                try:
                    await asyncio.wait_for(self._open(), 5.0)
                except (OSError, TimeoutError, NatsConnectionError):
                    continue
                log.warning("reconnected to NATS at %s", self.display_url)
                return
        finally:
            self._reconnect_task = None

    # -- subscriptions ------------------------------------------------------------
    @staticmethod
    def _sub_cmd(sid: int, subject: str, queue: str) -> bytes:
        return f"SUB {subject} {queue} {sid}\r\n".encode() if queue else f"SUB {subject} {sid}\r\n".encode()

    def subscribe(self, subject: str, handler: MessageHandler, queue: str = "") -> int:
        """Subscribe ``subject`` (in queue group ``queue`` if given) with ``handler``; return the subscription id."""
        sid = self._next_sid
        self._next_sid += 1
        self._subs[sid] = (subject, queue)
        self._handlers[sid] = handler
        self._write(self._sub_cmd(sid, subject, queue))
        return sid

    def unsubscribe(self, sid: int) -> None:
        """Stop the subscription ``sid`` (messages already read are still delivered)."""
        self._handlers.pop(sid, None)
        if self._subs.pop(sid, None) is not None:
            self._write(f"UNSUB {sid}\r\n".encode())

    # -- publishing -----------------------------------------------------------------
    def publish(self, subject: str, payload: bytes) -> None:
        """Queue a publish; everything queued in one loop turn goes out in one write.

        Publishes queued while disconnected go out after the reconnect.

        :raises NatsConnectionError: the connection was closed with :meth:`close`.
        """
        if self._closed:
            raise NatsConnectionError("the dev server's NATS connection is closed")
        self._out.append(b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload))
        if self._out_handle is None:
            self._schedule_out()

    def publish_many(self, messages: list[tuple[str, bytes]]) -> None:
        """Queue several publishes at once (see :meth:`publish`).

        :raises NatsConnectionError: the connection was closed with :meth:`close`.
        """
        if self._closed:
            raise NatsConnectionError("the dev server's NATS connection is closed")
        self._out.append(b"".join([b"PUB %s %d\r\n%s\r\n" % (s.encode(), len(p), p) for s, p in messages]))
        if self._out_handle is None:
            self._schedule_out()

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if self._out_handle is None:
            self._schedule_out()

    def _schedule_out(self) -> None:
        self._out_handle = asyncio.get_running_loop().call_soon(self._write_out)

    def _write_out(self) -> None:
        self._out_handle = None
        proto = self._proto
        if proto is None or proto.transport is None or not self._out:
            return  # kept for after the reconnect
        out, self._out = self._out, []
        proto.transport.write(b"".join(out))

    async def flush(self, timeout: float = 5.0) -> None:
        """Send what is queued and wait until the server has processed it (PING/PONG).

        :raises NatsConnectionError: not connected, or the connection dropped meanwhile.
        :raises TimeoutError: no PONG within ``timeout``.
        """
        if self._proto is None:
            raise NatsConnectionError(f"not connected to NATS at {self.display_url}")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(fut)
        self._write(b"PING\r\n")
        await asyncio.wait_for(fut, timeout)

    def _pong(self) -> None:
        if self._pongs:
            fut = self._pongs.pop(0)
            if not fut.done():
                fut.set_result(None)

    async def close(self) -> None:
        """Send what is queued, then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect_task
        if self._out_handle is not None:
            self._out_handle.cancel()
        self._write_out()
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(proto.lost), 2.0)
