"""The bulk engine while the broker stalls: re-sends after lost acks, the no-re-send policy, and
the window bounding what is in flight.

The broker is a real dev server in its own process; ``SIGSTOP`` freezes it (its nats-server
child keeps running and queues what arrives), ``SIGCONT`` lets it go on. The publisher is
``NatsPublisher.publish_many`` — the same engine as ``LiftbridgeClient.publish_many`` over NATS,
without the client's metadata call, which a frozen broker could not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator

import nats
import pytest

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge.client import NO_RESEND, AckTimeoutError, LiftbridgeClient, PublishError, ResendUnacked
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.devserver import DevServerProcess
from tests import margins


@pytest.fixture(scope="module")
def server() -> Iterator[DevServerProcess]:
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data_dir=data) as srv:
        yield srv


@pytest.fixture
def stream(server: DevServerProcess) -> str:
    name = f"pause-{uuid.uuid4().hex[:10]}"
    with LiftbridgeClient(server.address) as client:
        client.create_stream(name, name)
    return name


@contextlib.contextmanager
def frozen(server: DevServerProcess) -> Iterator[None]:
    """The broker process stopped (SIGSTOP) for the duration; always continued afterwards."""
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def stored(server: DevServerProcess, stream: str, expect_at_least: int) -> list[bytes]:
    """Every stored value, once the broker has caught up with at least ``expect_at_least``."""
    with LiftbridgeClient(server.address) as client:
        margins.wait_until(
            lambda: client.fetch_partition_metadata(stream).high_watermark + 1 >= expect_at_least,
            10,
            "the broker caught up",
            interval=0.05,
        )
        time.sleep(0.3)  # anything still queued lands too
        hw = client.fetch_partition_metadata(stream).high_watermark
        return [m.value for m in client.subscribe(stream, stop_at=hw)]


async def test_lost_acks_are_resent_until_acknowledged(server: DevServerProcess, stream: str) -> None:
    values = [b"r%d" % i for i in range(5)]
    async with await NatsPublisher.connect(server.nats_url) as pub:
        with frozen(server):
            task = asyncio.ensure_future(
                pub.publish_many(stream, values, PublishOptions(timeout=0.3, resend=ResendUnacked(max_resends=50)))
            )
            await asyncio.sleep(1.2)  # about four ack timeouts: every record goes out again and again
            assert not task.done()
        acks = await asyncio.wait_for(task, 20)
    assert sorted(a.correlation_id for a in acks) == sorted({a.correlation_id for a in acks})
    assert len(acks) == 5
    # At-least-once: the broker stored the first copies and the re-sent ones.
    values_stored = stored(server, stream, 10)
    assert set(values_stored) == set(values)
    assert len(values_stored) >= 10


@pytest.mark.parametrize("explicit", [True, False], ids=["NO_RESEND", "default"])
async def test_no_resend_policy_fails_and_sends_once(server: DevServerProcess, stream: str, explicit: bool) -> None:
    # NatsPublisher never re-sends unless asked (exactly-once publishing relies on it).
    values = [b"o%d" % i for i in range(3)]
    options = PublishOptions(timeout=0.3, resend=NO_RESEND if explicit else None)
    async with await NatsPublisher.connect(server.nats_url) as pub:
        with frozen(server):
            with pytest.raises(PublishError) as caught:
                await pub.publish_many(stream, values, options)
    err = caught.value
    assert err.index == 0 and err.acked == 0
    assert set(err.errors) == {0, 1, 2}
    assert all(isinstance(e, AckTimeoutError) for e in err.errors.values())
    assert stored(server, stream, 3) == values  # each exactly once: nothing was re-sent


async def test_window_bounds_what_is_in_flight(server: DevServerProcess, stream: str) -> None:
    seen: list[bytes] = []
    spy = await nats_adapter.connect(server.nats_url)

    async def count(msg: nats.aio.msg.Msg) -> None:
        seen.append(msg.data)

    await spy.subscribe(stream, cb=count)
    await nats_adapter.flush(spy)  # nc.flush() can overtake the SUB
    try:
        async with await NatsPublisher.connect(server.nats_url) as pub:
            with frozen(server):
                task = asyncio.ensure_future(
                    pub.publish_many(stream, [b"w%d" % i for i in range(50)], PublishOptions(window=8))
                )
                await asyncio.sleep(0.8)
                assert len(seen) == 8  # no acks: the ninth record waits for room
            acks = await asyncio.wait_for(task, 20)
    finally:
        await spy.close()
    assert [a.offset for a in acks] == list(range(50))
    assert len(seen) == 50


def test_grpc_path_times_out_on_a_stalled_broker(server: DevServerProcess, stream: str) -> None:
    # The blocking client's timed reads on PublishAsync: a watchdog ends a read past its deadline.
    with LiftbridgeClient(server.address, timeout=10) as client:
        client.fetch_metadata()  # connected before the broker freezes
        with frozen(server):
            started = time.monotonic()
            with pytest.raises(PublishError) as caught:
                client.publish_many(stream, [b"g1", b"g2"], path="grpc", timeout=0.5)
            elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < 3
    assert caught.value.index == 0 and isinstance(caught.value.errors[0], AckTimeoutError)
    for watchdog in [t for t in threading.enumerate() if t.name == "liftbridge-stream-watchdog"]:
        watchdog.join(1)
        assert not watchdog.is_alive()
