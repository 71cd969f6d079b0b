"""How to reach a Liftbridge cluster, as one plain, picklable value.

The one settings type of the project, and the one place the connection options are read and
checked: the Airflow hook parses a ``liftbridge`` connection into it, Spark ships it to executors
(which have no Airflow), the command-line job builds it from its arguments, and both clients are
built from it (``LiftbridgeClient.from_settings(settings)``; their keywords make one too;
:class:`~.routing.ClientCore` reads it). It imports
neither Airflow nor PySpark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_liftbridge.nats_security import NatsSecurity, check_nats_url, redact_urls

from .errors import InvalidArgumentError
from .types import AckPolicy, TlsConfig

__all__ = ["KEEPALIVE_TIME", "KEEPALIVE_TIMEOUT", "ConnectionSettings", "parse_brokers"]

#: Default seconds between keepalive pings of a gRPC connection with calls on it, and how long a
#: ping may go unanswered before the connection counts as dead: together, how long a call on a
#: silent link (packets dropped, nothing reset) takes to notice (docs/reliability.md, "Silent
#: links"; there too what pinging costs against a server that limits pings, as Liftbridge does).
KEEPALIVE_TIME = 10.0
KEEPALIVE_TIMEOUT = 10.0


def parse_brokers(brokers: str | Sequence[str]) -> list[str]:
    """Normalise ``"h:p"``, ``"h1:p1,h2:p2"`` or a list of those into a list of ``host:port``.

    :raises InvalidArgumentError: no address, or one without a numeric port.
    """
    items = brokers.split(",") if isinstance(brokers, str) else [b for part in brokers for b in part.split(",")]
    out: list[str] = []
    for raw in items:
        addr = raw.strip()
        if not addr:
            continue
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgumentError(f"broker address {addr!r} is not host:port; write it like '127.0.0.1:9292'")
        if addr not in out:
            out.append(addr)
    if not out:
        raise InvalidArgumentError(f"no broker address in {brokers!r}; give at least one 'host:port'")
    return out


def _nats_urls(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The NATS URLs, split at commas and checked (a URL that is not one would otherwise read as
    a host name and the NATS path fail later, or quietly fall back to gRPC).

    :raises InvalidArgumentError: one is not a NATS URL.
    """
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else [i for part in value for i in str(part).split(",")]
    try:
        return tuple(check_nats_url(item.strip()) for item in items if item.strip())
    except ValueError as exc:
        raise InvalidArgumentError(f"nats_servers: {exc}") from None


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
    :param timeout: per-call deadline in seconds; also bounds a call's waiting for a leader.
    :param max_retries: the fewest retries of a call on an unavailable broker, cycling brokers.
    :param resubscribe_wait: how long a subscription tries to resubscribe, in seconds.
    :param conn_id: where the settings came from (an Airflow connection id), for messages.
    :param backoff_base: first retry wait in seconds (doubled per retry; not shipped to Spark).
    :param backoff_max: longest retry wait in seconds (not shipped to Spark).
    :param keepalive_time: seconds between keepalive pings of a gRPC connection with calls on it.
    :param keepalive_timeout: seconds a ping may go unanswered before the connection counts as dead
        and its calls fail (UNAVAILABLE, retried as any lost connection): a silent link is noticed
        within ``keepalive_time + keepalive_timeout``.
    :raises InvalidArgumentError: no broker, a broker that is not ``host:port``, a NATS server
        that is not a NATS URL, a non-positive timeout or keepalive, a negative ``max_retries``,
        ``resubscribe_wait`` or backoff.
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
    backoff_base: float = 0.05
    backoff_max: float = 2.0
    keepalive_time: float = KEEPALIVE_TIME
    keepalive_timeout: float = KEEPALIVE_TIMEOUT

    def __post_init__(self) -> None:
        # Accept "h:p,h:p" strings and lists for convenience; store tuples (hashable, picklable).
        object.__setattr__(self, "brokers", tuple(parse_brokers(self.brokers)))
        object.__setattr__(self, "nats_servers", _nats_urls(self.nats_servers))
        object.__setattr__(self, "ack_policy", AckPolicy(self.ack_policy))
        object.__setattr__(self, "timeout", float(self.timeout))
        if not self.timeout > 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be a whole number >= 0, got {self.max_retries!r}")
        if not self.resubscribe_wait >= 0:
            raise InvalidArgumentError(f"resubscribe_wait must be 0 or more seconds, got {self.resubscribe_wait!r}")
        for name in ("keepalive_time", "keepalive_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {value!r}")
            object.__setattr__(self, name, float(value))
        if not 0 <= self.backoff_base <= self.backoff_max:
            raise InvalidArgumentError(
                f"backoff_base and backoff_max must be 0 <= base <= max seconds, got {self.backoff_base!r}, "
                f"{self.backoff_max!r}"
            )

    @property
    def keepalive(self) -> tuple[float, float]:
        """``(keepalive_time, keepalive_timeout)``."""
        return (self.keepalive_time, self.keepalive_timeout)

    def __repr__(self) -> str:
        # NATS URLs may carry user:password@; NatsSecurity's own repr hides its secrets.
        return (
            f"ConnectionSettings(brokers={self.brokers!r}, tls={self.tls!r},"
            f" nats_servers=[{redact_urls(self.nats_servers)}], nats_security={self.nats_security!r},"
            f" ack_policy={self.ack_policy.name}, timeout={self.timeout:g}, max_retries={self.max_retries},"
            f" resubscribe_wait={self.resubscribe_wait:g},"
            f" keepalive={self.keepalive_time:g}+{self.keepalive_timeout:g}, conn_id={self.conn_id!r})"
        )
