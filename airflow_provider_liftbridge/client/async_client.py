"""The asyncio client: executes the shared operations with grpc.aio on shared channels, and reads
subscriptions either on grpc.aio too or, by default, on a blocking gRPC stream in a worker thread.

Its methods are the blocking client's, written once: each builds its operation and hands it to
``self._transport.run`` (or ``drive``), and this client's transport returns a coroutine (an async
iterator) where the blocking one returns the result (an iterator). :func:`awaited` makes the
method a coroutine function with the same signature and docstring.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from .base import ClientBase
from .group_consumer import AsyncGroupConsumer, GroupConsumer
from .sync_client import LiftbridgeClient
from .transport.aio import AsyncTransport
from .transport.channels import ChannelFactory
from .transport.nats import NatsLink

__all__ = ["AsyncLiftbridgeClient"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def awaited(method: Callable[Concatenate[Any, _P], _R]) -> Callable[Concatenate[Any, _P], Coroutine[Any, Any, _R]]:
    """The blocking client's ``method`` as a coroutine function of the asyncio client: the same
    body (it returns what ``self._transport.run`` returns, a coroutine here), awaited."""

    async def call(self: Any, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return await cast(Awaitable[_R], method(self, *args, **kwargs))

    functools.update_wrapper(call, method)  # name, docstring, signature (``__wrapped__``)
    return call


def _iterated_async(
    method: Callable[Concatenate[Any, _P], Iterator[_R]],
) -> Callable[Concatenate[Any, _P], AsyncIterator[_R]]:
    # The same body: ``self._transport.drive`` is an async generator on this client's transport.
    return cast(Callable[Concatenate[Any, _P], AsyncIterator[_R]], method)


def _async_consumer(
    method: Callable[Concatenate[Any, _P], GroupConsumer],
) -> Callable[Concatenate[Any, _P], AsyncGroupConsumer]:
    # The same body: it builds ``self._consumer_class``, AsyncGroupConsumer here.
    return cast(Callable[Concatenate[Any, _P], AsyncGroupConsumer], method)


class AsyncLiftbridgeClient(ClientBase):
    """The asyncio Liftbridge client: the constructor and methods of
    :class:`~.sync_client.LiftbridgeClient`, with every method a coroutine and ``subscribe``
    an async iterator (``async for msg in client.subscribe(...)``).

    Channels are shared process-wide per event loop, broker and TLS settings, so many clients
    (e.g. triggers in one triggerer) open one connection per broker. ``close()`` releases them.

    Subscriptions are read, by default, by one worker thread each on a blocking gRPC stream,
    which hands messages to the event loop in bursts (``subscription_reader="thread"``): several
    times cheaper per message than grpc.aio. For many concurrent, mostly idle subscriptions (a
    thousand triggers in one triggerer) pass ``subscription_reader="aio"``: no thread at all.
    Either way, closing the subscription (``aclose()``, leaving ``async for``) or cancelling the
    consuming task ends its thread and call at once, and ``close()`` ends every subscription of
    the client with :class:`~.errors.ClientClosedError`.
    """

    _consumer_class = AsyncGroupConsumer

    def _open(self, factory: ChannelFactory, subscription_channels: int) -> None:
        self._transport = AsyncTransport(
            factory,
            subscription_channels,
            NatsLink(self.nats_servers, self._core.timeout, self.nats_security, self.settings.keepalive),
            self.subscription_reader,
        )

    # The blocking client's methods, awaited (see the module's docstring): same arguments, results
    # and errors, documented there.
    create_stream = awaited(LiftbridgeClient.create_stream)
    delete_stream = awaited(LiftbridgeClient.delete_stream)
    pause_stream = awaited(LiftbridgeClient.pause_stream)
    set_stream_readonly = awaited(LiftbridgeClient.set_stream_readonly)
    publish = awaited(LiftbridgeClient.publish)
    publish_many = awaited(LiftbridgeClient.publish_many)
    publish_to_subject = awaited(LiftbridgeClient.publish_to_subject)
    fetch_metadata = awaited(LiftbridgeClient.fetch_metadata)
    fetch_partition_metadata = awaited(LiftbridgeClient.fetch_partition_metadata)
    set_cursor = awaited(LiftbridgeClient.set_cursor)
    fetch_cursor = awaited(LiftbridgeClient.fetch_cursor)
    fetch_group_metadata = awaited(LiftbridgeClient.fetch_group_metadata)
    #: An async iterator (``async for msg in client.subscribe(...)``).
    subscribe = _iterated_async(LiftbridgeClient.subscribe)
    #: An async iterator of :class:`~.column_subscription.MessageColumns`.
    subscribe_columns = _iterated_async(LiftbridgeClient.subscribe_columns)
    #: The member's ``join``, ``commit`` and ``leave`` are coroutines, ``messages`` an async iterator.
    group_consumer = _async_consumer(LiftbridgeClient.group_consumer)

    async def close(self) -> None:
        """Release this client's shared channels and close its NATS connection; idempotent."""
        await self._transport.close()

    async def __aenter__(self) -> AsyncLiftbridgeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
