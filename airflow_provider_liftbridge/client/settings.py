"""How to reach a Liftbridge cluster, as one plain, picklable value.

The one settings type of the project: the Airflow hook parses a ``liftbridge`` connection into
it, Spark ships it to executors (which have no Airflow), and the command-line job builds it from
its arguments. It imports neither Airflow nor PySpark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_provider_liftbridge.nats_security import NatsSecurity, redact_urls

from .errors import InvalidArgumentError
from .routing import parse_brokers
from .types import AckPolicy, TlsConfig

if TYPE_CHECKING:
    from .async_client import AsyncLiftbridgeClient
    from .sync_client import LiftbridgeClient

__all__ = ["ConnectionSettings"]


def _split(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else [i for part in value for i in str(part).split(",")]
    return tuple(item.strip() for item in items if item.strip())


@dataclass(frozen=True)
class ConnectionSettings:
    """Everything needed to open a client, validated.

    TLS material is referenced by file path: where the settings travel (Spark executors), the
    files must exist at the same path.

    :param brokers: ``host:port`` of one or more brokers (``"h1:p1,h2:p2"`` or a sequence; stored
        as a tuple).
    :param tls: TLS settings of the gRPC channels, or ``None`` for plaintext.
    :param nats_servers: NATS URLs (``nats://host:port``), possibly empty; with them, batch
        publishing goes straight to NATS with acks on an ack inbox.
    :param nats_security: TLS and authentication of every NATS connection, or ``None``.
    :param ack_policy: the default ack policy of publishes.
    :param timeout: per-call deadline in seconds.
    :param max_retries: retries of a call on an unavailable broker, cycling brokers.
    :param resubscribe_wait: how long a subscription tries to resubscribe, in seconds.
    :param conn_id: where the settings came from (an Airflow connection id), for messages.
    :raises InvalidArgumentError: no broker, a broker that is not ``host:port``, a non-positive
        timeout, a negative ``max_retries`` or ``resubscribe_wait``.
    """

    brokers: tuple[str, ...]
    tls: TlsConfig | None = None
    nats_servers: tuple[str, ...] = ()
    nats_security: NatsSecurity | None = None
    ack_policy: AckPolicy = AckPolicy.LEADER
    timeout: float = 10.0
    max_retries: int = 5
    resubscribe_wait: float = 30.0
    conn_id: str | None = None

    def __post_init__(self) -> None:
        # Accept "h:p,h:p" strings and lists for convenience; store tuples (hashable, picklable).
        object.__setattr__(self, "brokers", tuple(parse_brokers(self.brokers)))
        object.__setattr__(self, "nats_servers", _split(self.nats_servers))
        object.__setattr__(self, "ack_policy", AckPolicy(self.ack_policy))
        if not self.timeout > 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be a whole number >= 0, got {self.max_retries!r}")
        if not self.resubscribe_wait >= 0:
            raise InvalidArgumentError(f"resubscribe_wait must be 0 or more seconds, got {self.resubscribe_wait!r}")

    def __repr__(self) -> str:
        # NATS URLs may carry user:password@; NatsSecurity's own repr hides its secrets.
        return (
            f"ConnectionSettings(brokers={self.brokers!r}, tls={self.tls!r},"
            f" nats_servers=[{redact_urls(self.nats_servers)}], nats_security={self.nats_security!r},"
            f" ack_policy={self.ack_policy.name}, timeout={self.timeout:g}, max_retries={self.max_retries},"
            f" resubscribe_wait={self.resubscribe_wait:g}, conn_id={self.conn_id!r})"
        )

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``LiftbridgeClient`` / ``AsyncLiftbridgeClient`` (brokers excluded)."""
        return {
            "tls": self.tls,
            "nats_servers": self.nats_servers,
            "nats_security": self.nats_security,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
            "ack_policy": self.ack_policy,
            "resubscribe_wait": self.resubscribe_wait,
        }

    def client(self, **options: Any) -> LiftbridgeClient:
        """A new blocking client with these settings (the caller closes it).

        :param options: further constructor options (e.g. ``subscription_channels``).

        :raises InvalidArgumentError: unreadable TLS files.
        """
        from .sync_client import LiftbridgeClient

        return LiftbridgeClient(list(self.brokers), **options, **self.client_kwargs())

    def async_client(self, **options: Any) -> AsyncLiftbridgeClient:
        """A new asyncio client with these settings (the caller closes it).

        :param options: further constructor options (e.g. ``subscription_reader``).

        :raises InvalidArgumentError: unreadable TLS files.
        """
        from .async_client import AsyncLiftbridgeClient

        return AsyncLiftbridgeClient(list(self.brokers), **options, **self.client_kwargs())
