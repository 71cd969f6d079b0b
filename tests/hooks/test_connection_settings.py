"""Parsing and validating ``liftbridge`` connections: good forms accepted, every bad field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import Connection

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, TlsConfig
from airflow_provider_liftbridge.exceptions import LiftbridgeConnectionConfigError
from airflow_provider_liftbridge.hooks.connection import parse_ack_policy, settings_from_connection


def conn(host: str | None = "127.0.0.1", port: Any = None, **extra: Any) -> Connection:
    return Connection(conn_id="lb_test", conn_type="liftbridge", host=host, port=port, extra=json.dumps(extra))


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    files = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text(f"-----BEGIN {name.upper()}-----\n")
        files[name] = str(path)
    return files


@pytest.mark.parametrize(
    ("host", "port", "brokers"),
    [
        ("127.0.0.1", None, ("127.0.0.1:9292",)),
        ("broker", 9300, ("broker:9300",)),
        ("a:1000, b , c:1002", 9400, ("a:1000", "b:9400", "c:1002")),
        ("liftbridge://h1:9292,liftbridge://h2:9293", None, ("h1:9292", "h2:9293")),
        ("[::1]:9500", None, ("[::1]:9500",)),
        ("broker", "9301", ("broker:9301",)),
    ],
)
def test_brokers_from_host_and_port(host: str, port: Any, brokers: tuple[str, ...]) -> None:
    assert settings_from_connection(conn(host, port)).brokers == brokers


def test_defaults_without_extras() -> None:
    settings = settings_from_connection(conn())
    assert settings.tls is None
    assert settings.nats_servers == ()
    assert settings.ack_policy is AckPolicy.LEADER
    assert (settings.timeout, settings.max_retries, settings.resubscribe_wait) == (10.0, 5, 30.0)
    assert settings.keepalive == (10.0, 10.0)


def test_all_extras_are_read(pem: dict[str, str]) -> None:
    settings = settings_from_connection(
        conn(
            tls_ca_file=pem["ca"],
            tls_cert_file=pem["cert"],
            tls_key_file=pem["key"],
            tls_server_name="lb.internal",
            nats_servers="127.0.0.1:4222, nats://n2:4223",
            ack_policy="ALL",
            timeout="2.5",
            max_retries=0,
            resubscribe_wait=1,
            keepalive_time="4",
            keepalive_timeout=6,
        )
    )
    assert settings.tls == TlsConfig(pem["ca"], pem["cert"], pem["key"], "lb.internal")
    assert settings.nats_servers == ("nats://127.0.0.1:4222", "nats://n2:4223")
    assert settings.ack_policy is AckPolicy.ALL
    assert (settings.timeout, settings.max_retries, settings.resubscribe_wait) == (2.5, 0, 1.0)
    assert settings.keepalive == (4.0, 6.0)
    with LiftbridgeClient.from_settings(settings) as client:  # built from the settings, nothing re-read
        assert client.settings is settings
        assert (client.tls, client.nats_servers) == (settings.tls, settings.nats_servers)


def test_prefixed_extras_and_blank_form_values_are_accepted() -> None:
    # Older connection forms stored extras as extra__<type>__<field>; forms also save empty strings.
    settings = settings_from_connection(
        conn(
            extra__liftbridge__ack_policy="none",
            extra__liftbridge__nats_servers=["nats://n:4222"],
            tls_ca_file="",
            timeout="",
            tls_enabled=False,
        )
    )
    assert settings.ack_policy is AckPolicy.NONE
    assert settings.nats_servers == ("nats://n:4222",)
    assert settings.tls is None and settings.timeout == 10.0


def test_tls_enabled_without_files_uses_system_roots() -> None:
    assert settings_from_connection(conn(tls_enabled="true")).tls == TlsConfig()


@pytest.mark.parametrize(
    ("kwargs", "field", "words"),
    [
        ({"host": None}, "host", "no broker"),
        ({"host": "  , "}, "host", "no broker"),
        ({"host": "h:99999"}, "host", "bad port"),
        ({"host": "h:x"}, "host", "bad port"),
        ({"host": ":9292"}, "host", "no host name"),
        ({"port": "abc"}, "port", "not a port"),
        ({"port": 70000}, "port", "out of range"),
        ({"ack_policy": "sometimes"}, "extra.ack_policy", "'leader', 'all', 'none'"),
        ({"ack_policy": 7}, "extra.ack_policy", "not an ack policy"),
        ({"timeout": 0}, "extra.timeout", "greater than 0"),
        ({"timeout": "soon"}, "extra.timeout", "not a number"),
        ({"keepalive_time": 0}, "extra.keepalive_time", "greater than 0"),
        ({"keepalive_timeout": "never"}, "extra.keepalive_timeout", "not a number"),
        ({"max_retries": -1}, "extra.max_retries", "at least 0"),
        ({"max_retries": 1.5}, "extra.max_retries", "whole number"),
        ({"tls_ca_file": "/nonexistent/ca.pem"}, "extra.tls_ca_file", "cannot read"),
        ({"tls_enabled": "maybe"}, "extra.tls_enabled", "boolean"),
        ({"nats_servers": "http://n:4222"}, "extra.nats_servers", "scheme"),
        ({"nats_servers": "n:port"}, "extra.nats_servers", "host:port"),
        ({"ack_polcy": "all"}, "extra.ack_polcy", "unknown extra"),
    ],
)
def test_bad_field_is_named(kwargs: dict[str, Any], field: str, words: str) -> None:
    host = kwargs.pop("host", "127.0.0.1")
    port = kwargs.pop("port", None)
    with pytest.raises(LiftbridgeConnectionConfigError) as info:
        settings_from_connection(conn(host, port, **kwargs))
    assert info.value.field == field
    assert words in str(info.value)
    assert "'lb_test'" in str(info.value)


def test_unreadable_cert_file_is_named(tmp_path: Path, pem: dict[str, str]) -> None:
    missing = str(tmp_path / "client.pem")
    with pytest.raises(LiftbridgeConnectionConfigError) as info:
        settings_from_connection(conn(tls_cert_file=missing, tls_key_file=pem["key"]))
    assert info.value.field == "extra.tls_cert_file"
    assert missing in str(info.value)


def test_client_cert_without_key_is_refused(pem: dict[str, str]) -> None:
    with pytest.raises(LiftbridgeConnectionConfigError) as info:
        settings_from_connection(conn(tls_cert_file=pem["cert"]))
    assert info.value.field == "extra.tls_key_file"


def test_tls_files_with_tls_disabled_is_refused(pem: dict[str, str]) -> None:
    with pytest.raises(LiftbridgeConnectionConfigError) as info:
        settings_from_connection(conn(tls_enabled=False, tls_ca_file=pem["ca"]))
    assert info.value.field == "extra.tls_ca_file"


@pytest.mark.parametrize(
    ("value", "policy"),
    [
        ("leader", AckPolicy.LEADER),
        ("All", AckPolicy.ALL),
        (" none ", AckPolicy.NONE),
        (1, AckPolicy.ALL),
        ("2", AckPolicy.NONE),
    ],
)
def test_parse_ack_policy(value: Any, policy: AckPolicy) -> None:
    assert parse_ack_policy(value) is policy


def test_parse_ack_policy_rejects_bool() -> None:
    with pytest.raises(ValueError, match="not an ack policy"):
        parse_ack_policy(True)
