"""The ``liftbridge`` connection form, declared as data.

Airflow 3.2+ reads these declarations from the provider metadata (``conn-fields`` and
``ui-field-behaviour`` in :func:`airflow_provider_liftbridge.get_provider_info.get_provider_info`)
without importing the hook. The hook parses the same extras (see
:mod:`airflow_provider_liftbridge.hooks.connection`), so the names live here once.

This module imports nothing, so reading provider metadata stays cheap.
"""

from __future__ import annotations

from typing import Any

CONN_TYPE = "liftbridge"
DEFAULT_CONN_ID = "liftbridge_default"
DEFAULT_PORT = 9292
HOOK_CLASS_NAME = "airflow_provider_liftbridge.hooks.base.LiftbridgeHook"

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
        "description": "PEM file of the CA that signed the broker certificates; empty: system roots.",
    },
    "tls_cert_file": {
        "label": "TLS client certificate file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM client certificate for mutual TLS (needs the key file).",
    },
    "tls_key_file": {
        "label": "TLS client key file",
        "schema": {"type": ["string", "null"]},
        "description": "PEM private key of the client certificate.",
    },
    "tls_server_name": {
        "label": "TLS server name",
        "schema": {"type": ["string", "null"]},
        "description": "Name to check the broker certificate against, when it differs from the host.",
    },
    "nats_servers": {
        "label": "NATS servers",
        "schema": {"type": ["string", "null"]},
        "description": "Comma-separated nats://host:port list, for ack inboxes and NATS-direct bulk publishing.",
    },
    "ack_policy": {
        "label": "Default ack policy",
        "schema": {"type": ["string", "null"], "default": "leader", "enum": ["leader", "all", "none"]},
        "description": "When the server acknowledges a publish: leader, all (every in-sync replica) or none.",
    },
    "timeout": {
        "label": "Call timeout (seconds)",
        "schema": {"type": ["number", "null"], "default": 10},
        "description": "Deadline of each call to a broker.",
    },
    "max_retries": {
        "label": "Retries on unavailable brokers",
        "schema": {"type": ["integer", "null"], "default": 5},
        "description": "How many times a call is retried, cycling through the brokers, when one is unavailable.",
    },
    "resubscribe_wait": {
        "label": "Resubscribe wait (seconds)",
        "schema": {"type": ["number", "null"], "default": 30},
        "description": "How long a subscription keeps trying to resubscribe after a transient failure.",
    },
}

#: How the standard connection fields are shown (Liftbridge has no login/password/schema).
UI_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden-fields": ["schema", "login", "password"],
    "relabeling": {"host": "Brokers"},
    "placeholders": {
        "host": "127.0.0.1:9292 or broker1:9292,broker2:9292",
        "port": str(DEFAULT_PORT),
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
