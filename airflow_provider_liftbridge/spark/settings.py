"""Connection settings that travel from the driver to Spark executors.

Executors cannot use Airflow connections (no Airflow there, no metadata database), so the driver
resolves everything a client needs into plain, picklable values. The same settings round-trip
through string options for the ``liftbridge`` data source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import SparkOptionError

if TYPE_CHECKING:
    from airflow_provider_liftbridge.client import LiftbridgeClient

_N = TypeVar("_N", int, float)

# Data source option names (Spark lower-cases option keys; these are compared lower-cased).
OPT_BROKERS = "brokers"
OPT_NATS_SERVERS = "natsServers"
OPT_TLS_CA_FILE = "tlsCaFile"
OPT_TLS_CERT_FILE = "tlsCertFile"
OPT_TLS_KEY_FILE = "tlsKeyFile"
OPT_TLS_SERVER_NAME = "tlsServerName"
OPT_TIMEOUT = "timeout"
OPT_MAX_RETRIES = "maxRetries"

CONNECTION_OPTIONS = (
    OPT_BROKERS,
    OPT_NATS_SERVERS,
    OPT_TLS_CA_FILE,
    OPT_TLS_CERT_FILE,
    OPT_TLS_KEY_FILE,
    OPT_TLS_SERVER_NAME,
    OPT_TIMEOUT,
    OPT_MAX_RETRIES,
)


def _split(value: str | Sequence[str]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(item.strip() for item in items if item and item.strip())


@dataclass(frozen=True)
class ConnectionSettings:
    """Everything an executor needs to open its own Liftbridge client.

    TLS material is referenced by file path: the files must exist at the same path on every
    executor (ship them with ``--files`` or a shared mount).

    :param brokers: ``host:port`` of one or more brokers (``"h1:p1,h2:p2"`` or a sequence).
    :param nats_servers: NATS URLs; when given, bulk publishing goes straight to NATS with acks
        on an ack inbox (much faster than gRPC).
    :param tls_ca_file: CA bundle to verify the brokers, or ``None`` for plaintext.
    :param tls_cert_file: client certificate for mutual TLS.
    :param tls_key_file: private key of ``tls_cert_file``.
    :param tls_server_name: override of the TLS server name to verify.
    :param timeout: per-call deadline in seconds.
    :param max_retries: retries of UNAVAILABLE calls, cycling brokers.
    :raises SparkOptionError: when no broker is given or a number is out of range.
    """

    brokers: tuple[str, ...]
    nats_servers: tuple[str, ...] = field(default=())
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_server_name: str | None = None
    timeout: float = 10.0
    max_retries: int = 5

    def __post_init__(self) -> None:
        # Accept "h:p,h:p" strings and lists for convenience, store tuples (hashable, picklable).
        object.__setattr__(self, "brokers", _split(self.brokers))
        object.__setattr__(self, "nats_servers", _split(self.nats_servers))
        if not self.brokers:
            raise SparkOptionError("no Liftbridge broker given: pass brokers='host:port' (comma-separated for several)")
        if not self.timeout > 0:
            raise SparkOptionError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.max_retries < 0:
            raise SparkOptionError(f"max_retries must be >= 0, got {self.max_retries!r}")

    @property
    def uses_tls(self) -> bool:
        """Whether any TLS setting is present."""
        return any((self.tls_ca_file, self.tls_cert_file, self.tls_key_file, self.tls_server_name))

    def client(self) -> LiftbridgeClient:
        """Open a new client with these settings (the caller closes it).

        :raises airflow_provider_liftbridge.client.LiftbridgeError: if the client cannot be built.
        """
        from airflow_provider_liftbridge.client import LiftbridgeClient, TlsConfig

        tls = None
        if self.uses_tls:
            tls = TlsConfig(
                ca_file=self.tls_ca_file,
                cert_file=self.tls_cert_file,
                key_file=self.tls_key_file,
                server_name=self.tls_server_name,
            )
        return LiftbridgeClient(
            list(self.brokers),
            tls=tls,
            nats_servers=list(self.nats_servers),
            timeout=self.timeout,
            max_retries=self.max_retries,
        )

    @classmethod
    def from_connection_settings(cls, conn: Any) -> ConnectionSettings:
        """Copy the plain values out of the hook's parsed connection (``LiftbridgeConnectionSettings``).

        Duck-typed so executors never unpickle anything from the Airflow layer.

        :param conn: an object with ``brokers``, ``nats_servers``, ``tls``, ``timeout``, ``max_retries``.
        """
        tls = getattr(conn, "tls", None)
        return cls(
            brokers=tuple(conn.brokers),
            nats_servers=tuple(getattr(conn, "nats_servers", ()) or ()),
            tls_ca_file=getattr(tls, "ca_file", None),
            tls_cert_file=getattr(tls, "cert_file", None),
            tls_key_file=getattr(tls, "key_file", None),
            tls_server_name=getattr(tls, "server_name", None),
            timeout=float(getattr(conn, "timeout", 10.0)),
            max_retries=int(getattr(conn, "max_retries", 5)),
        )

    def to_options(self) -> dict[str, str]:
        """These settings as ``liftbridge`` data source options (strings only, ``None`` left out)."""
        options = {
            OPT_BROKERS: ",".join(self.brokers),
            OPT_NATS_SERVERS: ",".join(self.nats_servers),
            OPT_TLS_CA_FILE: self.tls_ca_file,
            OPT_TLS_CERT_FILE: self.tls_cert_file,
            OPT_TLS_KEY_FILE: self.tls_key_file,
            OPT_TLS_SERVER_NAME: self.tls_server_name,
            OPT_TIMEOUT: repr(self.timeout),
            OPT_MAX_RETRIES: str(self.max_retries),
        }
        return {key: value for key, value in options.items() if value}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ConnectionSettings:
        """Read settings from data source options (keys compared case-insensitively).

        :raises SparkOptionError: when ``brokers`` is missing or a number does not parse.
        """
        lowered = {key.lower(): value for key, value in options.items()}

        def get(name: str) -> str | None:
            value = lowered.get(name.lower())
            return value if value not in (None, "") else None

        brokers = get(OPT_BROKERS)
        if brokers is None:
            raise SparkOptionError("the liftbridge data source needs option 'brokers' (host:port, comma-separated)")
        return cls(
            brokers=_split(brokers),
            nats_servers=_split(get(OPT_NATS_SERVERS) or ""),
            tls_ca_file=get(OPT_TLS_CA_FILE),
            tls_cert_file=get(OPT_TLS_CERT_FILE),
            tls_key_file=get(OPT_TLS_KEY_FILE),
            tls_server_name=get(OPT_TLS_SERVER_NAME),
            timeout=_parse_number(OPT_TIMEOUT, get(OPT_TIMEOUT), float, 10.0),
            max_retries=_parse_number(OPT_MAX_RETRIES, get(OPT_MAX_RETRIES), int, 5),
        )


def _parse_number(name: str, raw: str | None, kind: type[_N], default: _N) -> _N:
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be a {kind.__name__}, got {raw!r}") from None
