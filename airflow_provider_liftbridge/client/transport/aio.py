"""The asyncio transport: runs the shared operations (:mod:`..operations`) with grpc.aio on shared
channels and the NATS connection on the caller's event loop, and reads subscriptions either on
grpc.aio too or, by default, on a blocking gRPC stream in a worker thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from time import monotonic
from typing import Any, TypeVar

import grpc
import grpc.aio

from airflow_provider_liftbridge._proto import api_pb2_grpc

from .. import effects
from ..base import SubscriptionReader
from ..errors import ClientClosedError, UnavailableError
from .channels import ASYNC_REGISTRY, SYNC_REGISTRY, ChannelFactory, SlotTurns, StubCache, end_call
from .nats import NatsLink

__all__ = ["AsyncTransport"]

_R = TypeVar("_R")
_Key = tuple[int, str, ChannelFactory, int]
_SyncKey = tuple[str, ChannelFactory, int]
_EOF = grpc.aio.EOF

#: Responses a threaded subscription holds before its reader thread waits for the consumer; the
#: thread goes on once the consumer has taken the buffer down to half. This bounds the memory a
#: large backlog can take when the consumer is slower than the stream.
BUFFER_HIGH = 1024
BUFFER_LOW = BUFFER_HIGH // 2
#: When the consumer had to wait less than BUSY_WAIT seconds for a response and then finds
#: fewer than LINGER_BELOW buffered, it lets the reader thread fill the buffer for LINGER seconds
#: before going on. Without this, a consumer faster than the stream takes one message per
#: thread wake-up (several times the CPU per message; docs/client.md has the figures); with it,
#: a busy stream is delivered in bursts of a hundred or so. A quiet stream (waits longer than BUSY_WAIT) is
#: delivered at once, so a lone message is never delayed.
LINGER_BELOW = 32
LINGER = 0.0005
BUSY_WAIT = 0.002

#: Reader threads the process runs at most. A subscription opened while that many run is read
#: with grpc.aio instead: many concurrent subscriptions (e.g. triggers that did not ask for the
#: aio reader) never mean as many threads.
MAX_READER_THREADS = 64


class _ReaderCount:
    """How many reader threads run in this process."""

    def __init__(self) -> None:
        self.running = 0
        self._lock = threading.Lock()

    def try_start(self) -> bool:
        with self._lock:
            if self.running >= MAX_READER_THREADS:
                return False
            self.running += 1
            return True

    def stopped(self) -> None:
        with self._lock:
            self.running -= 1


_READERS = _ReaderCount()


def _closed_error() -> ClientClosedError:
    return ClientClosedError("the client was closed while this call was in progress; create a new one")


def _task_cancelled() -> bool:
    """True when the running task itself is being cancelled (not merely a call under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _AsyncStream:
    """A streaming call. A server-streaming call (``responses_only``) is read through its
    response iterator, a little cheaper per message than ``call.read()``; a bidi call with
    ``read()``. A read that times out ends the stream either way."""

    def __init__(self, call: Any, responses_only: bool) -> None:
        self.call = call
        self.next_response: Callable[[], Awaitable[Any]] | None = call.__aiter__().__anext__ if responses_only else None

    async def _read(self) -> Any:
        if self.next_response is None:
            response = await self.call.read()
            return effects.END if response is _EOF else response
        try:
            return await self.next_response()
        except StopAsyncIteration:
            return effects.END

    async def read(self, timeout: float | None) -> Any:
        if timeout is None:
            return await self._read()
        try:
            return await asyncio.wait_for(self._read(), timeout)
        except TimeoutError:
            raise effects.ReadTimeout() from None

    def cancel(self) -> None:
        self.call.cancel()


class _Stop:
    """What a reader thread queues last: ``error`` to raise in the consumer, or ``None`` when
    the server closed the stream."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _ThreadedStream:
    """A server-streaming call read on a blocking gRPC stream by a worker thread.

    The thread appends each response to :attr:`buffer` and wakes the event loop only when the
    consumer is waiting for one (one ``call_soon_threadsafe`` per burst, not per message). Once
    the buffer holds :data:`BUFFER_HIGH` responses the thread waits until the consumer has taken
    it down to :data:`BUFFER_LOW`. The stream's end (or failure) is queued after the last response,
    so everything read before it is delivered first. :meth:`cancel` cancels the call and frees a
    waiting thread: the thread ends at once.
    """

    def __init__(self, channel: grpc.Channel, method: str, request: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.buffer: deque[Any] = deque()
        self._loop = loop
        self._call: Any = None
        self._cancelled = False
        #: The consumer waits on ``_waiter``: the thread must wake it after its next append.
        self._sleeping = False
        self._waiter: asyncio.Future[None] | None = None
        #: The thread waits for the consumer to make room.
        self.paused = False
        self._room = threading.Condition(threading.Lock())
        open_call = getattr(api_pb2_grpc.APIStub(channel), method)  # type: ignore[no-untyped-call]
        self.thread = threading.Thread(
            target=self._read_all, args=(open_call, request), name=f"liftbridge-{method.lower()}-reader", daemon=True
        )
        self.thread.start()  # counted in _READERS by the caller; _read_all uncounts it when done

    # --- the reader thread ------------------------------------------------------------------

    def _read_all(self, open_call: Callable[[Any], Any], request: Any) -> None:
        try:
            self._read_responses(open_call, request)
        finally:
            _READERS.stopped()

    def _read_responses(self, open_call: Callable[[Any], Any], request: Any) -> None:
        buffer = self.buffer
        append = buffer.append
        stop = _Stop(None)
        try:
            call = self._call = open_call(request)
            if self._cancelled:  # cancelled while the call was being opened
                call.cancel()
            for response in call:
                append(response)
                if self._sleeping:
                    self._sleeping = False
                    self._loop.call_soon_threadsafe(self._wake)
                if len(buffer) >= BUFFER_HIGH:
                    self._wait_for_room()
        except grpc.RpcError as exc:
            stop = _Stop(effects.RpcFailure.of(exc))
        except BaseException as exc:  # handed to the consumer, whatever it is
            if isinstance(exc, RuntimeError) and self._loop.is_closed():  # nobody is left to read
                return
            stop = _Stop(exc)
        finally:
            if self._call is not None:
                end_call(self._call)  # this thread is the call's reader: only it can free the connection
        append(stop)
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:
            pass  # the event loop is closed

    def _wait_for_room(self) -> None:
        with self._room:
            self.paused = True
            # Checked under the lock after setting ``paused``: a consumer that drained the buffer
            # before seeing the flag leaves it short, one that sees the flag notifies (see resume).
            while self.paused and len(self.buffer) > BUFFER_LOW and not self._cancelled:
                self._room.wait()
            self.paused = False

    # --- the event loop ---------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Return once the buffer holds something (possibly at once)."""
        waiter = self._waiter = self._loop.create_future()
        self._sleeping = True
        if self.buffer:  # appended before the thread could see that we sleep
            return
        await waiter

    def resume(self) -> None:
        """Let a paused reader thread go on (call once the buffer is down to BUFFER_LOW)."""
        with self._room:
            self.paused = False
            self._room.notify()

    async def read(self, timeout: float | None) -> Any:
        """The next response, or END once the server closed the stream; raises the stream's
        failure (and :class:`ReadTimeout` after ``timeout`` seconds without a response)."""
        if not self.buffer:
            try:
                async with asyncio.timeout(timeout):
                    while not self.buffer:
                        await self.wait()
            except TimeoutError:
                self.cancel()
                raise effects.ReadTimeout() from None
        item = self.buffer.popleft()
        if type(item) is _Stop:
            self.buffer.appendleft(item)  # the stream stays over for later reads
            if item.error is not None:
                raise item.error
            return effects.END
        if self.paused and len(self.buffer) <= BUFFER_LOW:
            self.resume()
        return item

    def cancel(self) -> None:
        """Cancel the call and release the thread; idempotent, callable from any thread."""
        self._cancelled = True
        call = self._call
        if call is not None:
            call.cancel()
        with self._room:
            self._room.notify()


class _Reply:
    """What goes back into a driven operation for the effect it yielded last: ``value``, or
    ``error`` to raise in it."""

    __slots__ = ("error", "value")

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None


class _PumpEnd:
    """How a pumped stream ended, as what goes back into the operation: :data:`~..effects.END`
    when the server closed it, ``None`` once the sink is done (:meth:`done`), else its failure
    (the client's closing when :meth:`AsyncTransport.close` ended it). A context around the loop:
    the failures it maps end the loop without leaving it; anything else goes on up."""

    __slots__ = ("_reply", "_transport")

    def __init__(self, transport: AsyncTransport, reply: _Reply) -> None:
        self._transport, self._reply = transport, reply

    def done(self) -> None:
        """The sink wants nothing more."""
        self._reply.value = None

    def __enter__(self) -> _PumpEnd:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        closed = self._transport.closed
        if exc is None or isinstance(exc, StopAsyncIteration):  # (the server closed a grpc.aio stream)
            return exc is not None
        if isinstance(exc, grpc.RpcError):
            error: BaseException = effects.RpcFailure.of(exc)
        elif isinstance(exc, effects.RpcFailure):
            error = exc
        elif isinstance(exc, asyncio.CancelledError) and closed and not _task_cancelled():
            error = exc  # grpc.aio's end of a call that close() cancelled
        else:
            return False
        self._reply.error = _closed_error() if closed else error
        return True


async def _threaded_items(handle: _ThreadedStream, sink: effects.Sink, end: _PumpEnd) -> AsyncGenerator[Any, None]:
    """The items of a stream read by a reader thread, taken from its buffer as it fills."""
    buffer, take = handle.buffer, sink.take
    popleft = buffer.popleft
    with end:
        while True:
            try:
                response = popleft()
            except IndexError:
                await _linger(handle)
                continue
            if type(response) is _Stop:
                buffer.appendleft(response)  # the stream stays over for later reads
                if response.error is not None:
                    raise response.error
                return  # the server closed the stream
            if handle.paused and len(buffer) <= BUFFER_LOW:
                handle.resume()
            item = take(response)
            if item is not None:
                yield item
            if sink.done:
                end.done()
                return


async def _linger(handle: _ThreadedStream) -> None:
    """Wait for the reader thread to buffer more. A busy stream whose burst was short gets a
    moment to fill the buffer, or every message would cost a thread wake-up."""
    waited = monotonic()
    await handle.wait()
    if len(handle.buffer) < LINGER_BELOW and monotonic() - waited < BUSY_WAIT:
        await asyncio.sleep(LINGER)


async def _aio_items(handle: _AsyncStream, sink: effects.Sink, end: _PumpEnd) -> AsyncGenerator[Any, None]:
    """The items of a stream read with grpc.aio, through its response iterator."""
    next_response, take = handle.next_response, sink.take
    assert next_response is not None  # a server-streaming call
    with end:
        while True:
            item = take(await next_response())
            if item is not None:
                yield item
            if sink.done:
                end.done()
                return


class AsyncTransport:
    """Executes effects with grpc.aio; channels come from the process-wide registries.

    With ``reader="thread"``, server-streaming calls (subscriptions) are read by a worker thread
    on a blocking channel (:class:`_ThreadedStream`); everything else runs on grpc.aio.
    """

    def __init__(
        self, factory: ChannelFactory, subscription_channels: int, nats: NatsLink, reader: SubscriptionReader
    ) -> None:
        self._factory = factory
        self._nats = nats
        self._reader = reader
        self._slots = SlotTurns(subscription_channels)
        self._held: dict[tuple[str, int], tuple[grpc.aio.Channel, _Key]] = {}
        self._stubs = StubCache()
        self._held_sync: dict[tuple[str, int], tuple[grpc.Channel, _SyncKey]] = {}
        self._streams: set[_AsyncStream | _ThreadedStream] = set()  # open streams, cancelled by close()
        self.closed = False

    def _check_open(self) -> None:
        if self.closed:
            raise ClientClosedError("the client is closed; create a new one")

    def _stub(self, address: str, long_lived: bool = False) -> Any:
        self._check_open()
        slot = self._slots.next(address, long_lived)
        held = self._held.get((address, slot))
        if held is None:
            held = self._held[(address, slot)] = ASYNC_REGISTRY.acquire(self._factory, address, slot)
        if long_lived:
            self._factory.watch(held[0], asyncio.get_running_loop())
        return self._stubs.get((address, slot), held[0])

    def _sync_channel(self, address: str) -> grpc.Channel:
        self._check_open()
        slot = self._slots.next(address, True)
        held = self._held_sync.get((address, slot))
        if held is None:
            held = self._held_sync[(address, slot)] = SYNC_REGISTRY.acquire(self._factory, address, slot)
        return held[0]

    def _open_stream(self, effect: effects.OpenStream) -> _AsyncStream | _ThreadedStream:
        stream: _AsyncStream | _ThreadedStream
        if effect.request is None:
            stream = _AsyncStream(getattr(self._stub(effect.address), effect.method)(), responses_only=False)
        elif self._reader == "thread" and _READERS.try_start():
            try:
                channel = self._sync_channel(effect.address)
                stream = _ThreadedStream(channel, effect.method, effect.request, asyncio.get_running_loop())
            except BaseException:
                _READERS.stopped()  # no thread was started
                raise
        else:
            method = getattr(self._stub(effect.address, effect.long_lived), effect.method)
            stream = _AsyncStream(method(effect.request), responses_only=True)
        self._streams.add(stream)
        return stream

    async def close(self) -> None:
        self.closed = True
        # Cancel this client's own streams first: its channels may be shared and stay open.
        for stream in list(self._streams):
            stream.cancel()
        held, self._held = list(self._held.values()), {}
        held_sync, self._held_sync = list(self._held_sync.values()), {}
        for _, key in held:
            await ASYNC_REGISTRY.release(key)
        for _, sync_key in held_sync:
            SYNC_REGISTRY.release(sync_key)
        await self._nats.close()

    async def execute(self, effect: effects.Effect) -> Any:
        try:
            if isinstance(effect, effects.Unary):
                stub = self._stub(effect.address)
                return await getattr(stub, effect.method)(effect.request, timeout=effect.timeout)
            if isinstance(effect, effects.Read):
                return await effect.handle.read(effect.timeout)
            if isinstance(effect, effects.Write):
                return await effect.handle.call.write(effect.request)
            if isinstance(effect, effects.OpenStream):
                return self._open_stream(effect)
            if isinstance(effect, effects.CloseWrite):
                return await effect.handle.call.done_writing()
            if isinstance(effect, effects.Cancel):
                return effect.handle.cancel()
            if isinstance(effect, effects.Sleep):
                return await asyncio.sleep(effect.seconds)
            if isinstance(effect, effects.NatsCall):
                self._check_open()
                return await effect.fn(await self._nats.get(fresh=effect.fresh))
            if isinstance(effect, effects.DropNats):
                return await self._nats.discard(effect.flush_within)
        except grpc.RpcError as exc:
            raise effects.RpcFailure.of(exc) from exc
        except asyncio.InvalidStateError as exc:  # writing to a call that already ended
            raise effects.RpcFailure(grpc.StatusCode.UNAVAILABLE, "the stream ended while writing") from exc
        except asyncio.CancelledError:
            # grpc.aio ends a call cancelled under us (close() cancels the client's streams and
            # closes its channels) with CancelledError: that is the client closing, unless this
            # task itself is being cancelled.
            if self.closed and not _task_cancelled():
                raise _closed_error() from None
            raise
        raise TypeError(f"unknown effect {effect!r}")

    async def drive(self, op: effects.Op[Any], returned: list[Any] | None = None) -> AsyncGenerator[Any, None]:
        """Execute ``op``'s effects and yield what it emits; its return value is appended to
        ``returned``. Streams it opened are cancelled when it ends.

        Each turn: the answer to the last effect goes into the operation, which yields the next
        effect; an ``Emit`` is yielded, a ``Pump`` runs its stream (:meth:`_pumped`), any other
        effect is carried out (:meth:`_carry_out`)."""
        opened: list[_AsyncStream | _ThreadedStream] = []
        reply = _Reply()
        try:
            while True:
                try:
                    effect = op.throw(reply.error) if reply.error is not None else op.send(reply.value)
                except StopIteration as stop:
                    if returned is not None:
                        returned.append(stop.value)
                    return
                reply.value = reply.error = None
                if isinstance(effect, effects.Emit):
                    yield effect.item
                    continue
                if not isinstance(effect, effects.Pump):
                    await self._carry_out(effect, reply, opened)
                    continue
                async with aclosing(self._pumped(effect, reply)) as items:
                    async for item in items:
                        yield item
        finally:
            op.close()
            for stream in opened:
                stream.cancel()
                self._streams.discard(stream)

    async def _carry_out(
        self, effect: effects.Effect, reply: _Reply, opened: list[_AsyncStream | _ThreadedStream]
    ) -> None:
        """Execute ``effect``: its result goes back into the operation, or its failure (the
        client's closing, once it is closed); a stream it opened is remembered in ``opened``."""
        try:
            reply.value = await self.execute(effect)
        except (effects.RpcFailure, effects.ReadTimeout, UnavailableError) as exc:
            reply.error = _closed_error() if self.closed else exc
            return
        if isinstance(effect, effects.OpenStream):
            opened.append(reply.value)

    def _pumped(self, effect: effects.Pump, reply: _Reply) -> AsyncGenerator[Any, None]:
        """A subscription's hot loop: what ``effect.sink`` makes of each response of the stream,
        straight over the responses with no round trip through the operation per message. What
        goes back into the operation when it ends is in ``reply`` (:class:`_PumpEnd`)."""
        reply.value = effects.END
        end = _PumpEnd(self, reply)
        if type(effect.handle) is _ThreadedStream:
            return _threaded_items(effect.handle, effect.sink, end)
        return _aio_items(effect.handle, effect.sink, end)

    async def run(self, op: effects.Op[_R]) -> _R:
        """Execute a unary operation (one that emits nothing) and return its result."""
        returned: list[_R] = []
        driver = self.drive(op, returned)
        try:
            async for _ in driver:
                raise AssertionError(f"{op!r} emitted an item; it is not a unary operation")
        finally:
            await driver.aclose()
        return returned[0]
