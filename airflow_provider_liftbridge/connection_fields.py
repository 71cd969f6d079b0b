"""The ``liftbridge`` connection form, declared as data.

Airflow 3.2+ reads these declarations from the provider metadata (``conn-fields`` and
``ui-field-behaviour`` in :func:`airflow_provider_liftbridge.get_provider_info.get_provider_info`)
without importing the hook. The hook parses the same extras (see
:mod:`airflow_provider_liftbridge.hooks.connection`), so the names live here once.

A neutral module: it imports nothing, so reading provider metadata stays cheap, and the
hooks and :mod:`airflow_provider_liftbridge.exceptions` both read the names from here.
"""

from __future__ import annotations

from typing import Any

CONN_TYPE = "liftbridge"
DEFAULT_CONN_ID = "liftbridge_default"
DEFAULT_PORT = 9292
HOOK_CLASS_NAME = "airflow_provider_liftbridge.hooks.base.LiftbridgeHook"


def field_label(name: str) -> str:
    """The form's label of a connection field (``host``, ``port``, ``login``, ``password``,
    ``extra`` or an extra field's key), for messages."""
    if name in STANDARD_LABELS:
        return STANDARD_LABELS[name]
    entry = CONN_FIELDS.get(name)
    return str(entry["label"]) if entry else name


#: Extra fields of the connection form (stored in the connection's ``extra`` JSON).
CONN_FIELDS: dict[str, dict[str, Any]] = {
    "tls_enabled": {
        "label": "Use TLS",
        "schema": {"type": ["boolean", "null"], "default": False},
        "description": "Connect to the brokers over TLS (on by itself when a TLS file is set).",
    },
    "tls_ca_file": {
        "label": "TLS CA file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM file of the CA that signed the broker certificates, e.g. /etc/liftbridge/ca.pem;"
        " empty: system roots.",
    },
    "tls_cert_file": {
        "label": "TLS client certificate file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM client certificate for mutual TLS (needs the key file), e.g. /etc/liftbridge/client.pem.",
    },
    "tls_key_file": {
        "label": "TLS client key file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM private key of the client certificate, e.g. /etc/liftbridge/client-key.pem.",
    },
    "tls_server_name": {
        "label": "TLS server name",
        "schema": {"type": ["string", "null"]},
        "description": "Name to check the broker certificate against, when it differs from the host,"
        " e.g. liftbridge.internal.",
    },
    "nats_servers": {
        "label": "NATS servers",
        "schema": {"type": ["string", "null"]},
        "description": "Comma-separated NATS URLs, e.g. nats://127.0.0.1:4222 or nats://n1:4222,nats://n2:4222"
        " (tls://host:4222 for TLS); for ack inboxes, exactly-once and fast bulk publishing.",
    },
    "nats_tls_enabled": {
        "label": "Use TLS for NATS",
        "schema": {"type": ["boolean", "null"], "default": False},
        "description": "Connect to NATS over TLS (on by itself when a NATS TLS file is set or a URL is tls://).",
    },
    "nats_tls_ca_file": {
        "label": "NATS TLS CA file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM file of the CA that signed the NATS server certificate, e.g. /etc/nats/ca.pem;"
        " empty: system roots.",
    },
    "nats_tls_cert_file": {
        "label": "NATS TLS client certificate file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM client certificate for NATS mutual TLS (needs the key file), e.g. /etc/nats/client.pem.",
    },
    "nats_tls_key_file": {
        "label": "NATS TLS client key file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM private key of the NATS client certificate, e.g. /etc/nats/client-key.pem.",
    },
    "nats_tls_server_name": {
        "label": "NATS TLS server name",
        "schema": {"type": ["string", "null"]},
        "description": "Name to check the NATS certificate against, when it differs from the host, e.g. nats.internal.",
    },
    "nats_token": {
        "label": "NATS token",
        "schema": {"type": ["string", "null"], "format": "password"},
        "description": "Token authentication to NATS (instead of NATS user/password, NKEY or credentials file).",
    },
    "nats_nkey_seed_file": {
        "label": "NATS NKEY seed file",
        "schema": {"type": ["string", "null"]},
        "description": "File holding an NKEY user seed (SU...), e.g. /etc/nats/user.nk; needs the nkeys package.",
    },
    "nats_credentials_file": {
        "label": "NATS credentials file",
        "schema": {"type": ["string", "null"]},
        "description": "A NATS .creds file (user JWT and seed), e.g. /etc/nats/airflow.creds; needs the nkeys package.",
    },
    "ack_policy": {
        "label": "Default ack policy",
        "schema": {"type": ["string", "null"], "default": "leader", "enum": ["leader", "all", "none"]},
        "description": "When the server acknowledges a publish: leader, all (every in-sync replica) or none.",
    },
    "timeout": {
        "label": "Call timeout (seconds)",
        "schema": {"type": ["number", "null"], "default": 10},
        "description": "Deadline of each call to a broker, in seconds, e.g. 10.",
    },
    "max_retries": {
        "label": "Retries on unavailable brokers",
        "schema": {"type": ["integer", "null"], "default": 5},
        "description": "How many times a call is retried, cycling through the brokers, when one is unavailable,"
        " e.g. 5.",
    },
    "resubscribe_wait": {
        "label": "Resubscribe wait (seconds)",
        "schema": {"type": ["number", "null"], "default": 30},
        "description": "How long a subscription keeps trying to resubscribe after a transient failure, e.g. 30.",
    },
    "keepalive_time": {
        "label": "Keepalive ping interval (seconds)",
        "schema": {"type": ["number", "null"], "default": 10},
        "description": "Seconds between pings of a broker connection with calls open, e.g. 10. With the ping"
        " timeout, how long a call on a silent link (packets dropped, nothing reset) takes to notice.",
    },
    "keepalive_timeout": {
        "label": "Keepalive ping timeout (seconds)",
        "schema": {"type": ["number", "null"], "default": 10},
        "description": "Seconds a ping may go unanswered before the connection counts as dead and its calls"
        " are retried elsewhere, e.g. 10.",
    },
}

#: The form's name of each standard field (Liftbridge has no schema; login/password are NATS's).
STANDARD_LABELS: dict[str, str] = {
    "host": "Brokers",
    "port": "Default broker port",
    "login": "NATS user",
    "password": "NATS password",
    "extra": "Extra",
}

#: How the standard connection fields are shown. Placeholders of the standard fields are shown;
#: Airflow 3.3 shows none for extra fields, so their examples are in their descriptions.
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema"],
    "relabeling": {name: STANDARD_LABELS[name] for name in ("host", "port", "login", "password")},
    "placeholders": {
        "host": "127.0.0.1:9292 or broker1:9292,broker2:9292",
        "port": f"{DEFAULT_PORT} (used for brokers given without a port)",
        "login": "NATS user (with NATS password), if NATS requires one",
        "nats_servers": "nats://127.0.0.1:4222",
        "tls_ca_file": "/etc/liftbridge/ca.pem",
    },
}


def connection_type_info() -> dict[str, Any]:
    """The ``connection-types`` entry of the provider metadata."""
    return {
        "hook-class-name": HOOK_CLASS_NAME,
        "hook-name": "Liftbridge",
        "connection-type": CONN_TYPE,
        "conn-fields": CONN_FIELDS,
        "ui-field-behaviour": UI_FIELD_BEHAVIOUR,
    }
