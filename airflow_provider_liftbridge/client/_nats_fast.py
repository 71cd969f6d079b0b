"""The one place the bulk path reaches into nats-py's internals, and its fallback.

nats-py's public API costs the bulk path more per message than everything else together:
``publish()`` is two awaited coroutines with connection checks per message, and every message
received goes through header parsing, a ``Msg`` object, an ``asyncio.Queue`` and a task that
awaits the subscription's callback. The bulk path needs neither: its frames are checked once
per burst, and its acks are small envelopes with no NATS headers that one plain function
handles. So, on nats-py versions this module was checked against (and only when the client
object has the expected shape), it

- appends a burst of ``PUB`` commands — each built by nats-py's own ``pub_cmd`` — to the
  client's pending buffer and kicks its flusher once (what ``publish()`` does per message);
- hands the payloads of the ack subscription straight from nats-py's protocol parser to a
  function, by wrapping the client's ``_process_msg`` for the subscriptions registered here.
  Everything else (other subscriptions, messages with headers) goes to nats-py's own code.

Anywhere else it uses the public API (``publish()``, ``subscribe(cb=...)``), with the same
results. ``tests/client/test_nats_fast.py`` fails loudly if the internals change shape.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import nats.errors
import nats.protocol.parser
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.protocol import command as _command

__all__ = ["AckHandler", "FastNats", "fast_nats", "internals_usable"]

log = logging.getLogger(__name__)

#: A function taking the payloads of messages received on an ack inbox, in arrival order.
AckHandler = Callable[[list[bytes]], None]

# nats-py releases whose internals (below) were read and tested: >= 2.6, < 3.
_CHECKED_FROM, _CHECKED_BELOW = (2, 6), (3, 0)
_ATTR = "_liftbridge_fast"  # the FastNats of a client, kept on the client object


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
        source = inspect.getsource(nats.protocol.parser.Parser.parse)
    except (OSError, TypeError):  # no source shipped: the dispatch below cannot be verified
        return "the source of nats-py's protocol parser is not available to check"
    if "await self.nc._process_msg(" not in source:
        return "the protocol parser no longer awaits nc._process_msg"
    return None


_PROBLEM = _shape_problem()
if _PROBLEM is not None:
    log.info("bulk NATS path: using nats-py's public API only (%s)", _PROBLEM)


def internals_usable() -> bool:
    """Whether this nats-py has the internals the fast paths use (checked once at import)."""
    return _PROBLEM is None


class FastNats:
    """The bulk path's view of one nats-py client: burst publishing and ack subscriptions,
    through the internals when :func:`internals_usable` (and the client has the expected
    attributes), else through the public API.

    Get it with :func:`fast_nats` (on the client's event loop); one per client object.
    """

    def __init__(self, nc: NatsClient, *, internals: bool) -> None:
        self.nc = nc
        self.internals = internals and _client_shape_ok(nc)
        self._handlers: dict[int, Callable[[bytes], None]] = {}  # sid -> adds a payload to its batch
        if self.internals:
            original = nc._process_msg
            handlers = self._handlers
            # The parser awaits what _process_msg returns: for our messages, a future already
            # done, which costs less to await than a coroutine to create and run.
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)

            def process_msg(
                sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
            ) -> Awaitable[None]:
                handler = handlers.get(sid)
                if handler is None or headers:
                    return original(sid, subject, reply, data, headers)  # type: ignore[arg-type]
                # nats-py's own per-message work (statistics, Msg, queue, task) is skipped: the
                # client's in_msgs/in_bytes statistics do not count these messages.
                handler(data)
                return done

            nc._process_msg = process_msg  # type: ignore[method-assign, assignment]

    async def subscribe(
        self, subject: str, handler: AckHandler, *, pending_msgs: int, pending_bytes: int
    ) -> Subscription:
        """Subscribe ``handler`` to ``subject``: it is called, from the event loop, with the
        payloads of the messages that arrived since its last call (with the internals, those of
        one read from the socket: a batch is cheaper to go through than one call per message).

        The subscription is a normal nats-py one (resubscribed on reconnect, ended with
        ``unsubscribe()``); with the internals its messages skip nats-py's queue and task.
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

        def add(data: bytes) -> None:
            if not batch:
                loop.call_soon(deliver)
            batch.append(data)

        async def cb(msg: Msg) -> None:
            add(msg.data)

        sub = await self.nc.subscribe(
            subject, cb=cb, pending_msgs_limit=pending_msgs, pending_bytes_limit=pending_bytes
        )
        if self.internals:
            # Messages that reached nats-py's queue before this line still go through cb: the
            # same batch, so nothing is lost or handled twice.
            self._handlers[sub._id] = add
        return sub

    def forget(self, sub: Subscription) -> None:
        """Stop dispatching ``sub``'s messages directly (call before unsubscribing)."""
        self._handlers.pop(getattr(sub, "_id", None), None)  # type: ignore[arg-type]

    async def publish_burst(self, subjects: Sequence[str], frames: Sequence[bytes]) -> None:
        """Publish ``frames[i]`` on ``subjects[i]`` (no reply subject, no headers), in order.

        The caller has checked every frame against ``max_payload`` and every subject once.

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


#: Whether new FastNats objects may use the internals (benchmarks and tests switch it off to
#: measure or exercise the public path).
USE_INTERNALS = True


def fast_nats(nc: NatsClient) -> FastNats:
    """The :class:`FastNats` of ``nc``, made on first use and kept on the client object."""
    fast: FastNats | None = getattr(nc, _ATTR, None)
    if fast is None:
        fast = FastNats(nc, internals=USE_INTERNALS and internals_usable())
        setattr(nc, _ATTR, fast)
    return fast
