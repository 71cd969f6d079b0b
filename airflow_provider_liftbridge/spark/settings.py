"""Connection settings as ``liftbridge`` data source options.

Executors cannot use Airflow connections (no Airflow there, no metadata database), so the driver
hands them a :class:`~airflow_provider_liftbridge.client.ConnectionSettings` (the project's one
settings type: plain and picklable). This module turns it into string options and back, for the
``liftbridge`` data source.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any, TypeVar

from airflow_provider_liftbridge.client import AckPolicy, ConnectionSettings, InvalidArgumentError, TlsConfig
from airflow_provider_liftbridge.client.settings import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT
from airflow_provider_liftbridge.nats_security import NatsSecurity, NatsSecurityError

from .errors import SparkOptionError

__all__ = ["CONNECTION_OPTIONS", "ConnectionSettings", "from_options", "to_options"]

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
OPT_ACK_POLICY = "ackPolicy"
OPT_RESUBSCRIBE_WAIT = "resubscribeWait"
OPT_KEEPALIVE_TIME = "keepaliveTime"
OPT_KEEPALIVE_TIMEOUT = "keepaliveTimeout"
#: NATS TLS and authentication: ``nats`` + the NatsSecurity field in camel case (``natsTlsCaFile``,
#: ``natsUser``, ``natsPassword``, ...). Spark redacts options named like password/token in plans.
NATS_SECURITY_OPTIONS = {
    "nats" + "".join(part.capitalize() for part in f.name.split("_")): f.name for f in fields(NatsSecurity)
}

CONNECTION_OPTIONS = (
    OPT_BROKERS,
    OPT_NATS_SERVERS,
    OPT_TLS_CA_FILE,
    OPT_TLS_CERT_FILE,
    OPT_TLS_KEY_FILE,
    OPT_TLS_SERVER_NAME,
    OPT_TIMEOUT,
    OPT_MAX_RETRIES,
    OPT_ACK_POLICY,
    OPT_RESUBSCRIBE_WAIT,
    OPT_KEEPALIVE_TIME,
    OPT_KEEPALIVE_TIMEOUT,
    *NATS_SECURITY_OPTIONS,
)


def to_options(settings: ConnectionSettings) -> dict[str, str]:
    """``settings`` as ``liftbridge`` data source options (strings only, unset ones left out)."""
    tls = settings.tls
    options = {
        OPT_BROKERS: ",".join(settings.brokers),
        OPT_NATS_SERVERS: ",".join(settings.nats_servers),
        OPT_TLS_CA_FILE: tls.ca_file if tls else None,
        OPT_TLS_CERT_FILE: tls.cert_file if tls else None,
        OPT_TLS_KEY_FILE: tls.key_file if tls else None,
        OPT_TLS_SERVER_NAME: tls.server_name if tls else None,
        OPT_ACK_POLICY: settings.ack_policy.name.lower(),
        OPT_TIMEOUT: repr(settings.timeout),
        OPT_MAX_RETRIES: str(settings.max_retries),
        OPT_RESUBSCRIBE_WAIT: repr(settings.resubscribe_wait),
        OPT_KEEPALIVE_TIME: repr(settings.keepalive_time),
        OPT_KEEPALIVE_TIMEOUT: repr(settings.keepalive_timeout),
    }
    if settings.nats_security is not None:
        for option, name in NATS_SECURITY_OPTIONS.items():
            value = getattr(settings.nats_security, name)
            options[option] = "true" if value is True else (value or None)
    return {key: value for key, value in options.items() if value}


def from_options(options: Mapping[str, str]) -> ConnectionSettings:
    """Read connection settings from data source options (keys compared case-insensitively).

    :raises SparkOptionError: ``brokers`` is missing, or a value does not parse or is out of range.
    """
    lowered = {key.lower(): value for key, value in options.items()}

    def get(name: str) -> str | None:
        value = lowered.get(name.lower())
        return value if value not in (None, "") else None

    brokers = get(OPT_BROKERS)
    if brokers is None:
        raise SparkOptionError("the liftbridge data source needs option 'brokers' (host:port, comma-separated)")
    tls_files = (get(OPT_TLS_CA_FILE), get(OPT_TLS_CERT_FILE), get(OPT_TLS_KEY_FILE), get(OPT_TLS_SERVER_NAME))
    tls = TlsConfig(*tls_files) if any(tls_files) else None
    policy = get(OPT_ACK_POLICY) or "leader"
    if policy.upper() not in AckPolicy.__members__:
        raise SparkOptionError(f"option {OPT_ACK_POLICY!r} must be one of leader, all, none; got {policy!r}")
    try:
        return ConnectionSettings(
            brokers=brokers,  # type: ignore[arg-type]  # normalised to a tuple
            tls=tls,
            nats_servers=get(OPT_NATS_SERVERS) or (),  # type: ignore[arg-type]
            ack_policy=AckPolicy[policy.upper()],
            timeout=_parse_number(OPT_TIMEOUT, get(OPT_TIMEOUT), float, 10.0),
            max_retries=_parse_number(OPT_MAX_RETRIES, get(OPT_MAX_RETRIES), int, 5),
            resubscribe_wait=_parse_number(OPT_RESUBSCRIBE_WAIT, get(OPT_RESUBSCRIBE_WAIT), float, 30.0),
            keepalive_time=_parse_number(OPT_KEEPALIVE_TIME, get(OPT_KEEPALIVE_TIME), float, KEEPALIVE_TIME),
            keepalive_timeout=_parse_number(
                OPT_KEEPALIVE_TIMEOUT, get(OPT_KEEPALIVE_TIMEOUT), float, KEEPALIVE_TIMEOUT
            ),
            nats_security=_nats_security(get),
        )
    except (InvalidArgumentError, NatsSecurityError) as exc:
        raise SparkOptionError(f"bad connection option: {exc}") from None


def _nats_security(get: Callable[[str], str | None]) -> NatsSecurity | None:
    values: dict[str, Any] = {name: get(option) for option, name in NATS_SECURITY_OPTIONS.items()}
    if not any(values.values()):
        return None
    values["tls"] = str(values["tls"] or "").lower() in ("true", "1", "yes")
    return NatsSecurity(**values)


def _parse_number(name: str, raw: str | None, kind: type[_N], default: _N) -> _N:
    if raw is None:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise SparkOptionError(f"option {name!r} must be a {kind.__name__}, got {raw!r}") from None
