"""A silent link (packets dropped, nothing reset, both ends up) between the client and a dev server
in a network namespace of its own (``tests/netfaults.py``): every long-lived path notices it
within its bound, ``keepalive_time + keepalive_timeout`` of the client's settings.

With the keepalive of before (30 s + 10 s, gRPC's limit of two PINGs without data sent, nats-py's
2-minute PINGs) a subscription noticed after about 40 s, or never once it had been idle for two
PINGs, and a NATS connection after 4 to 6 minutes. Skipped where namespaces cannot be made.

One test per path (a subscription, a NATS connection) shows the defaults notice within their
bound; the others (one-way cuts, an idle subscription, the asyncio readers) give the client a
shorter keepalive (``TUNED``) and are held to its bound, which also shows the settings are used.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient, UnavailableError
from airflow_provider_liftbridge.client.settings import KEEPALIVE_TIME, KEEPALIVE_TIMEOUT
from airflow_provider_liftbridge.client.transport.nats import connect_nats
from airflow_provider_liftbridge.devserver.process import DevServerProcess
from tests.margins import until
from tests.netfaults import Direction, Link, linked_devserver

__all__ = ["linked_devserver"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(180)

#: The bound: the last PING answered before the cut, the next one sent at most ``KEEPALIVE_TIME``
#: later, unanswered for ``KEEPALIVE_TIMEOUT``.
BOUND = KEEPALIVE_TIME + KEEPALIVE_TIMEOUT
#: What a busy machine may add to it (timers fire late, the process waits for a core). The old
#: defaults took about 40 s, past BOUND + SLACK.
SLACK = 8.0
#: How long a test waits for the notice before it gives up: well past the bound, so that the wait
#: itself never decides (the bound is asserted on the time measured).
GIVE_UP = 3 * BOUND
#: A shorter keepalive for the tests of a case rather than of the defaults (not so short that a
#: busy machine misses a PING answer: the dev server answers at once, the client allows 2 s).
TUNED = {"keepalive_time": 1.0, "keepalive_timeout": 2.0}
TUNED_BOUND = TUNED["keepalive_time"] + TUNED["keepalive_timeout"]

Served = tuple[Link, DevServerProcess]


def _stream(server: DevServerProcess) -> str:
    with LiftbridgeClient(server.address) as client:
        client.create_stream("s", "s")
        client.publish("s", b"before the cut")
    return "s"


def _sync_notice(
    link: Link, server: DevServerProcess, idle: float, direction: Direction = "both", **keepalive: float
) -> tuple[float, BaseException]:
    """Subscribe with no resubscription (and ``keepalive``, the client's keepalive settings, if
    given), read the first message, wait ``idle`` seconds, cut the link in ``direction``; how long
    after the cut the subscription raised, and what."""
    stream = _stream(server)
    with LiftbridgeClient(server.address, resubscribe_wait=0, max_retries=0, **keepalive) as client:
        messages = client.subscribe(stream)
        assert next(messages).value == b"before the cut"
        if idle:
            time.sleep(idle)  # the condition itself: a subscription that received nothing this long
        link.cut(direction)
        cut_at = time.monotonic()
        with pytest.raises(UnavailableError) as info:
            next(messages)
        return time.monotonic() - cut_at, info.value


def test_a_subscription_notices_a_silent_leader(linked_devserver: Served) -> None:
    took, error = _sync_notice(*linked_devserver, idle=0.0)
    assert took < BOUND + SLACK, f"noticed {took:.1f} s after the cut; bound {BOUND:g} s"
    assert "could not be re-established" in str(error) and "last offset delivered: 0" in str(error)


@pytest.mark.parametrize("direction", ["in", "out"])
def test_a_subscription_notices_a_link_cut_one_way(linked_devserver: Served, direction: Direction) -> None:
    # Only the client's packets dropped (its PINGs never arrive), or only the server's (the PINGs
    # arrive, their answers do not): the same keepalive notices, within the same bound.
    took, _ = _sync_notice(*linked_devserver, idle=0.0, direction=direction, **TUNED)
    assert took < TUNED_BOUND + SLACK, f"noticed {took:.1f} s after the cut ({direction}); bound {TUNED_BOUND:g} s"


def test_a_subscription_idle_for_many_pings_still_notices(linked_devserver: Served) -> None:
    # gRPC sends two PINGs without sending data, then none (grpc.http2.max_pings_without_data):
    # a subscription idle longer than that had no keepalive left.
    took, _ = _sync_notice(*linked_devserver, idle=3.5 * TUNED["keepalive_time"], **TUNED)
    assert took < TUNED_BOUND + SLACK, f"noticed {took:.1f} s after the cut; bound {TUNED_BOUND:g} s"


@pytest.mark.parametrize("reader", ["thread", "aio"])
def test_an_asyncio_subscription_notices_a_silent_leader(linked_devserver: Served, reader: str) -> None:
    # The triggers' subscriptions: the asyncio client, on its reader thread or in the event loop.
    link, server = linked_devserver
    stream = _stream(server)

    async def scenario() -> float:
        async with AsyncLiftbridgeClient(
            server.address, resubscribe_wait=0, max_retries=0, subscription_reader=reader, **TUNED
        ) as client:
            messages = aiter(client.subscribe(stream))
            assert (await anext(messages)).value == b"before the cut"
            link.cut()
            cut_at = time.monotonic()
            with pytest.raises(UnavailableError):
                await asyncio.wait_for(anext(messages), GIVE_UP)
            return time.monotonic() - cut_at

    took = asyncio.run(scenario())
    assert took < TUNED_BOUND + SLACK, f"noticed {took:.1f} s after the cut; bound {TUNED_BOUND:g} s"


def test_a_nats_connection_notices_a_silent_server(linked_devserver: Served) -> None:
    # The connection bulk publishing and the ack inbox use (NatsLink), with the client's keepalive.
    link, server = linked_devserver

    async def scenario() -> float:
        nc = await connect_nats(server.nats_url)
        try:
            await nc.flush(timeout=5)
            link.cut()
            cut_at = time.monotonic()
            await until(lambda: not nc.is_connected, GIVE_UP, "the NATS connection to count as lost")
            return time.monotonic() - cut_at
        finally:
            link.heal()
            await nc.close()

    took = asyncio.run(scenario())
    assert took < BOUND + SLACK, f"noticed {took:.1f} s after the cut; bound {BOUND:g} s"


def test_the_link_heals(linked_devserver: Served) -> None:
    # The fixture's own contract: a cut link stops everything, a healed one carries it again.
    link, server = linked_devserver
    stream = _stream(server)
    link.cut()
    failed = threading.Event()

    def publish() -> None:
        try:
            with LiftbridgeClient(server.address, timeout=1.0, max_retries=0) as client:
                client.publish(stream, b"cut")
        except Exception:
            failed.set()

    worker = threading.Thread(target=publish)
    worker.start()
    worker.join(30)
    assert failed.is_set()
    link.heal()
    with LiftbridgeClient(server.address) as client:
        assert client.publish(stream, b"healed").offset == 1
