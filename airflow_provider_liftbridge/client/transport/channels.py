"""gRPC channels: options, TLS credentials, the sync per-client pool and the process-wide
asyncio registry.

Unary calls share one channel per broker. Long-lived subscriptions spread over a small pool of
extra channels per broker (each its own connection), so hundreds of subscriptions do not queue
behind HTTP/2's concurrent-stream limit on the channel the unary calls use.

The asyncio registry is process-wide: many clients in one event loop (e.g. a thousand triggers
in one triggerer) share one channel per (broker, TLS settings, slot); channels are
reference-counted and closed when the last client releases them. The asyncio client's threaded
subscription reader takes blocking channels from a second process-wide registry, shared the same
way (blocking channels belong to no event loop, so clients of every loop share them).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import grpc.experimental

from airflow_provider_liftbridge._proto import api_pb2_grpc

from ..errors import ClientClosedError, InvalidArgumentError
from ..settings import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT
from ..types import TlsConfig
from .heartbeat import HEARTBEAT

__all__ = [
    "ASYNC_REGISTRY",
    "SYNC_REGISTRY",
    "AsyncChannelRegistry",
    "ChannelFactory",
    "SlotTurns",
    "SyncChannelPool",
    "SyncChannelRegistry",
    "end_call",
]

# Reconnect quickly after a broker restart (gRPC's default backoff grows to two minutes, far
# longer than a resubscription is allowed to wait).
_BASE_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.enable_retries", 0),  # the client retries itself, across brokers
)


def _read(what: str, path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InvalidArgumentError(f"TLS {what} {path!r} cannot be read ({exc.strerror}); check the path") from exc


@dataclass(frozen=True, slots=True)
class ChannelFactory:
    """Builds channels to a broker with the client's TLS settings (plaintext when ``tls`` is None)
    and keepalive: while a call is open on a connection, a PING goes out every ``keepalive_time``
    seconds, and a PING unanswered for ``keepalive_timeout`` seconds ends the connection and its
    calls with UNAVAILABLE. So a call on a silent link (packets dropped, nothing reset) notices
    within ``keepalive_time + keepalive_timeout`` seconds, even a subscription that receives
    nothing for hours (docs/reliability.md, "Silent links").

    :raises InvalidArgumentError: (on construction) a certificate without its key or the
        reverse, or an unreadable file.
    """

    tls: TlsConfig | None = None
    keepalive_time: float = KEEPALIVE_TIME
    keepalive_timeout: float = KEEPALIVE_TIMEOUT

    def __post_init__(self) -> None:
        if self.tls is not None and (self.tls.cert_file is None) != (self.tls.key_file is None):
            raise InvalidArgumentError("TlsConfig needs both cert_file and key_file for mutual TLS, or neither")
        if self.tls is not None:
            self.credentials()  # fail now on unreadable files, not at the first call

    def credentials(self) -> Any:
        assert self.tls is not None
        return grpc.ssl_channel_credentials(
            root_certificates=_read("ca_file", self.tls.ca_file),
            private_key=_read("key_file", self.tls.key_file),
            certificate_chain=_read("cert_file", self.tls.cert_file),
        )

    def options(self, slot: int) -> list[tuple[str, Any]]:
        opts = [
            *_BASE_OPTIONS,
            ("grpc.keepalive_time_ms", round(self.keepalive_time * 1000)),
            ("grpc.keepalive_timeout_ms", round(self.keepalive_timeout * 1000)),
            # gRPC core takes this as the least time a connection attempt gets to finish its
            # handshake (the server's SETTINGS frame), not as a backoff: at 100 ms a busy broker,
            # a slow link or a TLS handshake over a long route failed every first attempt with
            # UNAVAILABLE. A peer silent for keepalive_timeout counts as gone, connecting or not.
            ("grpc.min_reconnect_backoff_ms", round(self.keepalive_timeout * 1000)),
            # After two PINGs without a DATA or HEADERS frame sent (the default limit), gRPC pings at
            # most once a minute: a subscription sends nothing after its request, so once idle for
            # two PINGs it noticed a silent link a minute late or more. 0 lifts the limit.
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if slot:
            # A channel of its own subchannel pool opens its own connection.
            opts += [("grpc.use_local_subchannel_pool", 1), ("liftbridge.pool_slot", slot)]
        if self.tls is not None and self.tls.server_name:
            opts += [("grpc.ssl_target_name_override", self.tls.server_name)]
        return opts

    def sync_channel(self, address: str, slot: int = 0) -> grpc.Channel:
        # Server-streaming calls (Subscribe, the only one) read on the caller's thread instead of
        # through the channel's spin thread: each message then costs no thread hand-off and no
        # GIL contention, a quarter to a half of the client CPU per message of the default.
        # Unary and bidi calls are unaffected.
        options = [*self.options(slot), (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
        if self.tls is None:
            return grpc.insecure_channel(address, options=options)
        return grpc.secure_channel(address, self.credentials(), options=options)

    def watch(self, channel: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Keep ``channel``'s keepalive PINGs welcome while long-lived calls on it receive nothing
        (:mod:`.heartbeat`); ``loop``: the event loop of an asyncio channel."""
        HEARTBEAT.watch(channel, self.keepalive_time, self.keepalive_timeout, loop)

    def async_channel(self, address: str, slot: int = 0) -> grpc.aio.Channel:
        if self.tls is None:
            return grpc.aio.insecure_channel(address, options=self.options(slot))
        return grpc.aio.secure_channel(address, self.credentials(), options=self.options(slot))


def end_call(call: Any) -> None:
    """Cancel ``call`` (a no-op once it has ended) and take in what gRPC still owes it.

    A server-streaming call of a blocking channel (``SingleThreadedUnaryStream``: every blocking
    Subscribe) is read on its caller's thread from a completion queue of its own, and only a read
    takes events from it. Cancelled while an operation is still due (its status, a read), it
    keeps those events there, and gRPC keeps the call, and the connection it was made on, for
    the life of the process: closing the channel frees neither. A worker then holds one more
    socket per subscription it stopped early (a plan read to its end, a failed batch, a read
    that timed out). A cancelled call's events come at once, so this waits for nothing.

    Call it from the thread that reads ``call``, never while another thread is in ``next()`` of
    it. Other calls (grpc.aio; bidi calls, read by the channel's own thread) need only the
    cancel, and get only that.
    """
    call.cancel()
    # grpc's _SingleThreadedRendezvous; a gRPC without these private names leaks as before
    # (tests/client/test_descriptors.py notices).
    take = getattr(call, "_consume_next_event", None)
    state = getattr(call, "_state", None)
    if take is None or state is None:
        return
    while state.due:
        take()


class SlotTurns:
    """Which channel slot a call uses: 0 (the shared unary channel) for short calls, and
    1..``size`` in turn per broker for long-lived streams; with ``size`` 0, streams share slot 0 too,
    so a process holds exactly one channel per broker (HTTP/2 multiplexes the streams)."""

    def __init__(self, size: int) -> None:
        self._size = max(0, size)
        self._turn: dict[str, int] = {}
        self._lock = threading.Lock()

    def next(self, address: str, long_lived: bool) -> int:
        if not long_lived or not self._size:
            return 0
        with self._lock:
            n = self._turn.get(address, 0)
            self._turn[address] = n + 1
        return 1 + n % self._size


class SyncChannelPool:
    """One client's channels: slot 0 per broker for unary calls, ``subscription_channels`` more
    per broker handed out in turn to long-lived streams."""

    def __init__(self, factory: ChannelFactory, subscription_channels: int) -> None:
        self._factory = factory
        self._slots = SlotTurns(subscription_channels)
        self._channels: dict[tuple[str, int], grpc.Channel] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, address: str, long_lived: bool) -> grpc.Channel:
        slot = self._slots.next(address, long_lived)
        with self._lock:
            if self._closed:
                raise ClientClosedError("the client is closed; create a new one")
            channel = self._channels.get((address, slot))
            if channel is None:
                channel = self._channels[(address, slot)] = self._factory.sync_channel(address, slot)
        if long_lived:
            self._factory.watch(channel)
        return channel

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            HEARTBEAT.forget(channel)
            channel.close()


@dataclass(slots=True)
class _Entry:
    channel: grpc.aio.Channel
    loop: asyncio.AbstractEventLoop
    refs: int


class AsyncChannelRegistry:
    """Process-wide asyncio channels keyed by (event loop, address, channel settings, slot).

    A grpc.aio channel belongs to the loop it was made on, hence the loop in the key.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[int, str, ChannelFactory, int], _Entry] = {}
        self._lock = threading.Lock()

    def acquire(
        self, factory: ChannelFactory, address: str, slot: int
    ) -> tuple[grpc.aio.Channel, tuple[int, str, ChannelFactory, int]]:
        """A shared channel and the key to :meth:`release` it with (once per acquire)."""
        loop = asyncio.get_running_loop()
        key = (id(loop), address, factory, slot)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.loop is not loop or entry.loop.is_closed():
                entry = self._entries[key] = _Entry(factory.async_channel(address, slot), loop, 0)
            entry.refs += 1
            return entry.channel, key

    async def release(self, key: tuple[int, str, ChannelFactory, int]) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.refs -= 1
            if entry.refs > 0:
                return
            del self._entries[key]
        HEARTBEAT.forget(entry.channel)
        if not entry.loop.is_closed():
            await entry.channel.close()

    def open_channels(self) -> int:
        """How many shared channels are open (for tests and diagnostics)."""
        with self._lock:
            return len(self._entries)


#: The one registry of this process.
ASYNC_REGISTRY = AsyncChannelRegistry()


class SyncChannelRegistry:
    """Process-wide blocking channels keyed by (address, channel settings, slot), reference-counted:
    the channels the asyncio client's reader threads subscribe on."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ChannelFactory, int], tuple[grpc.Channel, int]] = {}
        self._lock = threading.Lock()

    def acquire(
        self, factory: ChannelFactory, address: str, slot: int
    ) -> tuple[grpc.Channel, tuple[str, ChannelFactory, int]]:
        """A shared channel and the key to :meth:`release` it with (once per acquire)."""
        key = (address, factory, slot)
        with self._lock:
            channel, refs = self._entries.get(key) or (None, 0)
            if channel is None:
                channel = factory.sync_channel(address, slot)
                factory.watch(channel)  # every channel here is a threaded subscription's
            self._entries[key] = (channel, refs + 1)
            return channel, key

    def release(self, key: tuple[str, ChannelFactory, int]) -> None:
        """Drop one reference; the last one closes the channel (cancelling calls still on it)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            channel, refs = entry
            if refs > 1:
                self._entries[key] = (channel, refs - 1)
                return
            del self._entries[key]
        HEARTBEAT.forget(channel)
        channel.close()

    def open_channels(self) -> int:
        """How many shared channels are open (for tests and diagnostics)."""
        with self._lock:
            return len(self._entries)


#: The process's blocking channels for threaded subscriptions.
SYNC_REGISTRY = SyncChannelRegistry()


class StubCache:
    """The API stub of each channel slot, made again only when the slot's channel changes:
    building a stub makes a callable per RPC (about 0.2 ms), which every unary call paid again (a
    cursor commit per batch of a reading task, among others). At most one stub per key is kept."""

    def __init__(self) -> None:
        self._stubs: dict[Any, tuple[Any, Any]] = {}

    def get(self, key: Any, channel: Any) -> Any:
        """The ``APIStub`` of ``channel``, the channel now behind ``key``."""
        held = self._stubs.get(key)
        if held is None or held[0] is not channel:
            held = self._stubs[key] = (channel, api_pb2_grpc.APIStub(channel))  # type: ignore[no-untyped-call]
        return held[1]
