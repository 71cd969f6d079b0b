"""An offset wait on a paused partition (issue 27, point 9): it waits without resuming the
partition, and finishes once the target is committed, whether before the pause or after a
publish resumed it. Against the dev server, poking and in the triggerer's wait."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient, PartitionPausedError
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor
from airflow_provider_liftbridge.triggers.base import wait_for_offset

pytestmark = pytest.mark.usefixtures("liftbridge_conn")


def paused_with(client: LiftbridgeClient, stream: str, n: int) -> None:
    client.create_stream(stream, stream)
    client.publish_many(stream, [b"m"] * n)
    client.pause_stream(stream)


def still_paused(client: LiftbridgeClient, stream: str) -> bool:
    """The leader refuses FetchPartitionMetadata only while the partition really is paused."""
    try:
        client.fetch_partition_metadata(stream, 0)
    except PartitionPausedError:
        return True
    return False


def poke(stream: str, target: int) -> bool:
    sensor = LiftbridgeOffsetSensor(task_id="o", stream=stream, target_offset=target)
    sensor.prepare({})
    try:
        return bool(sensor.poke({}).is_done)
    finally:
        sensor.hook.close()


def test_poking_a_paused_partition_waits_without_resuming_it(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    paused_with(liftbridge_client, stream_name, 3)  # offsets 0-2 committed
    assert poke(stream_name, 2) is True  # reached before the pause: done, nothing to resume
    assert poke(stream_name, 4) is False  # not yet: the sensor waits, it does not fail
    assert still_paused(liftbridge_client, stream_name)
    liftbridge_client.publish_many(stream_name, [b"m"] * 2)  # a publish resumes it: offsets 3-4
    assert poke(stream_name, 4) is True


def test_the_triggers_wait_on_a_paused_partition_does_not_resume_it(
    stream_name: str, liftbridge_client: LiftbridgeClient, lb_address: str
) -> None:
    paused_with(liftbridge_client, stream_name, 3)

    async def wait_then_publish() -> tuple[int, bool, int]:
        async with AsyncLiftbridgeClient(lb_address) as client:
            reached = await wait_for_offset(client, stream_name, 0, 2, paused_poll=0.05)
            waiting = asyncio.ensure_future(wait_for_offset(client, stream_name, 0, 4, paused_poll=0.05))
            await asyncio.sleep(0.3)  # a few polls: it must neither finish nor resume the partition
            paused_meanwhile = not waiting.done() and await asyncio.to_thread(
                still_paused, liftbridge_client, stream_name
            )
            await asyncio.to_thread(liftbridge_client.publish_many, stream_name, [b"m"] * 2)
            return reached, paused_meanwhile, await asyncio.wait_for(waiting, 30)

    reached, paused_meanwhile, offset = asyncio.run(wait_then_publish())
    assert reached == 2 and paused_meanwhile and offset >= 4
