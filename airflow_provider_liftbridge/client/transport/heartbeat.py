"""Keeping keepalive PINGs welcome on connections whose calls receive nothing for long.

Keepalive PINGs (:class:`~.channels.ChannelFactory`) are how a call notices a silent link. But a
gRPC server limits them: grpc-go (Liftbridge's) and grpc-core servers by default accept one PING
per 5 minutes on a connection on which they wrote nothing since the last PING, count each earlier
one as a strike, and after two strikes answer with GOAWAY ``too_many_pings`` and close the
connection. A subscription to a partition that receives nothing is such a connection: measured on
a real Liftbridge with PINGs every 10 s, it was closed after about 30 s (the client resubscribed,
and gRPC doubled that channel's PING interval, up to minutes). Liftbridge has no setting for it.

Whatever the server writes clears the strikes. So :data:`HEARTBEAT` makes a tiny call (a gRPC
health check, ``grpc.health.v1.Health/Check``, which Liftbridge answers and any other server
refuses as unimplemented: a write either way) on each watched channel every two PING intervals:
the server then never sees more than two PINGs in a row. A watched channel is one a long-lived
call (a subscription, a publish stream) was opened on; a channel with unary calls only needs none
(gRPC does not PING a connection without calls open).

The beat's own answer is ignored: noticing a silent link is the PINGs' job; a beat lost on one
costs nothing.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["HEARTBEAT", "Heartbeat"]

_METHOD = "/grpc.health.v1.Health/Check"
_EMPTY_REQUEST = b""  # HealthCheckRequest(service=""): no field set


def _raw(data: bytes) -> bytes:
    return data


@dataclass(slots=True)
class _Watched:
    channel: Any  # grpc.Channel or grpc.aio.Channel
    every: float
    timeout: float
    loop: asyncio.AbstractEventLoop | None  # the loop of an asyncio channel
    due: float


class Heartbeat:
    """Beats on watched channels from one daemon thread, started at the first :meth:`watch`."""

    def __init__(self) -> None:
        self._watched: dict[int, _Watched] = {}
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(
        self,
        channel: Any,
        keepalive_time: float,
        keepalive_timeout: float,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """Beat on ``channel`` every ``2 * keepalive_time`` seconds from now on (watched already: no
        change), each beat allowed ``keepalive_timeout`` seconds. ``loop``: the event loop of an
        asyncio channel (``None`` for a blocking one); its beats run there."""
        every = 2 * keepalive_time
        with self._wake:
            if id(channel) in self._watched:
                return
            self._watched[id(channel)] = _Watched(channel, every, keepalive_timeout, loop, time.monotonic() + every)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="liftbridge-heartbeat", daemon=True)
                self._thread.start()
            self._wake.notify()

    def forget(self, channel: Any) -> None:
        """Stop beating on ``channel`` (it is being closed); a channel not watched is ignored."""
        with self._wake:
            self._watched.pop(id(channel), None)

    def watched(self) -> int:
        """How many channels are watched (for tests and diagnostics)."""
        with self._wake:
            return len(self._watched)

    def _run(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [w for w in self._watched.values() if w.due <= now]
                for w in due:
                    w.due = now + w.every
                nearest = min((w.due for w in self._watched.values()), default=now + 60.0)
                if not due:
                    self._wake.wait(nearest - now)
                    continue
            for w in due:
                self._beat(w)

    def _beat(self, watched: _Watched) -> None:
        try:
            if watched.loop is None:
                call = watched.channel.unary_unary(_METHOD, request_serializer=_raw, response_deserializer=_raw)
                call.future(_EMPTY_REQUEST, timeout=watched.timeout).add_done_callback(_ignore)
            else:
                # The coroutine is made on the loop: one made here would never be awaited if the
                # loop closed meanwhile.
                watched.loop.call_soon_threadsafe(_start_beat, watched)
        except Exception:  # a channel closed meanwhile, a loop shut down: nothing to keep alive
            self.forget(watched.channel)


#: Beats in flight on event loops (a loop keeps only weak references to its tasks).
_IN_FLIGHT: set[asyncio.Task[None]] = set()


def _start_beat(watched: _Watched) -> None:
    task = asyncio.ensure_future(_beat_async(watched))
    _IN_FLIGHT.add(task)
    task.add_done_callback(_beat_done)


def _beat_done(task: asyncio.Task[None]) -> None:
    _IN_FLIGHT.discard(task)
    _ignore(task)


async def _beat_async(watched: _Watched) -> None:
    call = watched.channel.unary_unary(_METHOD, request_serializer=_raw, response_deserializer=_raw)
    await call(_EMPTY_REQUEST, timeout=watched.timeout)


def _ignore(future: Any) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: an unanswered or refused beat is no error of anyone's


#: The one heartbeat of this process.
HEARTBEAT = Heartbeat()


def _after_fork_in_child() -> None:
    # A forked child has none of the parent's threads, and its channels are the parent's: it
    # starts with nothing watched and starts its own thread when it watches a channel of its own.
    HEARTBEAT._watched = {}
    HEARTBEAT._wake = threading.Condition()
    HEARTBEAT._thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)
