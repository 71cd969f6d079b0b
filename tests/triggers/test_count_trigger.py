"""LiftbridgeCountTrigger: the exact serialize() tuple (partition keys as text, as JSON gives them
back), and run() driven to its one event against the dev server: messages on any of the
partitions count towards the total, each from its own start offset."""

from __future__ import annotations

import asyncio

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.offset import LiftbridgeCountTrigger

from .test_triggers import first_event


def test_count_trigger_serializes_exactly() -> None:
    trigger = LiftbridgeCountTrigger(stream="s", starts={2: 7, 0: 3}, count=4, liftbridge_conn_id="lb")
    assert trigger.serialize() == (
        "airflow_provider_liftbridge.triggers.offset.LiftbridgeCountTrigger",
        {"stream": "s", "starts": {"0": 3, "2": 7}, "count": 4, "liftbridge_conn_id": "lb"},
    )
    classpath, kwargs = trigger.serialize()
    assert LiftbridgeCountTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(LiftbridgeArgumentError, match="starts"):
        LiftbridgeCountTrigger(stream="s", starts={}, count=1)
    with pytest.raises(LiftbridgeArgumentError, match="count"):
        LiftbridgeCountTrigger(stream="s", starts={0: 0}, count=0)


@pytest.mark.usefixtures("liftbridge_conn")
async def test_it_fires_once_the_partitions_together_have_the_count(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=3)
    liftbridge_client.publish_many(stream_name, [b"old-0", b"old-1"], partition=1)  # before partition 1's start
    trigger = LiftbridgeCountTrigger(stream=stream_name, starts={0: 0, 1: 2, 2: 0}, count=3)
    waiting = asyncio.ensure_future(first_event(trigger, 60))
    liftbridge_client.publish(stream_name, b"p1-2", partition=1)
    liftbridge_client.publish(stream_name, b"p2-0", partition=2)
    await asyncio.sleep(0)
    assert not waiting.done()  # 2 of 3 (the older messages of partition 1 do not count)
    liftbridge_client.publish(stream_name, b"p2-1", partition=2)
    event = await waiting
    assert event == {
        "status": "success",
        "stream": stream_name,
        "starts": {"0": 0, "1": 2, "2": 0},
        "count": 3,
        "committed": {"0": -1, "1": 2, "2": 1},
    }
