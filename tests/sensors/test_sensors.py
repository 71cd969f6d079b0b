"""Sensors in both modes against the dev server: poking, and deferring to a trigger that is then
driven to its event and handed to execute_complete (as the triggerer and worker would)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferred

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher, publish_many_direct
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeTriggerEventError
from airflow_provider_liftbridge.sensors.ack import LiftbridgeAckSensor
from airflow_provider_liftbridge.sensors.base import LiftbridgeBaseSensor
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor
from airflow_provider_liftbridge.triggers.ack import LiftbridgeAckTrigger
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from airflow_provider_liftbridge.triggers.offset import LiftbridgeOffsetTrigger

pytestmark = pytest.mark.usefixtures("liftbridge_conn")
MATCHERS = "airflow_provider_liftbridge.sensors.matchers"


def defer(sensor: LiftbridgeBaseSensor) -> TaskDeferred:
    with pytest.raises(TaskDeferred) as info:
        sensor.execute({})
    return info.value


def run_trigger(deferred: TaskDeferred) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in deferred.trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), 15))


def publish_later(client: LiftbridgeClient, stream: str, values: list[bytes], delay: float = 0.5) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        client.publish_many(stream, values)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_deferrable_defaults_to_the_airflow_setting() -> None:
    from airflow.sdk import conf

    sensor = LiftbridgeOffsetSensor(task_id="s", stream="s", target_offset=0)
    assert sensor.deferrable is conf.getboolean("operators", "default_deferrable", fallback=False)


# -- offset ----------------------------------------------------------------------------------------


def test_offset_sensor_pokes_until_reached(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    thread = publish_later(liftbridge_client, stream_name, [b"a", b"b", b"c"])
    sensor = LiftbridgeOffsetSensor(task_id="s", stream=stream_name, target_offset="2", poke_interval=0.2, timeout=10)
    result = sensor.execute({})
    thread.join()
    assert result == {"stream": stream_name, "partition": 0, "target_offset": 2, "offset": 2}


def test_offset_sensor_times_out(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    sensor = LiftbridgeOffsetSensor(task_id="s", stream=stream_name, target_offset=0, poke_interval=0.1, timeout=0.3)
    with pytest.raises(AirflowSensorTimeout):
        sensor.execute({})


def test_offset_sensor_defers_with_its_timeout(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    summary = {
        "stream": stream_name,
        "count": 2,
        "acknowledged": 2,
        "ack_policy": "LEADER",
        "partitions": {"1": {"first_offset": 0, "last_offset": 1, "count": 2}},
    }
    sensor = LiftbridgeOffsetSensor(task_id="s", target_offset=summary, partition=1, deferrable=True, timeout=42)
    deferred = defer(sensor)
    assert deferred.timeout == timedelta(seconds=42)
    assert deferred.method_name == "execute_complete"
    assert isinstance(deferred.trigger, LiftbridgeOffsetTrigger)
    assert deferred.trigger.serialize()[1] == {
        "stream": stream_name,
        "target_offset": 1,
        "partition": 1,
        "liftbridge_conn_id": "liftbridge_default",
    }
    liftbridge_client.publish_many(stream_name, [b"x", b"y"], partition=1)
    event = run_trigger(deferred)
    assert sensor.execute_complete({}, event) == {
        "stream": stream_name,
        "partition": 1,
        "target_offset": 1,
        "offset": 1,
    }


def test_execute_complete_raises_the_trigger_error() -> None:
    sensor = LiftbridgeOffsetSensor(task_id="wait", stream="s", target_offset=0, deferrable=True)
    with pytest.raises(LiftbridgeTriggerEventError, match="wait: no such stream"):
        sensor.execute_complete({}, {"status": "error", "message": "no such stream", "error_type": "NoSuchStreamError"})
    with pytest.raises(LiftbridgeTriggerEventError, match="no usable event"):
        sensor.execute_complete({}, None)


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ({"stream": "s", "partitions": {"0": {"last_offset": 1}}, "ack_policy": "NONE"}, "ack policy NONE"),
        ({"stream": "s", "partitions": {"3": {"last_offset": 1}}}, "no offsets for partition 0"),
        ({"count": 3}, "expected a publish summary"),
        ("soon", "target_offset='soon' is not valid: an offset"),
    ],
)
def test_offset_sensor_rejects_bad_targets(target: Any, words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        LiftbridgeOffsetSensor(task_id="s", stream="s", target_offset=target).execute({})


# -- ack -------------------------------------------------------------------------------------------


def summary_of(client: LiftbridgeClient, stream: str) -> dict[str, Any]:
    from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator

    client.create_stream(stream, stream, partitions=2)
    return LiftbridgePublishOperator(
        task_id="p", stream=stream, records=[f"r{i}" for i in range(6)], partitioner="round_robin"
    ).execute({})


def test_ack_sensor_confirms_a_publish_summary_by_poking(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    summary = summary_of(liftbridge_client, stream_name)
    result = LiftbridgeAckSensor(task_id="a", publish_summary=summary, poke_interval=0.1, timeout=5).execute({})
    assert result == {
        "mode": "offsets",
        "stream": stream_name,
        "partitions": {"0": {"target_offset": 2, "offset": 2}, "1": {"target_offset": 2, "offset": 2}},
    }


def test_ack_sensor_on_a_committed_summary_does_not_defer(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    summary = summary_of(liftbridge_client, stream_name)
    # The publish happened before the sensor started: committed state says so, one look suffices.
    result = LiftbridgeAckSensor(task_id="a", publish_summary=summary, deferrable=True, timeout=30).execute({})
    assert result["mode"] == "offsets" and set(result["partitions"]) == {"0", "1"}


def test_ack_sensor_defers_on_a_summary_not_yet_committed(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    summary = summary_of(liftbridge_client, stream_name)
    summary["partitions"]["1"]["last_offset"] = 4  # two more to come on partition 1
    sensor = LiftbridgeAckSensor(task_id="a", publish_summary=summary, deferrable=True, timeout=30)
    deferred = defer(sensor)
    assert isinstance(deferred.trigger, LiftbridgeAckTrigger) and deferred.timeout == timedelta(seconds=30)
    liftbridge_client.publish_many(stream_name, [b"x", b"y"], partition=1)
    result = sensor.execute_complete({}, run_trigger(deferred))
    assert result["partitions"]["1"] == {"target_offset": 4, "offset": 4}


def test_ack_sensor_listens_on_an_inbox_in_the_worker(
    stream_name: str, liftbridge_client: LiftbridgeClient, nats_url: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    inbox = f"acks.{stream_name}"

    def publish_direct() -> None:
        time.sleep(0.8)  # after the sensor subscribed (NATS keeps no history)

        async def run() -> None:
            async with await NatsPublisher.connect(nats_url) as pub:
                for cid in ("c1", "c2"):
                    await pub.publish(stream_name, cid.encode(), ack_inbox=inbox, correlation_id=cid)

        asyncio.run(run())

    thread = threading.Thread(target=publish_direct)
    thread.start()
    sensor = LiftbridgeAckSensor(task_id="a", ack_inbox=inbox, correlation_ids=["c1", "c2"], timeout=10)
    result = sensor.execute({})
    thread.join()
    assert result["mode"] == "ack_inbox"
    assert sorted(a["correlation_id"] for a in result["acks"]) == ["c1", "c2"]
    assert sorted(a["offset"] for a in result["acks"]) == [0, 1]


def test_ack_sensor_inbox_times_out(stream_name: str) -> None:
    sensor = LiftbridgeAckSensor(task_id="a", ack_inbox=f"acks.{stream_name}", correlation_ids=["never"], timeout=0.5)
    with pytest.raises(AirflowSensorTimeout, match="did not all arrive"):
        sensor.execute({})


def test_ack_sensor_needs_exactly_one_form() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="either publish_summary"):
        LiftbridgeAckSensor(task_id="a")
    with pytest.raises(LiftbridgeArgumentError, match="either publish_summary"):
        LiftbridgeAckSensor(task_id="a", publish_summary={"stream": "s", "partitions": {}}, ack_inbox="x")


# -- message ---------------------------------------------------------------------------------------


def test_message_sensor_pokes_and_moves_the_cursor(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"ready 1", b"no", b"ready 2", b"no"])
    kwargs: dict[str, Any] = {
        "task_id": "m",
        "stream": stream_name,
        "apply_function": f"{MATCHERS}.value_contains",
        "apply_function_args": ["ready"],
        "cursor_id": "sensor-test",
        "poke_interval": 0.1,
        "timeout": 10,
    }
    first = LiftbridgeMessageSensor(**kwargs).execute({})
    assert first["message"]["value_text"] == "ready 1" and first["message"]["offset"] == 0
    assert liftbridge_client.fetch_cursor("sensor-test", stream_name, 0) == 0
    second = LiftbridgeMessageSensor(**kwargs).execute({})  # starts after the cursor
    assert second["message"]["offset"] == 2
    assert liftbridge_client.fetch_cursor("sensor-test", stream_name, 0) == 2
    thread = publish_later(liftbridge_client, stream_name, [b"ready 3"], delay=0.4)
    third = LiftbridgeMessageSensor(**kwargs).execute({})  # nothing yet: pokes until it comes
    thread.join()
    assert third["message"]["offset"] == 4


def test_message_sensor_poke_keeps_its_place(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    sensor = LiftbridgeMessageSensor(
        task_id="m", stream=stream_name, apply_function=f"{MATCHERS}.key_equals", apply_function_args=["k"]
    )
    sensor.prepare({})
    assert sensor.poke({}) is False  # empty partition
    liftbridge_client.publish_many(stream_name, [b"a", b"b"])
    assert sensor.poke({}) is False
    assert sensor._next_offset == 2  # the next poke starts after what it already read
    liftbridge_client.publish(stream_name, b"c", key=b"k")
    result = sensor.poke({})
    assert result and result.xcom_value["message"]["offset"] == 2  # type: ignore[union-attr]


def test_message_sensor_defers_from_a_pinned_offset(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b'{"state": "done"}', b"old"])
    sensor = LiftbridgeMessageSensor(
        task_id="m",
        stream=stream_name,
        apply_function=f"{MATCHERS}.json_field_equals",
        apply_function_args=["state", "done"],
        start_at="new_only",
        cursor_id="deferred-cursor",
        deferrable=True,
        timeout=60,
    )
    deferred = defer(sensor)
    assert isinstance(deferred.trigger, LiftbridgeMessageTrigger)
    assert deferred.trigger.serialize()[1]["start_at"] == 2  # "new_only" pinned when the task started
    assert deferred.timeout == timedelta(seconds=60)
    # Published after the task deferred but before the trigger ran: still found.
    liftbridge_client.publish(stream_name, b'{"state": "done", "n": 3}')
    event = run_trigger(deferred)
    assert liftbridge_client.fetch_cursor("deferred-cursor", stream_name, 0) == -1  # not moved before success
    result = sensor.execute_complete({}, event)
    assert result["match"] == {"state": "done", "n": 3} and result["message"]["offset"] == 2
    assert liftbridge_client.fetch_cursor("deferred-cursor", stream_name, 0) == 2


def test_message_sensor_failure_does_not_move_the_cursor(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    sensor = LiftbridgeMessageSensor(
        task_id="m", stream=stream_name, apply_function=f"{MATCHERS}.any_message", cursor_id="c", deferrable=True
    )
    with pytest.raises(LiftbridgeTriggerEventError):
        sensor.execute_complete({}, {"status": "error", "message": "stream deleted"})
    assert liftbridge_client.fetch_cursor("c", stream_name, 0) == -1


def test_message_sensor_rejects_a_bad_function(stream_name: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match="apply_function"):
        LiftbridgeMessageSensor(task_id="m", stream=stream_name, apply_function="nope").execute({})


def test_publish_many_direct_is_seen_by_the_offset_sensor(
    stream_name: str, liftbridge_client: LiftbridgeClient, nats_url: str
) -> None:
    # A publisher writing straight to NATS, and the sensor reading committed offsets.
    liftbridge_client.create_stream(stream_name, stream_name)
    publish_many_direct(nats_url, stream_name, [b"1", b"2"])
    assert (
        LiftbridgeOffsetSensor(task_id="o", stream=stream_name, target_offset=1, timeout=5).execute({})["offset"] == 1
    )


# -- the check before deferring ----------------------------------------------------------------------


def test_a_failing_check_defers_as_before(stream_name: str) -> None:
    # No such stream yet: the check fails, and the trigger (which reports errors) decides instead.
    sensor = LiftbridgeOffsetSensor(task_id="s", stream=stream_name, target_offset=0, deferrable=True)
    deferred = defer(sensor)
    assert isinstance(deferred.trigger, LiftbridgeOffsetTrigger)


def test_message_sensor_trigger_goes_on_after_what_the_check_read(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"no", b"no"])
    sensor = LiftbridgeMessageSensor(
        task_id="m",
        stream=stream_name,
        apply_function=f"{MATCHERS}.value_contains",
        apply_function_args=["yes"],
        deferrable=True,
    )
    deferred = defer(sensor)
    assert deferred.trigger.serialize()[1]["start_at"] == 2
    liftbridge_client.publish(stream_name, b"yes")
    assert sensor.execute_complete({}, run_trigger(deferred))["message"]["offset"] == 2
