"""Triggers: exact serialization, argument checks in __init__, and run() against the dev server."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, Message
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.client.transport.channels import ASYNC_REGISTRY
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.ack import LiftbridgeAckTrigger
from airflow_provider_liftbridge.triggers.base import LiftbridgeBaseTrigger
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from airflow_provider_liftbridge.triggers.offset import LiftbridgeOffsetTrigger

pytestmark = pytest.mark.usefixtures("liftbridge_conn")
MATCHERS = "airflow_provider_liftbridge.sensors.matchers"


async def first_event(trigger: LiftbridgeBaseTrigger, timeout: float = 15) -> dict[str, Any]:
    """Drive run() to its one event, the way the triggerer does."""
    generator = trigger.run()
    try:
        event = await asyncio.wait_for(generator.__anext__(), timeout)
    finally:
        await generator.aclose()
    return dict(event.payload)


def is_ready(message: Message) -> bool:
    return message.value == b"ready"


async def async_is_ready(message: Message) -> str | None:
    await asyncio.sleep(0)
    return "found it" if message.value == b"ready" else None


def explode(message: Message) -> bool:
    raise RuntimeError("bad filter")


# -- serialization -----------------------------------------------------------------------------


def test_offset_trigger_serializes_exactly() -> None:
    trigger = LiftbridgeOffsetTrigger(stream="s", target_offset=5, partition=2, liftbridge_conn_id="lb")
    assert trigger.serialize() == (
        "airflow_provider_liftbridge.triggers.offset.LiftbridgeOffsetTrigger",
        {"stream": "s", "target_offset": 5, "partition": 2, "liftbridge_conn_id": "lb"},
    )
    classpath, kwargs = trigger.serialize()
    assert LiftbridgeOffsetTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_ack_trigger_serializes_exactly_in_both_forms() -> None:
    offsets = LiftbridgeAckTrigger(stream="s", partition_offsets={0: 3, "1": 9})
    assert offsets.serialize() == (
        "airflow_provider_liftbridge.triggers.ack.LiftbridgeAckTrigger",
        {
            "stream": "s",
            "partition_offsets": {"0": 3, "1": 9},
            "ack_inbox": None,
            "correlation_ids": None,
            "liftbridge_conn_id": "liftbridge_default",
        },
    )
    inbox = LiftbridgeAckTrigger(ack_inbox="acks.x", correlation_ids=["a", "b"])
    assert inbox.serialize()[1] == {
        "stream": None,
        "partition_offsets": None,
        "ack_inbox": "acks.x",
        "correlation_ids": ["a", "b"],
        "liftbridge_conn_id": "liftbridge_default",
    }
    for trigger in (offsets, inbox):
        classpath, kwargs = trigger.serialize()
        assert LiftbridgeAckTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_message_trigger_serializes_exactly() -> None:
    trigger = LiftbridgeMessageTrigger(
        stream="s",
        apply_function=f"{MATCHERS}.value_contains",
        partition=1,
        start_at="2024-01-02T03:04:05+00:00",
        apply_function_args=["needle"],
        apply_function_kwargs={},
    )
    assert trigger.serialize() == (
        "airflow_provider_liftbridge.triggers.message.LiftbridgeMessageTrigger",
        {
            "stream": "s",
            "apply_function": f"{MATCHERS}.value_contains",
            "partition": 1,
            "start_at": "2024-01-02T03:04:05+00:00",
            "apply_function_args": ["needle"],
            "apply_function_kwargs": {},
            "liftbridge_conn_id": "liftbridge_default",
        },
    )
    classpath, kwargs = trigger.serialize()
    assert LiftbridgeMessageTrigger(**kwargs).serialize() == (classpath, kwargs)


@pytest.mark.parametrize(
    ("factory", "words"),
    [
        (lambda: LiftbridgeOffsetTrigger(stream="", target_offset=1), "stream='' is not valid"),
        (lambda: LiftbridgeOffsetTrigger(stream="s", target_offset=-1), "target_offset=-1 is not valid: an offset"),
        (lambda: LiftbridgeOffsetTrigger(stream="s", target_offset=1, partition="x"), "partition='x' is not valid"),
        (lambda: LiftbridgeOffsetTrigger(stream="s", target_offset=1, liftbridge_conn_id=""), "liftbridge_conn_id"),
        (lambda: LiftbridgeAckTrigger(), "give either"),
        (lambda: LiftbridgeAckTrigger(stream="s", partition_offsets={0: 1}, ack_inbox="x"), "give either"),
        (lambda: LiftbridgeAckTrigger(partition_offsets={0: 1}), "stream is required"),
        (lambda: LiftbridgeAckTrigger(stream="s", partition_offsets={}), "nothing to wait for"),
        (lambda: LiftbridgeAckTrigger(ack_inbox="a b", correlation_ids=["x"]), "NATS subject"),
        (lambda: LiftbridgeAckTrigger(ack_inbox="a", correlation_ids=[]), "non-empty list"),
        (lambda: LiftbridgeMessageTrigger(stream="s", apply_function="nodots"), "dotted path"),
        (lambda: LiftbridgeMessageTrigger(stream="s", apply_function="no_such_module.f()"), "a dotted path"),
        (
            lambda: LiftbridgeMessageTrigger(stream="s", apply_function=f"{MATCHERS}.any_message", start_at="soon"),
            "start_at='soon' is not valid",
        ),
    ],
)
def test_arguments_are_checked_in_init(factory: Any, words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        factory()


# -- run() ---------------------------------------------------------------------------------------


async def test_offset_already_reached_fires_at_once(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"a", b"b", b"c"])
    event = await first_event(LiftbridgeOffsetTrigger(stream=stream_name, target_offset=1))
    assert event == {"status": "success", "stream": stream_name, "partition": 0, "target_offset": 1, "offset": 2}


async def test_offset_fires_when_the_message_is_committed(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    waiting = asyncio.ensure_future(
        first_event(LiftbridgeOffsetTrigger(stream=stream_name, target_offset=2, partition=1))
    )
    await asyncio.sleep(0.3)
    liftbridge_client.publish_many(stream_name, [b"0", b"1"], partition=1)
    await asyncio.sleep(0.3)
    assert not waiting.done()  # offset 1 is not offset 2
    await asyncio.to_thread(liftbridge_client.publish, stream_name, b"2", partition=1)
    event = await asyncio.wait_for(waiting, 10)
    assert event["status"] == "success" and event["offset"] == 2 and event["partition"] == 1


async def test_missing_stream_is_an_error_event(stream_name: str) -> None:
    event = await first_event(LiftbridgeOffsetTrigger(stream=stream_name, target_offset=0))
    assert event["status"] == "error"
    assert event["error_type"] == "NoSuchStreamError"
    assert event["message"]


async def test_readonly_partition_ends_the_wait_with_an_error(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish(stream_name, b"only")
    liftbridge_client.set_stream_readonly(stream_name)
    event = await first_event(LiftbridgeOffsetTrigger(stream=stream_name, target_offset=5))
    assert event["status"] == "error"
    assert "is read-only at offset 0: offset 5 will never be written" in event["message"]


async def test_bad_connection_is_an_error_event(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LB_BROKEN", '{"conn_type": "liftbridge", "host": ""}')
    event = await first_event(LiftbridgeOffsetTrigger(stream="s", target_offset=0, liftbridge_conn_id="lb_broken"))
    assert event["status"] == "error" and event["error_type"] == "LiftbridgeConnectionConfigError"
    assert "field 'Brokers'" in event["message"]


async def test_message_trigger_finds_the_first_match(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"no", b"nope", b"ready", b"ready"])
    trigger = LiftbridgeMessageTrigger(stream=stream_name, apply_function=f"{__name__}.is_ready")
    event = await first_event(trigger)
    assert event["status"] == "success" and event["match"] is None
    message = event["message"]
    assert message["offset"] == 2 and message["value_text"] == "ready"
    assert base64.b64decode(message["value"]) == b"ready"
    assert message["stream"] == stream_name and message["partition"] == 0


async def test_message_trigger_waits_from_an_offset_with_an_async_function(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"ready", b"x"])  # offset 0 matches but is before start_at
    trigger = LiftbridgeMessageTrigger(stream=stream_name, apply_function=f"{__name__}.async_is_ready", start_at=1)
    waiting = asyncio.ensure_future(first_event(trigger))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await asyncio.to_thread(liftbridge_client.publish, stream_name, b"ready", key=b"k", headers={"h": b"v"})
    event = await asyncio.wait_for(waiting, 10)
    assert event["match"] == "found it"
    assert event["message"]["offset"] == 2
    assert base64.b64decode(event["message"]["key"]) == b"k"
    assert base64.b64decode(event["message"]["headers"]["h"]) == b"v"


async def test_failing_apply_function_is_an_error_event(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish(stream_name, b"x")
    event = await first_event(LiftbridgeMessageTrigger(stream=stream_name, apply_function=f"{__name__}.explode"))
    assert event["status"] == "error"
    assert (
        f"{__name__}.explode" in event["message"]
        and "offset 0" in event["message"]
        and "bad filter" in event["message"]
    )


async def test_ack_trigger_waits_for_every_partition(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    liftbridge_client.publish_many(stream_name, [b"a", b"b"], partition=0)
    trigger = LiftbridgeAckTrigger(stream=stream_name, partition_offsets={"0": 1, "1": 0})
    waiting = asyncio.ensure_future(first_event(trigger))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # partition 1 has nothing yet
    await asyncio.to_thread(liftbridge_client.publish, stream_name, b"c", partition=1)
    event = await asyncio.wait_for(waiting, 10)
    assert event == {
        "status": "success",
        "mode": "offsets",
        "stream": stream_name,
        "partitions": {"0": {"target_offset": 1, "offset": 1}, "1": {"target_offset": 0, "offset": 0}},
    }


async def test_ack_trigger_collects_acks_on_an_inbox(
    stream_name: str, liftbridge_client: LiftbridgeClient, nats_url: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    inbox = f"acks.{stream_name}"
    trigger = LiftbridgeAckTrigger(ack_inbox=inbox, correlation_ids=["m1", "m2"])
    waiting = asyncio.ensure_future(first_event(trigger))
    await asyncio.sleep(0.5)  # the trigger must be listening before the acks are sent (NATS keeps no history)
    async with await NatsPublisher.connect(nats_url) as publisher:
        await publisher.publish(stream_name, b"other", ack_inbox=inbox, correlation_id="someone-else")
        await publisher.publish(stream_name, b"one", ack_inbox=inbox, correlation_id="m1")
        await publisher.publish(f"{stream_name}.1", b"two", ack_inbox=inbox, correlation_id="m2")
    event = await asyncio.wait_for(waiting, 10)
    assert event["status"] == "success" and event["mode"] == "ack_inbox"
    acks = sorted(event["acks"], key=lambda a: a["correlation_id"])
    assert acks == [
        {"correlation_id": "m1", "stream": stream_name, "partition": 0, "offset": 1, "ack_error": "OK"},
        {"correlation_id": "m2", "stream": stream_name, "partition": 1, "offset": 0, "ack_error": "OK"},
    ]


async def test_ack_inbox_reports_a_refused_message(
    stream_name: str, liftbridge_client: LiftbridgeClient, nats_url: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    inbox = f"acks.{stream_name}"
    waiting = asyncio.ensure_future(first_event(LiftbridgeAckTrigger(ack_inbox=inbox, correlation_ids=["bad"])))
    await asyncio.sleep(0.5)
    async with await NatsPublisher.connect(nats_url) as publisher:
        await publisher.publish(
            stream_name, b"x", ack_inbox=inbox, correlation_id="bad", expected_offset=9, ack_policy=AckPolicy.LEADER
        )
    event = await asyncio.wait_for(waiting, 10)
    assert event["status"] == "error"
    assert "'bad' was refused" in event["message"] and "INCORRECT_OFFSET" in event["message"]


async def test_ack_inbox_needs_nats_servers(monkeypatch: pytest.MonkeyPatch, lb_address: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LB_NO_NATS", f'{{"conn_type": "liftbridge", "host": "{lb_address}"}}')
    trigger = LiftbridgeAckTrigger(ack_inbox="a", correlation_ids=["x"], liftbridge_conn_id="lb_no_nats")
    event = await first_event(trigger)
    assert event["status"] == "error" and "'NATS servers'" in event["message"]


async def test_many_triggers_share_channels(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    before = ASYNC_REGISTRY.open_channels()
    triggers = [LiftbridgeMessageTrigger(stream=stream_name, apply_function=f"{__name__}.is_ready") for _ in range(30)]
    waiting = [asyncio.ensure_future(first_event(t)) for t in triggers]
    await asyncio.sleep(1.0)
    during = ASYNC_REGISTRY.open_channels()
    # 30 waiting subscriptions on one broker: exactly one channel, shared with the unary calls.
    assert during - before == 1, (before, during)
    await asyncio.to_thread(liftbridge_client.publish, stream_name, b"ready")
    events = await asyncio.wait_for(asyncio.gather(*waiting), 15)
    assert all(e["status"] == "success" and e["message"]["offset"] == 0 for e in events)
    assert ASYNC_REGISTRY.open_channels() == before  # released when the last trigger closed its client
