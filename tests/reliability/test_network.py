"""A slow or partitioned network, simulated by a TCP proxy on loopback between the client and the
dev server: timeouts fire as configured, and the errors say what happened."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    PublishError,
    RequestTimeoutError,
    UnavailableError,
)
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def proxy(lb_address: str) -> Iterator[TcpProxy]:
    p = TcpProxy(lb_address).start()
    try:
        yield p
    finally:
        p.stop()


def test_slow_network_within_the_timeout_works(proxy: TcpProxy, stream_name: str) -> None:
    with LiftbridgeClient(proxy.address, timeout=3.0) as client:
        client.create_stream(stream_name, stream_name)
        proxy.delay = 0.2
        started = time.monotonic()
        ack = client.publish(stream_name, b"slow")
        assert ack is not None and ack.offset == 0
        assert time.monotonic() - started >= 0.4  # there and back, each held 0.2 s


def test_slow_network_beyond_the_timeout_fails_in_time(proxy: TcpProxy, stream_name: str) -> None:
    with LiftbridgeClient(proxy.address, timeout=0.5, max_retries=0) as client:
        client.create_stream(stream_name, stream_name)
        proxy.delay = 1.5
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError, match=r"(?i)deadline|time") as info:
            client.fetch_partition_metadata(stream_name, 0)
        assert time.monotonic() - started < 1.5
        # Names the call, the cause and the timeout; gRPC's own client-side text is not passed off
        # as the server's words.
        assert "FetchMetadata" in str(info.value) and "did not finish within 0.5 s" in str(info.value)
        assert "server said" not in str(info.value)


def test_partitioned_network_publish_times_out_and_says_so(proxy: TcpProxy, stream_name: str) -> None:
    with LiftbridgeClient(proxy.address, timeout=1.0, max_retries=1, backoff_base=0.05) as client:
        client.create_stream(stream_name, stream_name)
        proxy.blackhole = True
        started = time.monotonic()
        with pytest.raises((RequestTimeoutError, UnavailableError)) as info:
            client.publish(stream_name, b"lost in the partition")
        took = time.monotonic() - started
        assert took < 4.0, took  # two attempts of 1 s plus backoff, not forever
        assert "time" in str(info.value).lower() or "unavailable" in str(info.value).lower()
        with pytest.raises(PublishError, match="no ack") as many:
            client.publish_many(stream_name, [b"a", b"b"], timeout=1.0)
        assert many.value.acked == 0
        proxy.blackhole = False  # the partition heals: the same client works again
        assert client.fetch_partition_metadata(stream_name, 0).newest_offset >= -1
