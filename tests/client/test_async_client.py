"""What only the asyncio client has: native ``async for``, and channels shared process-wide."""

from __future__ import annotations

import asyncio

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, StopPosition
from airflow_provider_liftbridge.client.channels import ASYNC_REGISTRY


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


async def test_async_for_and_concurrent_subscriptions(lb_address: str, stream_name: str) -> None:
    async with AsyncLiftbridgeClient(lb_address, subscription_channels=2) as c:
        await c.create_stream(stream_name, stream_name, partitions=2)
        await c.publish_many(stream_name, [b"%d" % i for i in range(10)], partition=1)

        async def read() -> list[int]:
            return [m.offset async for m in c.subscribe(stream_name, partition=1, stop_at=StopPosition.LATEST)]

        results = await asyncio.gather(*(read() for _ in range(40)))
        assert all(r == list(range(10)) for r in results)
        # 40 subscriptions spread over the pool: 1 unary + 2 subscription channels
        assert len(c._transport._held) == 3


async def test_breaking_out_of_a_subscription_releases_it(lb_address: str, stream_name: str) -> None:
    async with AsyncLiftbridgeClient(lb_address) as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish_many(stream_name, [b"a", b"b", b"c"])
        sub = c.subscribe(stream_name)
        async for m in sub:
            if m.offset == 1:
                break
        await sub.aclose()  # type: ignore[attr-defined]
        newest = (await c.fetch_partition_metadata(stream_name)).newest_offset
        assert newest == 2


async def test_zero_subscription_channels_keeps_one_channel_per_broker(lb_address: str, stream_name: str) -> None:
    before = ASYNC_REGISTRY.open_channels()
    async with AsyncLiftbridgeClient(lb_address, subscription_channels=0) as c:
        await c.create_stream(stream_name, stream_name)
        await c.publish(stream_name, b"x")
        subs = [c.subscribe(stream_name) for _ in range(5)]
        got = [await anext(s) for s in subs]
        assert [m.value for m in got] == [b"x"] * 5
        assert ASYNC_REGISTRY.open_channels() == before + 1
        for s in subs:
            await s.aclose()
