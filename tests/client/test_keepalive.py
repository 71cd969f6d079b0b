"""Keepalive settings, and keepalive PINGs on a subscription that receives nothing, against a
server that limits PINGs as Liftbridge does (the dev server's ``aio`` transport is a grpc-core
server with its default policy: one PING per 5 minutes on a connection it writes nothing to, GOAWAY
``too_many_pings`` after two strikes). The silent links themselves are in
``tests/reliability/test_silent_links.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import ConnectionSettings, InvalidArgumentError
from airflow_provider_liftbridge.client.transport.heartbeat import HEARTBEAT
from airflow_provider_liftbridge.devserver import DevServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def strict_server() -> Iterator[DevServer]:
    with DevServer(grpc_transport="aio") as server:
        yield server


def test_an_idle_subscription_outlives_a_server_that_limits_pings(make_client: Any, strict_server: DevServer) -> None:
    # PINGs every 0.5 s: without the heartbeat's calls the server closes the connection after the
    # fourth one (measured: within 3 s), and the subscription, allowed no resubscription, fails.
    client = make_client(
        strict_server.address, keepalive_time=0.5, keepalive_timeout=5.0, resubscribe_wait=0, max_retries=0
    )
    client.create_stream("s", "s")
    client.publish("s", b"before")
    messages = iter(client.subscribe("s"))
    assert next(messages).value == b"before"
    time.sleep(8.0)  # the condition itself: sixteen PING intervals with nothing to receive
    client.publish("s", b"after")
    assert next(messages).value == b"after"


def test_keepalive_settings_are_checked() -> None:
    assert ConnectionSettings("h:1").keepalive == (10.0, 10.0)
    assert ConnectionSettings("h:1", keepalive_time=2, keepalive_timeout=3.5).keepalive == (2.0, 3.5)
    for bad in (0, -1.0, "10", True):
        with pytest.raises(InvalidArgumentError, match="keepalive_time must be a positive number"):
            ConnectionSettings("h:1", keepalive_time=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="keepalive_timeout must be a positive number"):
            ConnectionSettings("h:1", keepalive_timeout=bad)  # type: ignore[arg-type]


def test_closed_clients_leave_no_channel_watched(make_client: Any, strict_server: DevServer) -> None:
    before = HEARTBEAT.watched()
    client = make_client(strict_server.address)
    client.create_stream("w", "w")
    client.publish("w", b"x")
    messages = iter(client.subscribe("w"))
    assert next(messages).value == b"x"
    assert HEARTBEAT.watched() > before
    messages.close()  # type: ignore[attr-defined]  # a generator: end the subscription first
    getattr(client, "shutdown", client.close)()
    assert HEARTBEAT.watched() == before
