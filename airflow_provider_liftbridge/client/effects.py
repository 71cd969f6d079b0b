"""The I/O requests an operation hands to its transport.

Operations (:mod:`.operations`, :mod:`.subscription`, :mod:`.publishing`) are generators: they
``yield`` one of these and get back the result (or have a :class:`RpcFailure` /
:class:`ReadTimeout` thrown in). The sync transport executes them with blocking gRPC calls, the
async one awaits them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

_R = TypeVar("_R")


class RpcFailure(Exception):
    """A failed call as the core sees it: a status code and the server's message.

    Transports raise it (with the transport's own error as ``__cause__``) so the core never
    touches gRPC error objects.
    """

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def of(cls, exc: grpc.RpcError) -> RpcFailure:
        """The failure of a gRPC error (sync or asyncio), with the error as its ``__cause__``."""
        failure = cls(exc.code(), exc.details() or "")
        failure.__cause__ = exc
        return failure


class ReadTimeout(Exception):
    """A read on a stream did not produce anything within its timeout."""


@dataclass(frozen=True, slots=True)
class Unary:
    """Call a unary RPC on ``address``; result: the response protobuf."""

    address: str
    method: str
    request: Any
    timeout: float


@dataclass(frozen=True, slots=True)
class OpenStream:
    """Open a server-streaming call (``request`` given) or a bidi call (``request`` is ``None``);
    result: an opaque handle for :class:`Read`, :class:`Write`, :class:`CloseWrite`, :class:`Cancel`.
    ``long_lived`` streams use the subscription channel pool."""

    address: str
    method: str
    request: Any = None
    long_lived: bool = False


@dataclass(frozen=True, slots=True)
class Read:
    """Read the next response; result: the protobuf, or :data:`END` when the server closed the
    stream. ``timeout=None`` waits as long as it takes; a read that times out raises
    ``ReadTimeout`` and the stream is over (both transports cancel it)."""

    handle: Any
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Write:
    """Send one request on a bidi stream."""

    handle: Any
    request: Any


@dataclass(frozen=True, slots=True)
class CloseWrite:
    """Half-close a bidi stream (no more requests)."""

    handle: Any


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel a stream (idempotent)."""

    handle: Any


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (backoff)."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Emit:
    """Hand ``item`` to the caller of a streaming operation (a subscription's next message)."""

    item: Any


class Sink(Protocol):
    """Where :class:`Pump` puts a stream's responses (a subscription's state)."""

    #: True once nothing more is wanted from the stream (checked after each response).
    done: bool

    def take(self, response: Any) -> Any:
        """Turn one response into the item to deliver, or ``None`` to deliver nothing for it."""


@dataclass(frozen=True, slots=True)
class Pump:
    """Hand a stream's responses to the caller until the stream is over: each response goes
    through ``sink.take``, and what it returns (unless ``None``) is delivered as if emitted.
    Result: ``None`` once ``sink.done`` after a response, :data:`END` when the server closed the
    stream; a failure is raised as from :class:`Read`.

    One effect for a whole stream instead of a :class:`Read` and an :class:`Emit` per message:
    a subscription's hot loop is then the transport's plain loop over the call (a per-message
    round trip through the operation cost more client CPU than the message conversion).
    """

    handle: Any
    sink: Sink


@dataclass(frozen=True, slots=True)
class NatsCall:
    """Await ``fn(nc)`` on the client's event loop, ``nc`` being the client's NATS connection
    (a nats-py client), which the transport opens if needed and hands over; result: what ``fn``
    returns (the NATS-direct bulk path). A connection that cannot be opened is raised into the
    operation as :class:`~.errors.UnavailableError` (``fn`` is not called)."""

    fn: Callable[[Any], Awaitable[Any]]
    #: Try to connect even if the last attempt failed moments ago. The transport otherwise fails
    #: at once for a while after a failed connect (``NatsLink.retry_after``, so that ``"auto"``
    #: falls back to gRPC without waiting for NATS every time); a caller that asked for NATS has
    #: no other path, and must find a NATS server that is back after a restart at once.
    fresh: bool = False


@dataclass(frozen=True, slots=True)
class DropNats:
    """Drop the client's NATS connection so that nothing queued in it reaches the server later
    (``NatsLink.discard``: a flush of up to ``flush_within`` seconds, else a reset); the next
    :class:`NatsCall` opens a new one. Result: whether everything sent on it is known to have
    reached the server."""

    flush_within: float = 0.0


Effect = Unary | OpenStream | Read | Write | CloseWrite | Cancel | Sleep | Emit | Pump | NatsCall | DropNats


class _End:
    def __repr__(self) -> str:
        return "END"


#: What :class:`Read` returns once the server has closed the stream.
END: Any = _End()

#: An operation: a generator of effects that finally returns ``_R``.
Op = Generator[Effect, Any, _R]
