"""Keepalive settings, and keepalive PINGs on a subscription that receives nothing, against a
server that limits PINGs as Liftbridge does: one PING per 5 minutes on a connection it writes
nothing to, GOAWAY ``too_many_pings`` after two strikes (grpc-go's default enforcement). Both of the
dev server's transports do: ``aio`` is a grpc-core server with its default policy, ``h2`` models
grpc-go's (``grpc_h2._Connection._ping``). The silent links themselves are in
``tests/reliability/test_silent_links.py``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc
from airflow_provider_liftbridge.client import ConnectionSettings, InvalidArgumentError
from airflow_provider_liftbridge.client.transport.heartbeat import HEARTBEAT
from airflow_provider_liftbridge.devserver import DevServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["h2", "aio"])
def strict_server(request: pytest.FixtureRequest) -> Iterator[DevServer]:
    with DevServer(grpc_transport=request.param) as server:
        yield server


def test_a_client_that_pings_an_idle_call_without_the_heartbeat_gets_goaway(strict_server: DevServer) -> None:
    # A bare channel with the client's PING options but none of its heartbeat calls: the server writes
    # nothing after the subscription's first (empty) message, so the fourth PING, within about 2 s,
    # is the third strike. Before the h2 transport enforced the policy, the call only ended at its
    # deadline (DEADLINE_EXCEEDED), a minute later.
    options = [
        ("grpc.keepalive_time_ms", 500),
        ("grpc.keepalive_timeout_ms", 5000),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    with grpc.insecure_channel(strict_server.address, options=options) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(api_pb2.CreateStreamRequest(subject="g", name="g"), timeout=10)
        request = api_pb2.SubscribeRequest(stream="g", startPosition=api_pb2.EARLIEST)
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Subscribe(request, timeout=60):
                pass
    error = info.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error  # type: ignore[attr-defined]
    # grpc-core's client names the GOAWAY's debug data; grpc-core's server words it on its own.
    assert "too many pings" in error.details().replace("_", " ").lower(), error  # type: ignore[attr-defined]


def test_an_idle_subscription_outlives_a_server_that_limits_pings(make_client: Any, strict_server: DevServer) -> None:
    # PINGs every 0.5 s: without the heartbeat's calls the server closes the connection after the
    # fourth one (measured: within 3 s; the test above), and the subscription, allowed no
    # resubscription, fails.
    client = make_client(
        strict_server.address, keepalive_time=0.5, keepalive_timeout=5.0, resubscribe_wait=0, max_retries=0
    )
    client.create_stream("s", "s")
    client.publish("s", b"before")
    messages = iter(client.subscribe("s"))
    assert next(messages).value == b"before"
    time.sleep(5.0)  # the condition itself: ten PING intervals with nothing to receive
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
