"""The project's one nats-py adapter: the one place it reaches into nats-py's internals, and its
fallback. Neutral ground: imports nothing of the project.

Both the client's bulk path (``client/publishing/nats_engine.py``) and the dev server's NATS
ingest (``devserver/nats_ingest.py``) use this module; nothing else touches nats-py's private
members.

nats-py's public API costs a high-volume NATS user more per message than everything else
together: ``publish()`` is two awaited coroutines with connection checks per message, and every
message received goes through header parsing, a ``Msg`` object, an ``asyncio.Queue`` and a task
that awaits the subscription's callback. So, on nats-py versions this module was checked against
(and only when the client object has the expected shape), :class:`FastNats`

- appends a burst of ``PUB`` commands — each built by nats-py's own ``pub_cmd`` — to the
  client's pending buffer and kicks its flusher once (what ``publish()`` does per message);
- hands the messages of the subscriptions made through it (``subject, reply, payload`` as
  bytes; NATS headers are dropped) straight from nats-py's protocol parser to a plain function,
  by wrapping the client's ``_process_msg``. Other subscriptions go to nats-py's own code.

It also mends two races of nats-py 2.16: :func:`connect` makes again a connection its handshake
left half-open, and :func:`flush` keeps ``flush()``'s promise (nats-py's ``PING`` can overtake a
``SUB`` or ``PUB`` still queued for the flusher task). And :func:`abort` resets a connection
(TCP RST) instead of closing it: ``close()`` hands what nats-py buffers to the socket and the
kernel goes on sending it after the close, until the link carries it.

Anywhere else it uses the public API (``publish()``, ``subscribe(cb=...)``), with the same
results. The tripwire tests (``tests/client/test_nats_direct_fast.py``,
``tests/devserver/test_nats_acks.py``) fail loudly if the internals change shape; both paths
are tested. See docs/adr/0006-one-nats-py-adapter.md.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import nats.errors
import nats.protocol.parser
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol import command as _command

__all__ = [
    "AckHandler",
    "FastNats",
    "Route",
    "abort",
    "connect",
    "fast_nats",
    "flush",
    "internals_usable",
    "reset_on_close",
    "tcp_socket",
]

log = logging.getLogger(__name__)

#: Takes one message of a routed subscription, from the event loop: (subject, reply, payload), as
#: raw bytes. It must not block or await; it may keep the bytes.
Route = Callable[[bytes, bytes, bytes], None]
#: A function taking the payloads of messages received on an ack inbox, in arrival order.
AckHandler = Callable[[list[bytes]], None]

# nats-py releases whose internals (below) were read and tested: >= 2.6, < 3.
_CHECKED_FROM, _CHECKED_BELOW = (2, 6), (3, 0)
_ATTR = "_liftbridge_fast"  # the FastNats of a client, kept on the client object
# Public path only: nats-py hands a queued backlog to a callback without yielding, which would
# hold back everything else on the loop (acks, gRPC calls) until the backlog is done.
_YIELD_EVERY = 256


def _nats_version() -> tuple[int, ...] | None:
    try:
        raw = version("nats-py")
    except PackageNotFoundError:
        return None
    parts: list[int] = []
    for piece in raw.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts)


def _shape_problem() -> str | None:
    """What does not match the nats-py internals this module uses, or ``None``."""
    ver = _nats_version()
    if ver is None or not _CHECKED_FROM <= ver < _CHECKED_BELOW:
        return f"nats-py {ver} is outside the checked range {_CHECKED_FROM}..{_CHECKED_BELOW}"
    expected: dict[Any, list[str]] = {
        NatsClient._process_msg: ["self", "sid", "subject", "reply", "data", "headers"],
        NatsClient._flush_pending: ["self", "force_flush"],
        _command.pub_cmd: ["subject", "reply", "payload"],
    }
    for fn, params in expected.items():
        if list(inspect.signature(fn).parameters) != params:
            return f"{fn.__qualname__} takes {list(inspect.signature(fn).parameters)}, expected {params}"
    if not inspect.iscoroutinefunction(NatsClient._process_msg):
        return "Client._process_msg is no longer a coroutine function"
    try:
        parser_source = inspect.getsource(nats.protocol.parser.Parser.parse)
        process_source = inspect.getsource(NatsClient._process_msg)
    except (OSError, TypeError):  # no source shipped: the dispatch below cannot be verified
        return "the source of nats-py's protocol parser is not available to check"
    if "await self.nc._process_msg(" not in parser_source:
        return "the protocol parser no longer awaits nc._process_msg"
    # Messages that arrive before a route is registered wait in this queue (see FastNats.route).
    for needed in ("sub._pending_size += payload_size", "sub._pending_queue.put_nowait(msg)"):
        if needed not in process_source:
            return f"Client._process_msg no longer does {needed!r}"
    return None


_PROBLEM = _shape_problem()
if _PROBLEM is not None:
    log.info("NATS fast path: using nats-py's public API only (%s)", _PROBLEM)


def internals_usable() -> bool:
    """Whether this nats-py has the internals the fast paths use (checked once at import)."""
    return _PROBLEM is None


class FastNats:
    """A view of one nats-py client for high-volume users: burst publishing and routed
    subscriptions, through the internals when ``internals`` is true and the client has the
    expected attributes, else through the public API.

    Get the client's one with :func:`fast_nats` (on the client's event loop), or make it directly
    when the caller decides about the internals itself; use one per client object.

    :param nc: a nats-py client (connected or not yet).
    :param internals: use nats-py's internals; pass ``internals_usable()`` or ``False``.
    """

    def __init__(self, nc: NatsClient, *, internals: bool) -> None:
        self.nc = nc
        self.internals = internals and _client_shape_ok(nc)
        self._routes: dict[int, Route] = {}  # sid -> its route
        if self.internals:
            original = nc._process_msg
            routes = self._routes
            # The parser awaits what _process_msg returns: for routed messages, a future already
            # done, which costs less to await than a coroutine to create and run.
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)

            def process_msg(
                sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
            ) -> Awaitable[None]:
                route = routes.get(sid)
                if route is None:
                    return original(sid, subject, reply, data, headers)  # type: ignore[arg-type]
                # nats-py's own per-message work (statistics, Msg, queue, task) is skipped: the
                # client's in_msgs/in_bytes statistics do not count these messages.
                route(subject, reply, data)
                return done

            nc._process_msg = process_msg  # type: ignore[method-assign, assignment]

    async def route(
        self, subject: str, route: Route, *, queue: str = "", pending_msgs: int, pending_bytes: int
    ) -> Subscription:
        """Subscribe to ``subject`` (in queue group ``queue``, if given): ``route`` is called with
        every message, in arrival order, from the event loop.

        The subscription is a normal nats-py one (resubscribed on reconnect, ended with
        ``unsubscribe()`` after :meth:`forget`). With the internals, ``route`` is called from
        nats-py's parser; otherwise (and after :meth:`forget`) from the subscription callback,
        which yields to the loop every few hundred messages.

        :param pending_msgs: nats-py's limit of messages waiting for the callback (public path).
        :param pending_bytes: the same in bytes.
        :raises nats.errors.Error: as ``subscribe()`` raises (closed, draining, bad subject).
        """
        sub = await self.nc.subscribe(
            subject,
            queue=queue,
            cb=_callback(route),
            pending_msgs_limit=pending_msgs,
            pending_bytes_limit=pending_bytes,
        )
        if not self.internals:
            return sub
        # The SUB may reach the server while subscribe() awaits (its flush waits when the pending
        # buffer is full), so messages can arrive before the route is registered: nats-py queues
        # them for the callback. What is still queued is handed to the route here, before any later
        # message and with no await in between, so the order is kept and nothing is lost or handled
        # twice (the callback task takes a message off the queue and routes it in one step). After
        # forget(), the callback delivers again.
        waiting = sub._pending_queue
        while not waiting.empty():
            msg = waiting.get_nowait()
            waiting.task_done()
            sub._pending_size -= len(msg.data)
            route(msg.subject.encode(), msg.reply.encode(), msg.data)
        self._routes[sub._id] = route
        return sub

    async def subscribe(
        self, subject: str, handler: AckHandler, *, pending_msgs: int, pending_bytes: int
    ) -> Subscription:
        """Subscribe ``handler`` to ``subject``: it is called, from the event loop, with the
        payloads of the messages that arrived since its last call (a batch is cheaper to go
        through than one call per message). An exception it raises is logged, not propagated.

        :raises nats.errors.Error: as :meth:`route`.
        """
        loop = asyncio.get_running_loop()
        batch: list[bytes] = []

        def deliver() -> None:
            nonlocal batch
            payloads, batch = batch, []
            try:
                handler(payloads)
            except Exception:  # must not reach nats-py's parser or the loop: log it
                log.exception("the ack handler of %s failed", subject)

        def add(_subject: bytes, _reply: bytes, data: bytes) -> None:
            if not batch:
                loop.call_soon(deliver)
            batch.append(data)

        return await self.route(subject, add, pending_msgs=pending_msgs, pending_bytes=pending_bytes)

    def forget(self, sub: Subscription) -> None:
        """Stop routing ``sub``'s messages from the parser (call before unsubscribing); until the
        subscription ends, its callback still hands them to the route."""
        self._routes.pop(getattr(sub, "_id", None), None)  # type: ignore[arg-type]

    async def publish_burst(self, subjects: Sequence[str], frames: Sequence[bytes]) -> None:
        """Publish ``frames[i]`` on ``subjects[i]`` (no reply subject, no headers), in order.

        The caller has checked every frame against ``max_payload`` and every subject once. While
        reconnecting, the burst is buffered as ``publish()`` buffers.

        :raises nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
            nats.errors.OutboundBufferLimitError: as ``publish()`` would.
        """
        nc = self.nc
        if not self.internals:
            publish = nc.publish
            for subject, frame in zip(subjects, frames, strict=True):
                await publish(subject, frame)
            return
        # The checks publish() makes, once for the burst.
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        if nc.is_draining_pubs:
            raise nats.errors.ConnectionDrainingError
        pub_cmd = _command.pub_cmd
        cmds = [pub_cmd(s, "", f) for s, f in zip(subjects, frames, strict=True)]
        size = sum(map(len, cmds))
        if not nc.is_connected and (nc._max_pending_size <= 0 or size + nc._pending_data_size > nc._max_pending_size):
            raise nats.errors.OutboundBufferLimitError
        nc._pending.extend(cmds)
        nc._pending_data_size += size
        stats = nc.stats
        stats["out_msgs"] += len(cmds)
        stats["out_bytes"] += sum(map(len, frames))
        if nc._max_pending_size > 0 and nc._pending_data_size > nc._max_pending_size:
            await nc._flush_pending(force_flush=True)
        elif nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()


def _callback(route: Route) -> Callable[[Msg], Awaitable[None]]:
    """The public path: a nats-py subscription callback feeding ``route``."""
    handled = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal handled
        route(msg.subject.encode(), msg.reply.encode(), msg.data)
        handled += 1
        if handled >= _YIELD_EVERY:
            handled = 0
            await asyncio.sleep(0)

    return on_msg


def _client_shape_ok(nc: NatsClient) -> bool:
    """The client object has the attributes :class:`FastNats` touches, with the right types."""
    try:
        return (
            isinstance(nc._pending, list)
            and isinstance(nc._pending_data_size, int)
            and isinstance(nc._max_pending_size, int)
            and isinstance(nc.stats, dict)
            and "out_msgs" in nc.stats
            and "out_bytes" in nc.stats
            and isinstance(nc._subs, dict)
            and hasattr(nc, "_flush_queue")
            and hasattr(nc, "_process_msg")
        )
    except AttributeError:
        return False


#: Whether :func:`fast_nats` may use the internals for new FastNats objects (benchmarks and
#: tests switch it off to measure or exercise the public path).
USE_INTERNALS = True


def fast_nats(nc: NatsClient) -> FastNats:
    """The :class:`FastNats` of ``nc``, made on first use and kept on the client object."""
    fast: FastNats | None = getattr(nc, _ATTR, None)
    if fast is None:
        fast = FastNats(nc, internals=USE_INTERNALS and internals_usable())
        setattr(nc, _ATTR, fast)
    return fast


async def flush(nc: NatsClient, timeout: int = 10) -> None:
    """What ``nc.flush()`` promises: return once the server has processed every command issued
    on ``nc`` before the call (a subscription made just before is in place when this returns).

    nats-py 2.16's ``flush()`` writes its ``PING`` ahead of the commands still queued for the
    flusher task, so its ``PONG`` can arrive before a ``SUB`` made just before reached the server;
    a message another connection publishes right then is not delivered (seen 1 run in ~130).
    Here the queue is written out first. Without the internals this is ``flush()`` run twice:
    the first round trip lets the flusher task write the queue.

    :raises nats.errors.FlushTimeoutError: no ``PONG`` within ``timeout`` seconds.
    :raises nats.errors.ConnectionClosedError: ``nc`` is closed.
    """
    if internals_usable():
        # force_flush: wait until the flusher task has handed the queue to the transport, which
        # keeps the order of what it is given. Shielded because _flush_pending swallows the cancel
        # of a time-out and returns as if done (the PING below would then wait a second timeout).
        try:
            await asyncio.wait_for(asyncio.shield(nc._flush_pending(force_flush=True)), timeout)
        except TimeoutError:
            raise nats.errors.FlushTimeoutError from None
    else:
        await nc.flush(timeout=timeout)
    await nc.flush(timeout=timeout)


#: ``SO_LINGER`` on, 0 s: ``close()`` discards what the kernel has not sent and sends RST.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)
_CLOSE_GRACEFULLY = struct.pack("ii", 0, 0)


def tcp_socket(nc: NatsClient) -> tuple[Any, asyncio.WriteTransport] | None:
    """The TCP socket under ``nc``'s connection and the asyncio transport that writes to it (under
    TLS too: the plain one below it), or ``None`` when there is none to reach: not connected, a
    WebSocket connection, or a nats-py whose transport no longer has this shape
    (``tests/client/test_nats_abort.py`` fails then)."""
    writer = getattr(getattr(nc, "_transport", None), "_bare_io_writer", None)
    if not isinstance(writer, asyncio.StreamWriter):
        return None
    sock = writer.get_extra_info("socket")
    if sock is None or sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    return sock, writer.transport


def reset_on_close(nc: NatsClient, on: bool = True) -> bool:
    """Make every later close of ``nc``'s socket a reset (``SO_LINGER`` on, 0 s: the kernel drops
    what it has not sent and sends RST), whoever closes it (nats-py too, when it gives up on a
    stale connection); ``on=False`` makes closes graceful again.

    :returns: whether the socket was found and set (see :func:`tcp_socket`).
    """
    found = tcp_socket(nc)
    if found is None:
        return False
    try:
        found[0].setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE if on else _CLOSE_GRACEFULLY)
    except OSError:  # closed already
        return False
    return True


def abort(nc: NatsClient) -> bool:
    """Reset ``nc``'s TCP connection now (:func:`reset_on_close`, then an abort of the transport):
    nothing is sent or retransmitted after this, though segments already on the way still arrive
    (ahead of the RST). nats-py's own unsent buffer is dropped too; ``nc`` is left for
    ``nc.close()`` to tidy up (which then writes nothing).

    :returns: whether the connection was reset; ``False`` when :func:`tcp_socket` finds no socket
        (nothing is done: the caller closes as before, and what is buffered may still go out).
    """
    found = tcp_socket(nc)
    if found is None:
        transport = getattr(nc, "_transport", None)
        if transport is not None and not hasattr(transport, "_bare_io_writer"):  # WebSocket, or nats-py changed
            log.warning("cannot reset the NATS connection (no TCP socket under nats-py's transport); closing it")
        return False
    if not reset_on_close(nc):
        return False  # closed already (by nats-py): whatever the kernel still sends for it is out of reach
    if isinstance(getattr(nc, "_pending", None), list):
        # close() would write it to the transport and await a drain that never ends on a dead link.
        nc._pending = []
        nc._pending_data_size = 0
    found[1].abort()
    return True


#: How many times :func:`connect` tries before it gives up on half-open connections.
_CONNECT_TRIES = 3


async def connect(servers: str | list[str], **options: Any) -> NatsClient:
    """``nats.connect(servers, **options)``, retried when nats-py leaves the connection half-open.

    nats-py 2.16's handshake sends ``CONNECT`` and ``PING`` and takes the next line for the
    ``PONG``. nats-server sends its first keepalive ``PING`` about 2 s after accepting a client, so
    a client that took that long to answer ``INFO`` (a stalled or loaded process) reads that
    ``PING`` instead: ``connect()`` returns a client left in CONNECTING whose flusher task has
    already ended. Nothing it publishes or subscribes is ever written, and ``flush()`` returns at
    once. Such a client is closed and the connection made again.

    :raises nats.errors.Error, OSError, TimeoutError: as ``nats.connect()``; ``nats.errors.Error``
        also when every try came back half-open.
    """
    for _ in range(_CONNECT_TRIES):
        nc = NatsClient()
        await nc.connect(servers, **options)
        if nc.is_connected:
            return nc
        log.warning("nats-py left the NATS connection half-open (a PING came before the PONG); connecting again")
        await nc.close()
    raise nats.errors.Error(
        f"nats: {_CONNECT_TRIES} connections to {servers} came back half-open; "
        "the process may be too loaded to answer the server within 2 s"
    )
