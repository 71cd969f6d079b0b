"""Turn an Airflow ``liftbridge`` connection into client settings
(:class:`~airflow_provider_liftbridge.client.ConnectionSettings`), validating every field.

Shared by the sync hook (tasks) and the async hook (triggers): they differ only in how they
fetch the connection and which client class they build.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from airflow_provider_liftbridge.client import AckPolicy, ConnectionSettings, TlsConfig
from airflow_provider_liftbridge.client.settings import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT
from airflow_provider_liftbridge.exceptions import LiftbridgeConnectionConfigError
from airflow_provider_liftbridge.extras import MissingExtraError, needs_extra
from airflow_provider_liftbridge.nats_security import NatsSecurity

from ..connection_fields import CONN_FIELDS, CONN_TYPE, DEFAULT_PORT, field_label
from ..nats_security import check_nats_url
from ..validation import check_ack_policy

__all__ = ["ConnectionLike", "parse_ack_policy", "settings_from_connection"]

_EXTRA_PREFIX = f"extra__{CONN_TYPE}__"
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class ConnectionLike(Protocol):
    """The parts of an Airflow ``Connection`` the parser reads."""

    conn_id: str
    host: str | None
    port: int | None
    login: str | None
    password: str | None
    extra: str | None

    @property
    def extra_dejson(self) -> dict[str, Any]: ...


def parse_ack_policy(value: object, *, what: str = "ack_policy") -> AckPolicy:
    """Read an ack policy given as ``"leader"``/``"all"``/``"none"`` (any case), its wire number, or
    an :class:`AckPolicy` (:func:`~airflow_provider_liftbridge.validation.check_ack_policy`).

    :raises ValueError: the value names no ack policy (the message lists the accepted ones).
    """
    return check_ack_policy(value, what)


def settings_from_connection(conn: ConnectionLike) -> ConnectionSettings:
    """Validate a ``liftbridge`` connection and return its settings.

    Extras are read under their plain names (``tls_ca_file``) or the prefixed form older forms
    stored (``extra__liftbridge__tls_ca_file``).

    :raises LiftbridgeConnectionConfigError: one field is missing or invalid; the error names it.
    """
    conn_id = conn.conn_id or "<unnamed>"

    def fail(field_name: str, problem: str) -> LiftbridgeConnectionConfigError:
        return LiftbridgeConnectionConfigError(conn_id, field_name, problem)

    port = _parse_port(conn.port, fail)
    brokers = _parse_brokers(conn.host, port, fail)
    extras = _normalise_extras(_extra_object(conn, fail), fail)

    tls = _parse_tls(extras, fail)
    nats_servers = _parse_nats_servers(extras.get("nats_servers"), fail)
    nats_security = _parse_nats_security(conn, extras, fail)
    try:
        ack_policy = parse_ack_policy(_blank_to_none(extras.get("ack_policy")) or AckPolicy.LEADER)
    except ValueError as exc:
        raise fail("extra.ack_policy", str(exc)) from None
    timeout = _parse_number(extras, "timeout", 10.0, fail, minimum=0.0, strict=True)
    max_retries = int(_parse_number(extras, "max_retries", 5, fail, minimum=0, integer=True))
    resubscribe_wait = _parse_number(extras, "resubscribe_wait", 30.0, fail, minimum=0.0)
    keepalive_time = _parse_number(extras, "keepalive_time", KEEPALIVE_TIME, fail, minimum=0.0, strict=True)
    keepalive_timeout = _parse_number(extras, "keepalive_timeout", KEEPALIVE_TIMEOUT, fail, minimum=0.0, strict=True)
    return ConnectionSettings(
        conn_id=conn_id,
        brokers=brokers,
        tls=tls,
        nats_servers=nats_servers,
        nats_security=nats_security,
        ack_policy=ack_policy,
        timeout=timeout,
        max_retries=max_retries,
        resubscribe_wait=resubscribe_wait,
        keepalive_time=keepalive_time,
        keepalive_timeout=keepalive_timeout,
    )


def _extra_object(conn: ConnectionLike, fail: Any) -> Mapping[str, Any] | None:
    """The connection's extras as a mapping.

    Airflow's ``extra_dejson`` logs an extra that is not JSON and returns ``{}``, which would run
    the hook on defaults; the raw string is parsed here so the error names the field instead.
    """
    raw = getattr(conn, "extra", None)
    if isinstance(raw, str) and raw.strip():
        try:
            json.loads(raw)
        except ValueError as exc:
            raise fail("extra", f"is not valid JSON ({exc}); write it as a JSON object") from None
    return conn.extra_dejson


def _blank_to_none(value: Any) -> Any:
    return None if value is None or (isinstance(value, str) and not value.strip()) else value


def _parse_port(value: object, fail: Any) -> int:
    if value is None or value == "":
        return DEFAULT_PORT
    try:
        port = int(str(value).strip())
    except ValueError:
        raise fail("port", f"{value!r} is not a port number; use 1-65535 (default {DEFAULT_PORT})") from None
    if not 0 < port < 65536:
        raise fail("port", f"{port} is out of range; use 1-65535 (default {DEFAULT_PORT})")
    return port


def _split_host_port(entry: str) -> tuple[str, str | None]:
    """Split ``host[:port]``, ``[v6][:port]``; a bare IPv6 address keeps all its colons."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else (None if not rest else rest)
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, port
    return entry, None


def _parse_brokers(host: str | None, default_port: int, fail: Any) -> tuple[str, ...]:
    text = (host or "").strip()
    if "://" in text:
        # Tolerate a URL-ish host ("liftbridge://h:9292"); the scheme carries no meaning here.
        text = ",".join(part.split("://", 1)[-1] for part in text.split(","))
    entries = [part.strip() for part in text.split(",") if part.strip()]
    if not entries:
        raise fail("host", "no broker given; set it to 'host', 'host:port' or a comma-separated list of them")
    brokers: list[str] = []
    for entry in entries:
        name, port_text = _split_host_port(entry)
        if not name:
            raise fail("host", f"broker {entry!r} has no host name")
        if port_text is None:
            port = default_port
        else:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise fail("host", f"broker {entry!r} has a bad port {port_text!r}; use host:port with a port 1-65535")
            port = int(port_text)
        brokers.append(f"[{name}]:{port}" if ":" in name else f"{name}:{port}")
    return tuple(brokers)


def _normalise_extras(extra: Mapping[str, Any] | None, fail: Any) -> dict[str, Any]:
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise fail("extra", "must be a JSON object")
    extras: dict[str, Any] = {}
    unknown: list[str] = []
    for raw_key, value in extra.items():
        key = raw_key[len(_EXTRA_PREFIX) :] if raw_key.startswith(_EXTRA_PREFIX) else raw_key
        if key not in CONN_FIELDS:
            unknown.append(raw_key)
            continue
        extras[key] = value
    if unknown:
        raise fail(
            "extra." + unknown[0],
            f"unknown extra field(s) {', '.join(sorted(unknown))}; accepted: {', '.join(CONN_FIELDS)}",
        )
    return extras


def _parse_bool(value: Any, field_name: str, fail: Any) -> bool | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return None if text == "" else False
    raise fail(f"extra.{field_name}", f"{value!r} is not a boolean; use true or false")


def _check_readable(path: str, field_name: str, fail: Any) -> str:
    expanded = os.path.expanduser(path)
    try:
        with open(expanded, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        raise fail(f"extra.{field_name}", f"cannot read {path!r}: {exc.strerror or exc}") from None
    return expanded


def _tls_files(extras: Mapping[str, Any], prefix: str, fail: Any) -> tuple[bool, dict[str, str], str | None]:
    """The TLS fields ``<prefix>tls_*``: (whether TLS is on, readable file paths by field, server name).

    TLS is on when ``<prefix>tls_enabled`` is true, or unset while a file or the server name is
    set; a file set while TLS is switched off, or a certificate without its key, names the field.
    """
    switch = f"{prefix}tls_enabled"
    enabled = _parse_bool(extras.get(switch), switch, fail)
    names = [f"{prefix}tls_ca_file", f"{prefix}tls_cert_file", f"{prefix}tls_key_file"]
    files = {name: _blank_to_none(extras.get(name)) for name in names}
    server_name = _blank_to_none(extras.get(f"{prefix}tls_server_name"))
    configured = [name for name, value in files.items() if value is not None]
    if enabled is False:
        if configured or server_name:
            first = configured[0] if configured else f"{prefix}tls_server_name"
            switch_label = field_label(switch)
            raise fail(
                f"extra.{first}", f"is set while {switch_label!r} is off; clear it or switch {switch_label!r} on"
            )
        return False, {}, None
    if enabled is None and not configured and not server_name:
        return False, {}, None
    cert, key = names[1], names[2]
    if (files[cert] is None) != (files[key] is None):
        missing = key if files[key] is None else cert
        raise fail(f"extra.{missing}", "mutual TLS needs both the client certificate and its key")
    paths = {name: _check_readable(str(value), name, fail) for name, value in files.items() if value is not None}
    return True, paths, str(server_name) if server_name else None


def _parse_tls(extras: Mapping[str, Any], fail: Any) -> TlsConfig | None:
    enabled, paths, server_name = _tls_files(extras, "", fail)
    if not enabled:
        return None
    return TlsConfig(
        ca_file=paths.get("tls_ca_file"),
        cert_file=paths.get("tls_cert_file"),
        key_file=paths.get("tls_key_file"),
        server_name=server_name,
    )


def _parse_nats_security(conn: ConnectionLike, extras: Mapping[str, Any], fail: Any) -> NatsSecurity | None:
    """NATS TLS (the ``nats_tls_*`` extras) and authentication (login/password, or one of the
    ``nats_token``, ``nats_nkey_seed_file``, ``nats_credentials_file`` extras)."""
    tls, paths, server_name = _tls_files(extras, "nats_", fail)
    user = _blank_to_none(getattr(conn, "login", None))
    password = _blank_to_none(getattr(conn, "password", None))
    if (user is None) != (password is None):
        raise fail("password" if password is None else "login", "NATS user and NATS password go together; set both")
    token = _blank_to_none(extras.get("nats_token"))
    files = {
        name: _check_readable(str(value), name, fail)
        for name in ("nats_nkey_seed_file", "nats_credentials_file")
        if (value := _blank_to_none(extras.get(name))) is not None
    }
    forms = [name for name, value in (("login", user), ("nats_token", token)) if value is not None] + list(files)
    if len(forms) > 1:
        labels = " and ".join(repr(field_label(f)) for f in forms)
        raise fail(
            forms[1] if forms[1] == "login" else f"extra.{forms[1]}",
            f"NATS takes one form of authentication but {labels} are set; keep one",
        )
    if files:
        try:
            with needs_extra("nats-nkeys", "reading it on every worker and triggerer"):
                import nkeys  # noqa: F401
        except MissingExtraError as exc:
            raise fail(f"extra.{next(iter(files))}", str(exc)) from None
    if not tls and not forms:
        return None
    return NatsSecurity(
        tls=tls,
        tls_ca_file=paths.get("nats_tls_ca_file"),
        tls_cert_file=paths.get("nats_tls_cert_file"),
        tls_key_file=paths.get("nats_tls_key_file"),
        tls_server_name=server_name,
        user=str(user) if user is not None else None,
        password=str(password) if password is not None else None,
        token=str(token) if token is not None else None,
        nkey_seed_file=files.get("nats_nkey_seed_file"),
        credentials_file=files.get("nats_credentials_file"),
    )


def _parse_nats_servers(value: Any, fail: Any) -> tuple[str, ...]:
    value = _blank_to_none(value)
    if value is None:
        return ()
    if isinstance(value, str):
        entries = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, Sequence):
        entries = [str(part).strip() for part in value if str(part).strip()]
    else:
        raise fail("extra.nats_servers", f"{type(value).__name__} is neither a comma-separated string nor a list")
    servers: list[str] = []
    for entry in entries:
        try:
            servers.append(check_nats_url(entry))
        except ValueError as exc:
            raise fail("extra.nats_servers", str(exc)) from None
    return tuple(servers)


def _parse_number(
    extras: Mapping[str, Any],
    name: str,
    default: float,
    fail: Any,
    *,
    minimum: float,
    integer: bool = False,
    strict: bool = False,
) -> float:
    value = _blank_to_none(extras.get(name))
    if value is None:
        return default
    kind = "a whole number" if integer else "a number"
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(str(value).strip()) if integer else float(value)
    except (TypeError, ValueError):
        raise fail(f"extra.{name}", f"{value!r} is not {kind}") from None
    if number < minimum or (strict and number == minimum):
        bound = f"greater than {minimum:g}" if strict else f"at least {minimum:g}"
        raise fail(f"extra.{name}", f"{value!r} must be {bound}")
    return number
