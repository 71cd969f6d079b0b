"""A slow or partitioned network, simulated by a TCP proxy on loopback between the client and the
dev server: timeouts fire as configured, and the errors say what happened."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    PublishError,
    RequestTimeoutError,
    UnavailableError,
)

pytestmark = pytest.mark.timeout(60)


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; ``delay`` holds every chunk back that long,
    ``blackhole`` stops forwarding (connections stay open: a partition, not a refusal)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.delay = 0.0
        self.blackhole = False
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()
        server.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                while self.blackhole:
                    await asyncio.sleep(0.05)
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def start(self) -> TcpProxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


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
