"""The asyncio client: executes the shared operations with grpc.aio on shared channels."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import grpc
import grpc.aio

from airflow_provider_liftbridge._proto import api_pb2_grpc

from . import _ops, bulk
from ._base import ClientBase
from ._core import ClientCore, ReadTimeout, RpcFailure
from ._effects import (
    END,
    Cancel,
    CloseWrite,
    Effect,
    Emit,
    NatsCall,
    Op,
    OpenStream,
    Pump,
    Read,
    Sleep,
    Unary,
    Write,
)
from .channels import ASYNC_REGISTRY, ChannelFactory, SlotTurns
from .errors import ClientClosedError
from .types import Message, TlsConfig

__all__ = ["AsyncLiftbridgeClient"]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_Key = tuple[int, str, "TlsConfig | None", int]
_EOF = grpc.aio.EOF


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
            return END if response is _EOF else response
        try:
            return await self.next_response()
        except StopAsyncIteration:
            return END

    async def read(self, timeout: float | None) -> Any:
        if timeout is None:
            return await self._read()
        try:
            return await asyncio.wait_for(self._read(), timeout)
        except TimeoutError:
            raise ReadTimeout() from None

    def cancel(self) -> None:
        self.call.cancel()


class _AsyncTransport:
    """Executes effects with grpc.aio; channels come from the process-wide registry."""

    def __init__(self, factory: ChannelFactory, subscription_channels: int, nats: bulk.NatsLink) -> None:
        self._factory = factory
        self._nats = nats
        self._slots = SlotTurns(subscription_channels)
        self._held: dict[tuple[str, int], tuple[grpc.aio.Channel, _Key]] = {}
        self.closed = False

    def _stub(self, address: str, long_lived: bool = False) -> Any:
        if self.closed:
            raise ClientClosedError("the client is closed; create a new one")
        slot = self._slots.next(address, long_lived)
        held = self._held.get((address, slot))
        if held is None:
            held = self._held[(address, slot)] = ASYNC_REGISTRY.acquire(self._factory, address, slot)
        return api_pb2_grpc.APIStub(  # type: ignore[no-untyped-call]
            held[0]
        )

    async def close(self) -> None:
        self.closed = True
        held, self._held = list(self._held.values()), {}
        for _, key in held:
            await ASYNC_REGISTRY.release(key)
        await self._nats.close()

    async def execute(self, effect: Effect) -> Any:
        try:
            if isinstance(effect, Unary):
                stub = self._stub(effect.address)
                return await getattr(stub, effect.method)(effect.request, timeout=effect.timeout)
            if isinstance(effect, Read):
                return await effect.handle.read(effect.timeout)
            if isinstance(effect, Write):
                return await effect.handle.call.write(effect.request)
            if isinstance(effect, OpenStream):
                method = getattr(self._stub(effect.address, effect.long_lived), effect.method)
                if effect.request is None:
                    return _AsyncStream(method(), responses_only=False)
                return _AsyncStream(method(effect.request), responses_only=True)
            if isinstance(effect, CloseWrite):
                return await effect.handle.call.done_writing()
            if isinstance(effect, Cancel):
                return effect.handle.cancel()
            if isinstance(effect, Sleep):
                return await asyncio.sleep(effect.seconds)
            if isinstance(effect, NatsCall):
                if self.closed:
                    raise ClientClosedError("the client is closed; create a new one")
                return await effect.fn(self._nats)
        except grpc.RpcError as exc:
            raise RpcFailure.of(exc) from exc
        except asyncio.InvalidStateError as exc:  # writing to a call that already ended
            raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "the stream ended while writing") from exc
        raise TypeError(f"unknown effect {effect!r}")

    async def drive(self, op: Op[Any], returned: list[Any] | None = None) -> AsyncGenerator[Any, None]:
        """Execute ``op``'s effects and yield what it emits; its return value is appended to
        ``returned``. Streams it opened are cancelled when it ends."""
        opened: list[_AsyncStream] = []
        send: Any = None
        error: BaseException | None = None
        try:
            while True:
                try:
                    effect = op.throw(error) if error is not None else op.send(send)
                except StopIteration as stop:
                    if returned is not None:
                        returned.append(stop.value)
                    return
                send, error = None, None
                if isinstance(effect, Emit):
                    yield effect.item
                    continue
                if isinstance(effect, Pump):
                    # A subscription's hot loop: straight over the call's response iterator, no
                    # round trip through the operation per message.
                    sink, take, next_response, send = effect.sink, effect.sink.take, effect.handle.next_response, END
                    try:
                        while True:
                            item = take(await next_response())
                            if item is not None:
                                yield item
                                if sink.done:
                                    send = None
                                    break
                    except StopAsyncIteration:
                        pass  # the server closed the stream
                    except grpc.RpcError as exc:
                        error = RpcFailure.of(exc)
                    continue
                try:
                    send = await self.execute(effect)
                except (RpcFailure, ReadTimeout) as exc:
                    error = exc
                if isinstance(effect, OpenStream):
                    opened.append(send)
        finally:
            op.close()
            for stream in opened:
                stream.cancel()


async def _run(transport: _AsyncTransport, op: Op[_R]) -> _R:
    returned: list[_R] = []
    driver = transport.drive(op, returned)
    try:
        async for _ in driver:
            raise AssertionError(f"{op!r} emitted an item; it is not a unary operation")
    finally:
        await driver.aclose()
    return returned[0]


def _method(
    op: Callable[Concatenate[ClientCore, _P], Op[_R]],
) -> Callable[Concatenate[AsyncLiftbridgeClient, _P], Coroutine[Any, Any, _R]]:
    @functools.wraps(op)
    async def method(self: AsyncLiftbridgeClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await _run(self._transport, op(self._core, *args, **kwargs))

    return method


def _stream_method(
    op: Callable[Concatenate[ClientCore, _P], Op[None]],
) -> Callable[Concatenate[AsyncLiftbridgeClient, _P], AsyncIterator[Message]]:
    @functools.wraps(op)
    def method(self: AsyncLiftbridgeClient, /, *args: _P.args, **kwargs: _P.kwargs) -> AsyncIterator[Message]:
        return self._transport.drive(op(self._core, *args, **kwargs))

    return method


class AsyncLiftbridgeClient(ClientBase):
    """The asyncio Liftbridge client: the constructor and methods of
    :class:`~.sync_client.LiftbridgeClient`, with every method a coroutine and ``subscribe``
    an async iterator (``async for msg in client.subscribe(...)``).

    Channels are shared process-wide per event loop, broker and TLS settings, so many clients
    (e.g. triggers in one triggerer) open one connection per broker. ``close()`` releases them.
    """

    def _open(self, factory: ChannelFactory, subscription_channels: int) -> None:
        self._transport = _AsyncTransport(
            factory, subscription_channels, bulk.NatsLink(self.nats_servers, self._core.timeout)
        )

    create_stream = _method(_ops.create_stream)
    delete_stream = _method(_ops.delete_stream)
    pause_stream = _method(_ops.pause_stream)
    set_stream_readonly = _method(_ops.set_stream_readonly)
    publish = _method(_ops.publish)
    publish_many = _method(bulk.publish_many)
    publish_to_subject = _method(_ops.publish_to_subject)
    subscribe = _stream_method(_ops.subscribe)
    fetch_metadata = _method(_ops.fetch_metadata)
    fetch_partition_metadata = _method(_ops.fetch_partition_metadata)
    set_cursor = _method(_ops.set_cursor)
    fetch_cursor = _method(_ops.fetch_cursor)

    async def close(self) -> None:
        """Release this client's shared channels and close its NATS connection; idempotent."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncLiftbridgeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
