"""A connection attempt gets ``keepalive_timeout`` to finish its handshake. gRPC core reads
``grpc.min_reconnect_backoff_ms`` as the least time an attempt has to receive the server's SETTINGS
frame; the client once set it to 100 ms, and every first call to a broker slower than that to
answer (a busy machine, a long route, a TLS handshake) failed at once with UNAVAILABLE: seen in
the busy test run of session 24, a subscription's first call and a Spark task's PublishAsync."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def slow_handshake(lb_address: str) -> Iterator[str]:
    """The address of a proxy to the test broker that holds every chunk 0.3 s each way, the
    handshake's too."""
    proxy = TcpProxy(lb_address)
    proxy.delay = 0.3
    proxy.start()
    try:
        yield proxy.address
    finally:
        proxy.stop()


def test_a_broker_slow_to_answer_the_handshake_is_reached_on_the_first_try(slow_handshake: str) -> None:
    # No retry allowed: the one connection attempt must wait for the SETTINGS frame. Before, with
    # min_reconnect_backoff_ms 100, this raised UnavailableError ("connection attempt timed out
    # before receiving SETTINGS frame") after about 0.1 s.
    with LiftbridgeClient(slow_handshake, timeout=5.0, max_retries=0) as client:
        assert client.fetch_metadata().brokers
