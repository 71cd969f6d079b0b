"""What only the asyncio client has: native ``async for``, channels shared process-wide, and the
two subscription readers (a worker thread per subscription by default, grpc.aio on request)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from airflow_provider_liftbridge.client import (
    AsyncLiftbridgeClient,
    ClientClosedError,
    InvalidArgumentError,
    LiftbridgeClient,
    StopPosition,
)
from airflow_provider_liftbridge.client.transport import aio as async_client_module
from airflow_provider_liftbridge.client.transport.channels import ASYNC_REGISTRY, SYNC_REGISTRY
from tests import margins

READERS = ["thread", "aio"]


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "liftbridge-subscribe-reader"]


async def no_reader_threads_within(seconds: float) -> bool:
    try:
        await margins.until(lambda: not reader_threads(), seconds, "no reader threads", where=margins.caller())
    except AssertionError:
        return False
    return True


async def test_many_clients_share_one_channel_per_broker(lb_address: str, stream_name: str) -> None:
    before = ASYNC_REGISTRY.open_channels()
    clients = [AsyncLiftbridgeClient(lb_address) for _ in range(50)]
    await clients[0].create_stream(stream_name, stream_name)
    await asyncio.gather(*(c.fetch_metadata() for c in clients))
    assert ASYNC_REGISTRY.open_channels() == before + 1  # one unary channel for fifty clients
    for c in clients[:49]:
        await c.close()
    assert ASYNC_REGISTRY.open_channels() == before + 1  # still held by the last client
    await clients[49].close()
    await clients[49].close()  # idempotent
    assert ASYNC_REGISTRY.open_channels() == before


@pytest.mark.parametrize("reader", READERS)
async def test_async_for_and_concurrent_subscriptions(lb_address: str, stream_name: str, reader: Any) -> None:
    async with AsyncLiftbridgeClient(lb_address, subscription_channels=2, subscription_reader=reader) as c:
        await c.create_stream(stream_name, stream_name, partitions=2)
        await c.publish_many(stream_name, [b"%d" % i for i in range(10)], partition=1)

        async def read() -> list[int]:
            return [m.offset async for m in c.subscribe(stream_name, partition=1, stop_at=StopPosition.LATEST)]

        results = await asyncio.gather(*(read() for _ in range(40)))
        assert all(r == list(range(10)) for r in results)
        # 40 subscriptions spread over the pool of 2 subscription channels, beside the unary one:
        # blocking channels for reader threads, grpc.aio ones otherwise.
        transport = c._transport
        assert (len(transport._held), len(transport._held_sync)) == ((1, 2) if reader == "thread" else (3, 0))
    assert await no_reader_threads_within(5)


@pytest.mark.parametrize("reader", READERS)
async def test_breaking_out_of_a_subscription_releases_it(lb_address: str, stream_name: str, reader: Any) -> None:
    async with AsyncLiftbridgeClient(lb_address, subscription_reader=reader) as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish_many(stream_name, [b"a", b"b", b"c"])
        sub = c.subscribe(stream_name)
        async for m in sub:
            if m.offset == 1:
                break
        await sub.aclose()  # type: ignore[attr-defined]
        assert await no_reader_threads_within(5)
        newest = (await c.fetch_partition_metadata(stream_name)).newest_offset
        assert newest == 2
        assert not c._transport._streams


async def test_zero_subscription_channels_keeps_one_channel_per_broker(lb_address: str, stream_name: str) -> None:
    before = ASYNC_REGISTRY.open_channels()
    async with AsyncLiftbridgeClient(lb_address, subscription_channels=0, subscription_reader="aio") as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish(stream_name, b"x")
        subs = [c.subscribe(stream_name) for _ in range(5)]
        got = [await anext(s) for s in subs]
        assert [m.value for m in got] == [b"x"] * 5
        assert ASYNC_REGISTRY.open_channels() == before + 1
        assert not reader_threads()  # the aio reader starts no thread
        for s in subs:
            await s.aclose()


async def test_the_thread_reader_is_the_default_and_an_unknown_reader_is_refused(
    lb_address: str, stream_name: str
) -> None:
    with pytest.raises(InvalidArgumentError, match="subscription_reader must be 'thread' or 'aio'"):
        AsyncLiftbridgeClient(lb_address, subscription_reader="fast")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="subscription_reader"):
        LiftbridgeClient(lb_address, subscription_reader="")  # type: ignore[arg-type]
    before = SYNC_REGISTRY.open_channels()
    async with AsyncLiftbridgeClient(lb_address) as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish(stream_name, b"x")
        sub = c.subscribe(stream_name)
        assert (await anext(sub)).value == b"x"
        assert len(reader_threads()) == 1
        assert SYNC_REGISTRY.open_channels() == before + 1
        await sub.aclose()  # type: ignore[attr-defined]
    assert SYNC_REGISTRY.open_channels() == before  # released with the client
    assert await no_reader_threads_within(5)


@pytest.mark.parametrize("reader", READERS)
async def test_closing_the_client_ends_a_waiting_subscription_with_a_typed_error(
    lb_address: str, stream_name: str, reader: Any
) -> None:
    # Channels are shared process-wide: a second client keeps them open, so close() must end
    # this client's subscriptions itself (and say so with a LiftbridgeError, not CancelledError).
    other = AsyncLiftbridgeClient(lb_address, subscription_reader=reader)
    c = AsyncLiftbridgeClient(lb_address, subscription_reader=reader)
    try:
        await c.create_stream(stream_name, stream_name)
        await c.publish(stream_name, b"x")
        await other.fetch_metadata()
        sub = c.subscribe(stream_name)
        assert (await anext(sub)).offset == 0
        waiting = asyncio.ensure_future(anext(sub))  # offset 1 never comes
        await asyncio.sleep(0.2)
        started = time.monotonic()
        await c.close()
        with pytest.raises(ClientClosedError, match="closed"):
            await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 2
        assert await no_reader_threads_within(5)
        assert (await other.fetch_metadata()).streams[stream_name].name == stream_name  # other is unaffected
    finally:
        await c.close()
        await other.close()


@pytest.mark.parametrize("reader", READERS)
async def test_cancelling_the_consumer_task_raises_cancelled_error_and_ends_the_reader(
    lb_address: str, stream_name: str, reader: Any
) -> None:
    async with AsyncLiftbridgeClient(lb_address, subscription_reader=reader) as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish(stream_name, b"x")
        got: list[int] = []

        async def consume() -> None:
            async for m in c.subscribe(stream_name):
                got.append(m.offset)

        task = asyncio.ensure_future(consume())
        while not got:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert got == [0]
        assert await no_reader_threads_within(2)
        assert not c._transport._streams
        # The client is still usable: only the subscription ended.
        assert [m.offset async for m in c.subscribe(stream_name, stop_at=0)] == [0]


async def test_a_slow_consumer_keeps_the_buffer_bounded(
    lb_address: str, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lower the bound so a few thousand messages are a "large backlog" for this test.
    monkeypatch.setattr(async_client_module, "BUFFER_HIGH", 64)
    monkeypatch.setattr(async_client_module, "BUFFER_LOW", 32)
    n = 3000
    with LiftbridgeClient(lb_address) as pub:
        pub.create_stream(stream_name, stream_name)
        pub.publish_many(stream_name, [b"v%d" % i for i in range(n)], window=512)
    async with AsyncLiftbridgeClient(lb_address) as c:
        sub = c.subscribe(stream_name, stop_at=n - 1)
        assert (await anext(sub)).offset == 0
        [stream] = c._transport._streams
        await asyncio.sleep(0.5)  # the reader fills the buffer, then waits for room
        assert stream.paused and 32 < len(stream.buffer) <= 64  # full, and the reader waits
        offsets: list[int] = []
        highest = 0
        async for m in sub:
            offsets.append(m.offset)
            highest = max(highest, len(stream.buffer))
            if m.offset % 500 == 0:
                await asyncio.sleep(0.05)  # slow now and then: the reader must wait, not grow
        assert offsets == list(range(1, n))  # in order, none lost while the reader waited
        assert highest <= 64
    assert await no_reader_threads_within(5)


async def test_subscriptions_beyond_the_reader_thread_limit_use_grpc_aio(
    lb_address: str, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(async_client_module, "MAX_READER_THREADS", async_client_module._READERS.running + 2)
    async with AsyncLiftbridgeClient(lb_address) as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish(stream_name, b"x")
        subs = [c.subscribe(stream_name) for _ in range(5)]
        got = [await anext(s) for s in subs]
        assert [m.value for m in got] == [b"x"] * 5  # every one delivers, whichever its reader
        assert len(reader_threads()) == 2
        kinds = sorted(type(s).__name__ for s in c._transport._streams)
        assert kinds == ["_AsyncStream"] * 3 + ["_ThreadedStream"] * 2
        for s in subs:
            await s.aclose()  # type: ignore[attr-defined]
    assert await no_reader_threads_within(5)
    assert async_client_module._READERS.running == 0
