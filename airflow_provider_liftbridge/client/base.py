"""What both clients share besides the operations: construction, configuration, repr."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, TypeVar

from airflow_provider_liftbridge.nats_security import NatsSecurity, redact_urls

from .errors import InvalidArgumentError
from .routing import ClientCore
from .settings import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT, ConnectionSettings
from .transport.channels import ChannelFactory
from .types import AckPolicy, TlsConfig

#: How the asyncio client reads subscriptions (see :class:`ClientBase`).
SubscriptionReader = Literal["thread", "aio"]

_C = TypeVar("_C", bound="ClientBase")


class ClientBase:
    """Configuration common to :class:`LiftbridgeClient` and :class:`AsyncLiftbridgeClient`.

    :param brokers: seed brokers: ``"host:port"``, ``"h1:p1,h2:p2"`` or a list; more are learned
        from metadata.
    :param tls: TLS settings (``None``: plaintext).
    :param nats_servers: NATS URLs: ``publish_many`` then publishes straight to NATS (the bulk
        path, see :mod:`.publishing.batch`).
        ``None`` or empty: no NATS.
    :param nats_security: TLS and authentication of every NATS connection the client opens
        (``None``: plain and anonymous, or whatever the URLs carry).
    :param timeout: default per-call deadline in seconds (also how long a publish waits for its ack,
        and how long a call waits out a cluster with no leader yet, retrying with backoff).
    :param max_retries: the fewest retries after a lost connection, cycling through the known
        brokers with exponential backoff and jitter (more within ``timeout`` once a broker has
        answered); 0: no retry.
    :param ack_policy: default ack policy of publishes.
    :param resubscribe_wait: how long a subscription keeps trying to resubscribe after a
        transient failure, in seconds.
    :param subscription_channels: channels per broker shared by long-lived subscriptions, beside the
        one for unary calls; 0 puts subscriptions on that one too (one channel per broker).
    :param subscription_reader: how the asyncio client reads a subscription: ``"thread"`` (the
        default) on a blocking gRPC stream in a worker thread, which hands messages to the event
        loop in bursts (the cheapest per message); ``"aio"`` with grpc.aio in the event loop, no
        thread (for many concurrent, mostly idle subscriptions, e.g. triggers). The blocking client
        always reads on the caller's thread and only checks the value.
    :param backoff_base: first retry wait in seconds (doubled per retry).
    :param backoff_max: longest retry wait in seconds.
    :param keepalive_time: seconds between keepalive pings of a connection with calls on it.
    :param keepalive_timeout: how long a ping may go unanswered before the connection counts as
        dead and its calls fail with UNAVAILABLE: a call on a silent link notices within
        ``keepalive_time + keepalive_timeout`` seconds (docs/reliability.md, "Silent links").
    :raises InvalidArgumentError: a malformed broker address, unreadable TLS files, a certificate
        without its key, a non-positive timeout or keepalive, an unknown ``subscription_reader``.

    The connection keywords make a :class:`~.settings.ConnectionSettings`, which checks them;
    :meth:`from_settings` takes one made elsewhere (the hook, Spark executors).
    """

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        tls: TlsConfig | None = None,
        nats_servers: Sequence[str] | None = (),
        nats_security: NatsSecurity | None = None,
        timeout: float = 10.0,
        max_retries: int = 5,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        resubscribe_wait: float = 30.0,
        subscription_channels: int = 2,
        subscription_reader: SubscriptionReader = "thread",
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        keepalive_time: float = KEEPALIVE_TIME,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    ) -> None:
        settings = ConnectionSettings(
            brokers=brokers,  # type: ignore[arg-type]  # normalised to a tuple by the settings
            tls=tls,
            nats_servers=(nats_servers,) if isinstance(nats_servers, str) else tuple(nats_servers or ()),
            nats_security=nats_security,
            ack_policy=ack_policy,
            timeout=timeout,
            max_retries=max_retries,
            resubscribe_wait=resubscribe_wait,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            keepalive_time=keepalive_time,
            keepalive_timeout=keepalive_timeout,
        )
        self._start(settings, subscription_channels, subscription_reader)

    @classmethod
    def from_settings(
        cls: type[_C],
        settings: ConnectionSettings,
        *,
        subscription_channels: int = 2,
        subscription_reader: SubscriptionReader = "thread",
    ) -> _C:
        """A client for ``settings`` (see the class for the other two options).

        :raises InvalidArgumentError: unreadable TLS files, a certificate without its key, an
            unknown ``subscription_reader``.
        """
        client = cls.__new__(cls)
        client._start(settings, subscription_channels, subscription_reader)
        return client

    def _start(
        self, settings: ConnectionSettings, subscription_channels: int, subscription_reader: SubscriptionReader
    ) -> None:
        if subscription_reader not in ("thread", "aio"):
            raise InvalidArgumentError(f"subscription_reader must be 'thread' or 'aio', got {subscription_reader!r}")
        self.subscription_reader: SubscriptionReader = subscription_reader
        self._core = ClientCore(settings)
        self._open(
            ChannelFactory(settings.tls, settings.keepalive_time, settings.keepalive_timeout), subscription_channels
        )

    @property
    def settings(self) -> ConnectionSettings:
        """The connection options this client was built from."""
        return self._core.settings

    @property
    def tls(self) -> TlsConfig | None:
        """TLS settings of the gRPC channels (``None``: plaintext)."""
        return self._core.settings.tls

    @property
    def nats_servers(self) -> tuple[str, ...]:
        """The NATS URLs (empty: no NATS)."""
        return self._core.settings.nats_servers

    @property
    def nats_security(self) -> NatsSecurity | None:
        """TLS and authentication of the client's NATS connections."""
        return self._core.settings.nats_security

    def _open(self, factory: ChannelFactory, subscription_channels: int) -> None:
        """Set up the transport (the only thing the two clients do differently)."""
        raise NotImplementedError

    @property
    def brokers(self) -> list[str]:
        """Every broker address the client knows (seeds, then learned ones)."""
        return self._core.known_addresses()

    def __repr__(self) -> str:
        nats = f", nats_servers=[{redact_urls(self.nats_servers)}]" if self.nats_servers else ""
        return f"{type(self).__name__}(brokers={self._core.seeds!r}, tls={self.tls is not None}{nats})"
