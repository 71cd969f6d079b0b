"""A client's NATS connection: connecting, security, reconnecting. The transports hand it to the
operations' NATS calls (:class:`~..effects.NatsCall`); nothing here calls a publisher."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_provider_liftbridge.nats_security import NatsSecurity, NatsSecurityError

from ..diagnostics import NatsErrors
from ..errors import InvalidArgumentError, UnavailableError
from ..settings import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient

# nats-py (through nats_adapter) is imported where a connection is opened or dropped, not here:
# every client holds a link, and a gRPC-only process (Spark's read planner and readers) would
# otherwise pay about 45 ms of CPU to import it (issue 57).

__all__ = ["NatsLink", "connect_nats"]

log = logging.getLogger("airflow_provider_liftbridge.client")


async def connect_nats(
    servers: str | Sequence[str],
    *,
    connect_timeout: float = 5.0,
    security: NatsSecurity | None = None,
    reconnect: bool = True,
    keepalive_time: float = KEEPALIVE_TIME,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
) -> NatsClient:
    """Connect to NATS with settings fit for bulk publishing (a large outbound buffer, subjects
    not re-validated on every publish: they come from stream metadata). Every NATS connection of
    the client is opened here, so TLS, credentials and error diagnosis are the same on all paths.

    :param security: TLS and authentication (``None``: plain, anonymous unless the URLs carry a user).
    :param reconnect: whether the connection reconnects by itself once lost, sending what nats-py
        buffered meanwhile on the new connection (the client's :class:`NatsLink` does; after a
        failed batch it drops the connection with :meth:`NatsLink.discard`).
    :param keepalive_time: seconds between the client's PINGs.
    :param keepalive_timeout: how long PINGs may go unanswered before the connection counts as
        stale (rounded up to whole ``keepalive_time`` intervals: nats-py counts unanswered PINGs):
        a silent link is noticed within about ``keepalive_time + keepalive_timeout`` instead of
        nats-py's 2-6 minutes (docs/reliability.md, "Silent links").
    :raises InvalidArgumentError: no server given, or unusable TLS / NKEY files.
    :raises UnavailableError: no NATS server could be reached, or it refused the credentials.
    """
    from airflow_provider_liftbridge.nats_adapter import connect

    urls = [servers] if isinstance(servers, str) else list(servers)
    if not urls:
        raise InvalidArgumentError("nats_servers is empty; give at least one 'nats://host:port' URL")
    errors = NatsErrors()
    # nats-py retries the first connection max_reconnect_attempts times even without reconnects
    # (60 x 2 s by default): a refused connection must fail in about a second.
    retry: dict[str, Any] = (
        {"allow_reconnect": True, "max_reconnect_attempts": 5, "reconnect_time_wait": 0.2}
        if reconnect
        else {"allow_reconnect": False, "max_reconnect_attempts": 1, "reconnect_time_wait": 0.5}
    )
    try:
        options = security.connect_options(urls) if security is not None else {}
    except NatsSecurityError as exc:
        raise InvalidArgumentError(str(exc)) from None
    try:
        # The outer deadline: nats-py 2.x never returns when a TLS handshake fails (the cause
        # reaches error_cb, the connect call hangs).
        nc = await asyncio.wait_for(
            connect(
                urls,
                connect_timeout=int(max(1, connect_timeout)),
                pending_size=64 * 1024 * 1024,
                skip_subject_validation=True,
                error_cb=errors.record,
                ping_interval=keepalive_time,
                max_outstanding_pings=max(1, math.ceil(keepalive_timeout / keepalive_time - 1e-9)),
                **retry,
                **options,
            ),
            timeout=2 * max(1.0, connect_timeout) + 2,
        )
    except Exception as exc:  # nats-py raises several unrelated types for "cannot connect"
        raise errors.connect_error(urls, exc) from None
    return nc


class NatsLink:
    """One client's NATS connection, opened on first use and reopened if it was lost.

    A nats-py connection belongs to the event loop it was made on; used from another loop, the
    link opens a new connection there (the old one is dropped with its loop).

    :param servers: NATS URLs.
    :param connect_timeout: seconds to wait for a connection.
    :param security: TLS and authentication of the connection.
    :param keepalive: seconds between PINGs and how long they may go unanswered (see
        :func:`connect_nats`).
    """

    #: After a failed connect, fail at once for this many seconds (``auto`` then falls back to
    #: gRPC without waiting for NATS on every call).
    retry_after = 30.0

    def __init__(
        self,
        servers: Sequence[str],
        connect_timeout: float,
        security: NatsSecurity | None = None,
        keepalive: tuple[float, float] = (KEEPALIVE_TIME, KEEPALIVE_TIMEOUT),
    ) -> None:
        self.servers = tuple(servers)
        self.keepalive = keepalive
        self.security = security
        self.connect_timeout = connect_timeout
        self._nc: NatsClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._failed: tuple[float, UnavailableError] | None = None
        # A connection given up on since the last discard() without its reset (lost and closed
        # by nats-py itself, or left behind with its event loop): the kernel may still send
        # what it held.
        self._unclean = False

    async def get(self, *, fresh: bool = False) -> NatsClient:
        """The connection, opened if needed.

        :param fresh: try to connect even when the last attempt failed less than
            :attr:`retry_after` seconds ago (see :class:`~..effects.NatsCall`).
        :raises UnavailableError: NATS cannot be reached (now, or, unless ``fresh``, less than
            :attr:`retry_after` seconds ago).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._unclean = self._unclean or self._nc is not None
            self._nc, self._loop, self._lock = None, loop, asyncio.Lock()
        assert self._lock is not None
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                self._unclean = self._unclean or self._nc is not None
                if not fresh and self._failed is not None and time.monotonic() - self._failed[0] < self.retry_after:
                    raise self._failed[1]
                try:
                    self._nc = await connect_nats(
                        self.servers,
                        connect_timeout=self.connect_timeout,
                        security=self.security,
                        keepalive_time=self.keepalive[0],
                        keepalive_timeout=self.keepalive[1],
                    )
                except UnavailableError as exc:
                    self._failed = (time.monotonic(), exc)
                    raise
                self._failed = None
            return self._nc

    async def discard(self, flush_within: float = 0.0) -> bool:
        """Drop the connection after a failed batch, so that nothing given to it reaches the
        server after the caller moved on (re-read the partitions, sent again); the next
        :meth:`get` opens a new one.

        First, for up to ``flush_within`` seconds, a flush: a PING on the same connection. NATS
        handles a connection's commands in order, so its PONG means every publish given to the
        connection before it has been handled (passed on to the subscribed brokers); the
        connection is then closed. Without the PONG in time the connection is reset
        (:func:`~airflow_provider_liftbridge.nats_adapter.abort`): the kernel drops what it has
        not sent and stops retransmitting. A plain close would not stop it: the kernel sends a
        closed socket's data on its own until the link carries it, seconds or minutes later.

        :param flush_within: seconds to wait for the flush; 0: reset at once.
        :returns: whether everything given to this link's connections since the last discard is
            known to have reached the server: the flush came back on the connection that took
            it, which never reconnected, and no connection was lost in between. ``False``: some
            of it may still arrive, for as long as segments already on the way take (a reset
            stops the rest), or for longer where no socket could be reset.
        """
        nc, self._nc = self._nc, None
        unclean, self._unclean = self._unclean, False
        if nc is None or nc.is_closed:
            return not unclean and nc is None
        if self._loop is not asyncio.get_running_loop():
            return False  # another loop's connection: dropped with its loop
        from airflow_provider_liftbridge.nats_adapter import abort, reset_on_close

        # Armed first: nats-py itself closes a connection it finds stale, maybe during the flush.
        reset_on_close(nc)
        delivered = await _flushed(nc, flush_within)
        if delivered:
            reset_on_close(nc, on=False)  # nothing is left to send: an ordinary close
        else:
            abort(nc)
        await self._close(nc)
        return delivered and not unclean

    async def close(self) -> None:
        """Close the connection if it is open on the running loop; idempotent."""
        nc, self._nc = self._nc, None
        if nc is None or nc.is_closed:
            return
        if self._loop is asyncio.get_running_loop():
            await self._close(nc)

    @staticmethod
    async def _close(nc: NatsClient) -> None:
        try:
            await nc.close()
        except Exception:  # closing anyway
            log.debug("error while closing the NATS connection", exc_info=True)


async def _flushed(nc: NatsClient, within: float) -> bool:
    """Whether a flush of ``nc`` came back within ``within`` seconds on the connection that took
    every earlier publish (connected throughout, never reconnected: nats-py re-sends its buffer
    on a new connection, and the old socket's data is not covered by the new one's PONG). Gives
    up as soon as nats-py finds the connection lost: its PONG can no longer come."""
    if within <= 0 or not nc.is_connected:
        return False
    from airflow_provider_liftbridge.nats_adapter import flush

    reconnects = nc.stats.get("reconnects", 0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    pong = asyncio.ensure_future(flush(nc, max(1, math.ceil(within))))
    try:
        while not pong.done() and nc.is_connected and loop.time() < deadline:
            await asyncio.wait({pong}, timeout=min(_WATCH, deadline - loop.time()))
    finally:
        if not pong.done():
            pong.cancel()
        await asyncio.gather(pong, return_exceptions=True)
    if pong.cancelled() or pong.exception() is not None:  # timed out, or the connection failed
        return False
    return nc.is_connected and nc.stats.get("reconnects", 0) == reconnects


#: How often a flush in :func:`_flushed` checks whether nats-py still holds the connection, seconds.
_WATCH = 0.1
