"""The blocking transport: runs the shared operations (:mod:`..operations`) on synchronous gRPC
channels and the NATS connection, whose event loop is a private thread (:class:`LoopThread`: the
one thread switch of a blocking publish, here and nowhere else).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from typing import Any, TypeVar

import grpc

from .. import effects
from ..errors import UnavailableError
from .channels import StubCache, SyncChannelPool, end_call
from .nats import NatsLink

__all__ = ["LoopThread", "SyncTransport"]

_R = TypeVar("_R")
_T = TypeVar("_T")
_DONE = object()


#: How often a stream's watchdog checks the deadline of a timed read, seconds.
_WATCH_PERIOD = 0.05


class _SyncStream:
    """A streaming call. Bidi requests flow through a queue the gRPC thread drains.

    A blocking ``next`` on a call cannot time out, so a read with a timeout is guarded by a
    watchdog thread that cancels the call once the read's deadline passes (the read then raises
    :class:`ReadTimeout`; the stream is over). Handing every response over from a reader thread
    instead costs more client CPU per message than a pipelined publish spends on everything else.
    """

    def __init__(self, stub: Any, method: str, request: Any) -> None:
        self._requests: queue.Queue[Any] | None = None
        if request is None:
            self._requests = queue.Queue()
            self.call = getattr(stub, method)(self._request_iter())
        else:
            self.call = getattr(stub, method)(request)
        self._pending: tuple[float] | None = None  # deadline of the timed read in progress
        self._expired = False
        self._ended = threading.Event()
        self._watchdog: threading.Thread | None = None

    def _request_iter(self) -> Iterator[Any]:
        assert self._requests is not None
        while (item := self._requests.get()) is not _DONE:
            yield item

    def write(self, request: Any) -> None:
        assert self._requests is not None
        self._requests.put(request)

    def close_write(self) -> None:
        if self._requests is not None:
            self._requests.put(_DONE)

    def _watch(self) -> None:
        while not self._ended.wait(_WATCH_PERIOD):
            pending = self._pending
            if pending is not None and time.monotonic() >= pending[0] and pending is self._pending:
                self._expired = True
                self.call.cancel()
                return

    def read(self, timeout: float | None) -> Any:
        if timeout is None:
            return next(self.call, effects.END)
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, name="liftbridge-stream-watchdog", daemon=True)
            self._watchdog.start()
        self._pending = (time.monotonic() + timeout,)  # a fresh tuple per read: the watchdog compares identity
        try:
            return next(self.call, effects.END)
        except grpc.RpcError:
            if self._expired:
                raise effects.ReadTimeout() from None
            raise
        finally:
            self._pending = None

    def cancel(self) -> None:
        """End the call (also one the watchdog cancelled) and free its connection (``end_call``)."""
        self._ended.set()
        self.close_write()
        end_call(self.call)


class LoopThread:
    """A private event loop on a daemon thread: how the blocking client runs its NATS I/O.

    Started on first use; :meth:`run` may be called from any thread (calls run concurrently on
    the one loop, each with its own ack inbox).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="liftbridge-nats-loop", daemon=True)
                self._thread.start()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure()).result()

    def stop(self, last: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run ``last`` (e.g. closing a connection), stop the loop and join the thread; idempotent."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            if last is not None:
                last.close()
            return
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last, loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()


class SyncTransport:
    """Executes effects with blocking gRPC calls; NATS effects run on a private loop thread."""

    def __init__(self, pool: SyncChannelPool, nats: NatsLink) -> None:
        self._pool = pool
        self._nats = nats
        self._loop = LoopThread()
        self._stubs = StubCache()

    def close(self) -> None:
        self._loop.stop(self._nats.close())
        self._pool.close()

    def _stub(self, address: str, long_lived: bool = False) -> Any:
        return self._stubs.get((address, long_lived), self._pool.get(address, long_lived))

    def execute(self, effect: effects.Effect) -> Any:
        try:
            if isinstance(effect, effects.Unary):
                return getattr(self._stub(effect.address), effect.method)(effect.request, timeout=effect.timeout)
            if isinstance(effect, effects.Read):
                return effect.handle.read(effect.timeout)
            if isinstance(effect, effects.Write):
                return effect.handle.write(effect.request)
            if isinstance(effect, effects.OpenStream):
                return _SyncStream(self._stub(effect.address, effect.long_lived), effect.method, effect.request)
            if isinstance(effect, effects.CloseWrite):
                return effect.handle.close_write()
            if isinstance(effect, effects.Cancel):
                return effect.handle.cancel()
            if isinstance(effect, effects.Sleep):
                return time.sleep(effect.seconds)
            if isinstance(effect, effects.NatsCall):
                # The thread switch: the connection is opened (or reused) and used on the loop.
                return self._loop.run(self._on_connection(effect.fn, effect.fresh))
            if isinstance(effect, effects.DropNats):
                return self._loop.run(self._nats.discard(effect.flush_within))
        except grpc.RpcError as exc:
            raise effects.RpcFailure.of(exc) from exc
        raise TypeError(f"unknown effect {effect!r}")

    async def _on_connection(self, fn: Callable[[Any], Awaitable[_T]], fresh: bool) -> _T:
        return await fn(await self._nats.get(fresh=fresh))

    def drive(self, op: effects.Op[_R]) -> Generator[Any, None, _R]:
        """Execute ``op``'s effects; yield what it emits; return what it returns. Streams it
        opened are cancelled when it ends, however it ends."""
        opened: list[_SyncStream] = []
        send: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    effect = op.throw(error) if error is not None else op.send(send)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                send, error = None, None
                if isinstance(effect, effects.Emit):
                    yield effect.item
                    continue
                if isinstance(effect, effects.Pump):
                    # A subscription's hot loop: straight over the gRPC call, no round trip
                    # through the operation per message.
                    sink, take, send = effect.sink, effect.sink.take, effects.END
                    try:
                        for response in effect.handle.call:
                            item = take(response)
                            if item is not None:
                                yield item
                            if sink.done:
                                send = None
                                break
                    except grpc.RpcError as exc:
                        error = effects.RpcFailure.of(exc)
                    continue
                try:
                    send = self.execute(effect)
                except (effects.RpcFailure, effects.ReadTimeout, UnavailableError) as exc:
                    error = exc
                if isinstance(effect, effects.OpenStream):
                    opened.append(send)
        finally:
            op.close()
            for stream in opened:
                stream.cancel()

    def run(self, op: effects.Op[_R]) -> _R:
        """Execute a unary operation (one that emits nothing) and return its result."""
        driver = self.drive(op)
        try:
            next(driver)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        driver.close()
        raise AssertionError(f"{op!r} emitted an item; it is not a unary operation")
