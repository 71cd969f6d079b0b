"""A connection attempt gets ``keepalive_timeout`` to finish its handshake. gRPC core reads
``grpc.min_reconnect_backoff_ms`` as the least time an attempt has to receive the server's SETTINGS
frame; the client once set it to 100 ms, and every first call to a broker slower than that to
answer (a busy machine, a long route, a TLS handshake) failed at once with UNAVAILABLE: seen in
the busy test run of session 24, a subscription's first call and a Spark task's PublishAsync."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient

pytestmark = pytest.mark.timeout(120)

#: How long the proxy holds the server's first bytes (its SETTINGS frame) on each connection.
HANDSHAKE_DELAY = 0.5


def _serve_delayed(upstream: str, ready: list[str], loop: asyncio.AbstractEventLoop) -> None:
    """A TCP proxy to ``upstream`` that holds the server's first bytes of each connection for
    :data:`HANDSHAKE_DELAY` s; puts its address in ``ready``, then serves until ``loop`` stops."""
    host, port = upstream.rsplit(":", 1)

    async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
        try:
            while data := await reader.read(65536):
                if delay:
                    await asyncio.sleep(delay)
                    delay = 0.0
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(
            pump(client_reader, server_writer, 0.0),
            pump(server_reader, client_writer, HANDSHAKE_DELAY),
            return_exceptions=True,
        )

    async def start() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        ready.append(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")

    asyncio.set_event_loop(loop)
    loop.run_until_complete(start())
    loop.run_forever()


@pytest.fixture
def slow_handshake(lb_address: str) -> Iterator[str]:
    """The address of a proxy to the test broker whose handshake answer comes late."""
    ready: list[str] = []
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=_serve_delayed, args=(lb_address, ready, loop), daemon=True)
    thread.start()
    while not ready and thread.is_alive():
        threading.Event().wait(0.01)
    yield ready[0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_a_broker_slow_to_answer_the_handshake_is_reached_on_the_first_try(slow_handshake: str) -> None:
    # No retry allowed: the one connection attempt must wait for the SETTINGS frame. Before, with
    # min_reconnect_backoff_ms 100, this raised UnavailableError ("connection attempt timed out
    # before receiving SETTINGS frame") after about 0.1 s.
    with LiftbridgeClient(slow_handshake, timeout=5.0, max_retries=0) as client:
        assert client.fetch_metadata().brokers
