"""The client's NATS connection dropped after a failed batch, through a slow or cut link
(``tests/netfaults.py``; skipped where namespaces cannot be made): a flush that comes back proves
every publish handled, and one that does not ends in a reset, so the kernel keeps nothing to send
after the link heals. Before, the connection was closed: the kernel went on sending a closed
socket's data (``ss`` shows it in FIN-WAIT-1 with its Send-Q) until the link carried it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient, PublishError
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND
from airflow_provider_liftbridge.client.publishing.timeout_recovery import discard_nats
from airflow_provider_liftbridge.client.transport.nats import NatsLink, connect_nats
from airflow_provider_liftbridge.devserver.process import DevServerProcess
from airflow_provider_liftbridge.nats_adapter import flush
from tests.margins import until, wait_until
from tests.netfaults import Link, linked_devserver
from tests.reliability.test_exactly_once_links import unsent_to

__all__ = ["linked_devserver"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(180)

Served = tuple[Link, DevServerProcess]

#: What a busy machine may add to a bound (timers late, no core free).
SLACK = 8.0


def _port(server: DevServerProcess) -> int:
    return int(server.nats_url.rsplit(":", 1)[1])


def test_a_flush_through_a_slow_link_proves_every_publish_handled(linked_devserver: Served) -> None:
    link, server = linked_devserver

    async def scenario() -> tuple[bool, int, int]:
        watcher = await connect_nats(server.nats_url)
        holder = NatsLink([server.nats_url], connect_timeout=5.0, keepalive=(60.0, 60.0))
        try:
            sub = await watcher.subscribe("slow")
            await flush(watcher)
            nc = await holder.get()
            link.slow("16kbit", direction="in")  # 2 KB/s: the burst takes about 8 s
            for _ in range(16):
                await nc.publish("slow", b"x" * 1000)
            unsent = len(await until(lambda: unsent_to(link.inside, _port(server)), 10, "the burst in the kernel"))
            delivered = await holder.discard(flush_within=120.0)
            # Everything NATS handled before the PONG is queued to the watcher before its own PONG.
            await flush(watcher, timeout=60)
            return delivered, sub.delivered, unsent
        finally:
            link.heal()
            await holder.close()
            await watcher.close()

    delivered, received, unsent = asyncio.run(scenario())
    assert unsent, "the burst was not held up in the link: the test proves nothing"
    assert delivered is True
    assert received == 16


def _discard_during_a_cut(
    server: DevServerProcess, link: Link, holder: NatsLink, flush_within: float
) -> tuple[bool, float, list[str]]:
    """Cut the link, publish a burst that stays in the kernel, then discard the connection:
    whether the discard says it was delivered, how long it took, and what the kernel still holds."""

    async def scenario() -> tuple[bool, float, list[str]]:
        try:
            nc = await holder.get()
            link.cut()
            for _ in range(16):
                await nc.publish("cut", b"x" * 1000)
            await until(lambda: unsent_to(link.inside, _port(server)), 10, "the burst in the kernel")
            started = time.monotonic()
            delivered = await holder.discard(flush_within=flush_within)
            took = time.monotonic() - started
            return delivered, took, unsent_to(link.inside, _port(server))
        finally:
            link.heal()
            await holder.close()

    return asyncio.run(scenario())


def test_a_flush_that_does_not_come_back_ends_in_a_reset(linked_devserver: Served) -> None:
    link, server = linked_devserver
    holder = NatsLink([server.nats_url], connect_timeout=5.0)
    delivered, took, left = _discard_during_a_cut(server, link, holder, flush_within=1.0)
    assert delivered is False
    assert took < 1.0 + SLACK, f"the discard took {took:.1f} s; its flush was bounded by 1 s"
    assert not left, f"the kernel still holds data for NATS after the discard: {left}"


def test_a_flush_ends_when_nats_py_gives_the_connection_up(linked_devserver: Served) -> None:
    # nats-py's keepalive (1 s + 1 s here) finds the cut connection stale during the flush and
    # closes it itself: the flush ends then, not at its bound, and that close resets too (the
    # socket was set to reset before the flush), so nothing is left to go out on heal.
    link, server = linked_devserver
    holder = NatsLink([server.nats_url], connect_timeout=1.0, keepalive=(1.0, 1.0))
    delivered, took, left = _discard_during_a_cut(server, link, holder, flush_within=120.0)
    assert delivered is False
    assert took < 2.0 + SLACK, f"the flush waited {took:.1f} s; nats-py gave the connection up after about 2 s"
    assert not left, f"the kernel still holds data for NATS after the discard: {left}"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_batch_that_timed_out_leaves_nothing_to_send_later(linked_devserver: Served, kind: str) -> None:
    # Both clients' transports drop the connection through the same NatsLink.discard (the
    # DropNats effect of discard_nats, which BatchPublisher.reset runs): after an ack time-out,
    # nothing of the batch is left in the kernel to go out when the link heals.
    link, server = linked_devserver
    options = {"nats_servers": [server.nats_url], "timeout": 1.0, "max_retries": 0}
    with LiftbridgeClient(server.address) as admin:
        admin.create_stream("s", "s")
    records = [b"x" * 1000] * 16
    port = _port(server)

    def cut_once_held() -> None:
        # The batch is in the kernel, behind the slow link (its metadata call went through): cut.
        wait_until(lambda: unsent_to(link.inside, port, at_least=4000), 60, "the batch in the kernel")
        link.cut(direction="in")

    def publish_sync() -> bool:
        with LiftbridgeClient(server.address, **options) as client:
            publisher = client.batch_publisher("s", PublishOptions(path="nats", timeout=1.0, resend=NO_RESEND))
            publisher.send([b"open the connection"])
            link.slow("16kbit", direction="in")
            cutter.start()
            with pytest.raises(PublishError):
                publisher.send(records)
            return publisher.reset(flush_within=1.0)

    async def publish_async() -> bool:
        async with AsyncLiftbridgeClient(server.address, **options) as client:
            await client.publish_many("s", [b"open the connection"], path="nats")
            link.slow("16kbit", direction="in")
            cutter.start()
            with pytest.raises(PublishError):
                await client.publish_many("s", records, path="nats", timeout=1.0)
            delivered: bool = await client._transport.run(discard_nats(flush_within=1.0))
            return delivered

    cutter = threading.Thread(target=cut_once_held, daemon=True)
    try:
        delivered = publish_sync() if kind == "sync" else asyncio.run(publish_async())
        left = unsent_to(link.inside, port)
    finally:
        cutter.join(60)
        link.heal()
    assert delivered is False  # the flush could not come back through the cut
    assert not left, f"the kernel still holds data for NATS after the discard: {left}"
