"""The connection Test (``LiftbridgeHook.test_connection``): a distinct cause per failure with
what to check, no retry advice, labels of the form, cursors and every NATS server checked.

Everything is real: the dev server (with cursors on and off), its nats-server, a local HTTP
server, refused ports and an unresolvable host name.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.devserver import DevServer, NatsServerSecurity
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from airflow_provider_liftbridge.nats_security import NatsSecurity
from tests.airflow_support import conn_env_name, liftbridge_conn_json
from tests.hooks.test_hook import free_port

pytestmark = pytest.mark.timeout(120)
SECRET = "s3cret-Pa55"


def _test(monkeypatch: pytest.MonkeyPatch, host: str, **extra: object) -> tuple[bool, str]:
    # Airflow's Test button runs under a random temporary id like this one.
    monkeypatch.setenv(conn_env_name("xWeHEyUD"), liftbridge_conn_json(host, **extra))  # type: ignore[arg-type]
    ok, message = LiftbridgeHook("xWeHEyUD").test_connection()
    assert "xWeHEyUD" not in message and "max_retries" not in message
    return ok, message


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_success_reports_cursors_and_nats(monkeypatch: pytest.MonkeyPatch, lb_address: str, nats_url: str) -> None:
    ok, message = _test(monkeypatch, lb_address, nats_servers=nats_url)
    assert ok, message
    assert "Cursors: enabled" in message
    assert f"NATS: {nats_url} connected" in message


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("refused", "connection refused"),
        ("unknown host", "unknown host name"),
        ("tls against plain", "the server does not speak TLS"),
        ("nats port", "this is a NATS server, not a Liftbridge broker"),
        ("http server", "an HTTP server answered"),
    ],
)
def test_each_network_failure_has_its_own_cause(
    monkeypatch: pytest.MonkeyPatch, lb_address: str, nats_url: str, http_port: int, kind: str, words: str
) -> None:
    host, extra = {
        "refused": (f"127.0.0.1:{free_port()}", {}),
        "unknown host": ("no-such-host.invalid:9292", {}),
        "tls against plain": (lb_address, {"tls_enabled": True}),
        "nats port": (nats_url.removeprefix("nats://"), {}),
        "http server": (f"127.0.0.1:{http_port}", {}),
    }[kind]
    ok, message = _test(monkeypatch, host, timeout=3, **extra)
    assert not ok
    assert message.startswith("none of the 1 configured broker(s) answered")
    assert words in message
    assert message.count(host) == 1, message  # named once


def test_a_bad_nats_server_fails_the_test(monkeypatch: pytest.MonkeyPatch, lb_address: str) -> None:
    dead = f"nats://127.0.0.1:{free_port()}"
    ok, message = _test(monkeypatch, lb_address, nats_servers=dead)
    assert not ok
    assert "1 of 1 configured broker(s) answered" in message
    assert f"cannot connect to NATS at {dead}: connection refused" in message


def test_a_nats_url_without_scheme_is_connected_to_as_nats(
    monkeypatch: pytest.MonkeyPatch, lb_address: str, nats_url: str
) -> None:
    ok, message = _test(monkeypatch, lb_address, nats_servers=nats_url.removeprefix("nats://"))
    assert ok and f"NATS: {nats_url} connected" in message, message
    dead = f"127.0.0.1:{free_port()}"
    ok, message = _test(monkeypatch, lb_address, nats_servers=dead)
    assert not ok and f"cannot connect to NATS at nats://{dead}: connection refused" in message


def test_a_broker_port_given_as_nats_fails_the_test(monkeypatch: pytest.MonkeyPatch, lb_address: str) -> None:
    ok, message = _test(monkeypatch, lb_address, nats_servers=lb_address, timeout=2)
    assert not ok
    assert "cannot connect to NATS at nats://" in message


def test_cursors_disabled_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    with DevServer(cursors=False) as server:
        ok, message = _test(monkeypatch, server.address)
    assert ok, message  # the connection works; what needs cursors will not
    assert "Cursors: disabled on this cluster" in message and "cursors.stream.partitions" in message


@pytest.mark.parametrize(
    ("extra", "label"),
    [
        ({"timeout": 0}, "'Call timeout (seconds)'"),
        ({"tls_ca_file": "/no/such/ca.pem"}, "'TLS CA file'"),
        ({"nats_servers": "http://h:1"}, "'NATS servers'"),
        ({"nats_tls_enabled": False, "nats_tls_ca_file": "/x"}, "'NATS TLS CA file'"),
    ],
)
def test_bad_fields_are_named_by_their_label(
    monkeypatch: pytest.MonkeyPatch, lb_address: str, extra: dict[str, object], label: str
) -> None:
    ok, message = _test(monkeypatch, lb_address, **extra)
    assert not ok
    assert message.startswith(f"field {label}: "), message
    assert "extra." not in message


# -- NATS security in the connection --------------------------------------------------------------


@pytest.fixture(scope="module")
def nats_with_password() -> Iterator[DevServer]:
    creds = NatsSecurity(user="airflow", password=SECRET)
    with DevServer(nats_security=NatsServerSecurity(user="airflow", password=SECRET, client=creds)) as server:
        yield server


def _conn_with_login(monkeypatch: pytest.MonkeyPatch, server: DevServer, password: str) -> str:
    conn = json.loads(liftbridge_conn_json(server.address, nats_url=server.nats_url))
    conn |= {"login": "airflow", "password": password}
    monkeypatch.setenv(conn_env_name("xWeHEyUD"), json.dumps(conn))
    return "xWeHEyUD"


def test_nats_user_and_password_come_from_the_form(
    monkeypatch: pytest.MonkeyPatch, nats_with_password: DevServer
) -> None:
    hook = LiftbridgeHook(_conn_with_login(monkeypatch, nats_with_password, SECRET))
    assert hook.settings.nats_security == NatsSecurity(user="airflow", password=SECRET)
    assert SECRET not in repr(hook.settings) and SECRET not in repr(hook.client)
    ok, message = hook.test_connection()
    assert ok, message
    assert f"NATS: {nats_with_password.nats_url} connected" in message
    hook.close()


def test_a_wrong_nats_password_fails_the_test(monkeypatch: pytest.MonkeyPatch, nats_with_password: DevServer) -> None:
    ok, message = LiftbridgeHook(_conn_with_login(monkeypatch, nats_with_password, "wrong")).test_connection()
    assert not ok
    assert "the NATS server refused the credentials" in message and "wrong" not in message


@pytest.mark.parametrize(
    ("conn", "label"),
    [
        ({"login": "u"}, "'NATS password'"),
        ({"login": "u", "password": "p", "extra": {"nats_token": "t"}}, "'NATS token'"),
        ({"extra": {"nats_tls_cert_file": __file__}}, "'NATS TLS client key file'"),
        ({"extra": {"nats_nkey_seed_file": "/no/such.nk"}}, "'NATS NKEY seed file'"),
    ],
)
def test_bad_nats_security_fields_are_named(
    monkeypatch: pytest.MonkeyPatch, conn: dict[str, object], label: str
) -> None:
    monkeypatch.setenv(conn_env_name("xWeHEyUD"), json.dumps({"conn_type": "liftbridge", "host": "h:1", **conn}))
    ok, message = LiftbridgeHook("xWeHEyUD").test_connection()
    assert not ok
    assert message.startswith(f"field {label}: "), message
