"""On a live stream each trigger fires once, on its task's condition and not before: the offset
trigger (offset sensor, ``min_messages``) when the target offset is committed, the message
trigger on the first accepted message, the ack trigger when every partition has its target. A
publisher writes a message every 20 ms (about 50 a second) on an async client in the trigger's
event loop, and after every ack before the condition the trigger must still be waiting. (The
interval trigger's live-stream test is in test_interval_trigger.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_liftbridge.client import Ack, AsyncLiftbridgeClient
from airflow_provider_liftbridge.triggers.ack import LiftbridgeAckTrigger
from airflow_provider_liftbridge.triggers.base import LiftbridgeBaseTrigger
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from airflow_provider_liftbridge.triggers.offset import LiftbridgeOffsetTrigger

from .test_triggers import first_event

pytestmark = pytest.mark.usefixtures("liftbridge_conn")

#: Messages published before the condition holds.
BEFORE = 30


async def live_until(
    lb_address: str,
    stream: str,
    trigger: LiftbridgeBaseTrigger,
    value: Callable[[int], bytes],
    holds: Callable[[Ack], bool],
    partitions: int = 1,
) -> tuple[dict[str, Any], Ack]:
    """Run ``trigger`` while publishing ``value(n)`` every 20 ms (round robin over ``partitions``)
    until an ack for which ``holds``; assert it did not fire before; return its event and that ack."""
    async with AsyncLiftbridgeClient(lb_address) as client:
        waiting = asyncio.ensure_future(first_event(trigger, 60))
        n = 0
        while True:
            ack = await client.publish(stream, value(n), partition=n % partitions)
            assert ack is not None
            if holds(ack):
                break
            await asyncio.sleep(0.02)
            assert not waiting.done(), f"fired before its condition, after offset {ack.offset}: {waiting.result()}"
            n += 1
        return await waiting, ack


async def test_the_offset_trigger_fires_once_its_target_is_committed(lb_address: str, stream_name: str) -> None:
    async with AsyncLiftbridgeClient(lb_address) as client:
        await client.create_stream(stream_name, stream_name)
    trigger = LiftbridgeOffsetTrigger(stream=stream_name, target_offset=BEFORE)
    event, ack = await live_until(lb_address, stream_name, trigger, lambda n: b"m%d" % n, lambda a: a.offset >= BEFORE)
    assert ack.offset == BEFORE
    assert event["status"] == "success" and event["target_offset"] == BEFORE and event["offset"] >= BEFORE


async def test_the_message_trigger_fires_once_on_the_first_match(lb_address: str, stream_name: str) -> None:
    async with AsyncLiftbridgeClient(lb_address) as client:
        await client.create_stream(stream_name, stream_name)
    trigger = LiftbridgeMessageTrigger(
        stream=stream_name, apply_function="tests.triggers.test_triggers.is_ready", start_at="earliest"
    )
    event, ack = await live_until(
        lb_address,
        stream_name,
        trigger,
        lambda n: b"ready" if n == BEFORE else b"not yet %d" % n,
        lambda a: a.offset == BEFORE,
    )
    assert event["status"] == "success" and event["message"]["offset"] == ack.offset == BEFORE


async def test_the_ack_trigger_fires_once_every_partition_has_its_target(lb_address: str, stream_name: str) -> None:
    async with AsyncLiftbridgeClient(lb_address) as client:
        await client.create_stream(stream_name, stream_name, partitions=2)
    # Round robin: partition 0 reaches offset BEFORE // 2 first, partition 1 one message later.
    target = BEFORE // 2
    trigger = LiftbridgeAckTrigger(stream=stream_name, partition_offsets={"0": target, "1": target})
    event, ack = await live_until(
        lb_address,
        stream_name,
        trigger,
        lambda n: b"m%d" % n,
        lambda a: a.partition == 1 and a.offset >= target,
        partitions=2,
    )
    assert event["status"] == "success" and ack.offset == target
