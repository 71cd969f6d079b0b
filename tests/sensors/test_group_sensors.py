"""The message sensor and trigger as consumer-group members: several waits share one stream's
partitions, and what one member looked at is not read again by another (dev server, real group RPCs)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_liftbridge.client import LiftbridgeClient, Record
from airflow_provider_liftbridge.client.consumer import group_cursor_id
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from tests import group_log
from tests.airflow_support import conn_env_name, liftbridge_conn_json

MATCH_X = {"apply_function": "airflow_provider_liftbridge.sensors.matchers.value_contains"}


def _put(client: LiftbridgeClient, stream: str, partition: int, *values: bytes) -> None:
    client.publish_many(stream, [Record(v, partition=partition) for v in values])


def _sensor(stream: str, group: str, member: str, **kwargs: Any) -> LiftbridgeMessageSensor:
    return LiftbridgeMessageSensor(
        task_id=f"wait-{member}",
        stream=stream,
        consumer_group=group,
        consumer_id=member,
        apply_function_kwargs={"needle": "x"},
        **MATCH_X,
        **kwargs,
    )


@pytest.mark.usefixtures("liftbridge_conn")
def test_poking_members_never_read_what_another_member_looked_at(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    _put(liftbridge_client, stream_name, 0, b"no", b"x-0")
    _put(liftbridge_client, stream_name, 1, b"no")
    group = f"{stream_name}-readers"
    first = _sensor(stream_name, group, "a", poke_interval=0.1, timeout=10)
    assert first.execute({})["message"]["partition"] == 0  # the only member: it had every partition
    second = _sensor(stream_name, group, "b")
    second.prepare({})
    assert second.poke({}) is False  # partition 0 is done for the group; partition 1 holds only "no"
    assert liftbridge_client.fetch_cursor(group_cursor_id(group), stream_name, 1) == 0
    _put(liftbridge_client, stream_name, 1, b"x-1")
    result = second.poke({})
    assert not isinstance(result, bool) and result.is_done
    assert (result.xcom_value["message"]["partition"], result.xcom_value["message"]["offset"]) == (1, 1)
    cursors = [liftbridge_client.fetch_cursor(group_cursor_id(group), stream_name, p) for p in (0, 1)]
    assert cursors == [1, 1]


def test_two_deferred_waits_in_one_group_fire_on_different_partitions(
    groups_server: DevServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stream_name: str
) -> None:
    group_log.listen(caplog)
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(groups_server.address))
    group = f"{stream_name}-g"
    triggers = []
    for member in ("a", "b"):
        with pytest.raises(TaskDeferred) as info:
            _sensor(stream_name, group, member, deferrable=True, timeout=30).execute({})
        triggers.append(info.value.trigger)
    assert triggers[0].serialize()[1]["consumer_group"] == group

    async def scenario() -> list[dict[str, Any]]:
        with LiftbridgeClient(groups_server.address) as client:
            client.create_stream(stream_name, stream_name, partitions=2)

            async def first(trigger: Any) -> dict[str, Any]:
                async for event in trigger.run():
                    return dict(event.payload)
                raise AssertionError("no event")

            tasks = [asyncio.create_task(first(t)) for t in triggers]
            # Both joined and each took its one partition (and fixed where it starts reading it:
            # new messages only). That lasts: both stay in the group until their event.
            await asyncio.wait_for(
                group_log.until_split(caplog, group, {"a": {stream_name: [0]}, "b": {stream_name: [1]}}), 60
            )
            for p in (0, 1):
                _put(client, stream_name, p, f"x-{p}".encode())
            return list(await asyncio.wait_for(asyncio.gather(*tasks), 30))

    events = asyncio.run(scenario())
    assert all(e["status"] == "success" for e in events)
    assert sorted(e["message"]["partition"] for e in events) == [0, 1]  # one partition each, none read twice


def test_group_arguments_are_checked() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="start_at must be"):
        LiftbridgeMessageTrigger(stream="s", consumer_group="g", start_at=5, **MATCH_X)
    with pytest.raises(LiftbridgeArgumentError, match="exclude each other"):
        _sensor("s", "g", "m", cursor_id="c").prepare({})
    trigger = LiftbridgeMessageTrigger(stream="s", consumer_group="g", consumer_id="m", start_at="new_only", **MATCH_X)
    classpath, kwargs = trigger.serialize()
    assert LiftbridgeMessageTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert (kwargs["consumer_group"], kwargs["consumer_id"]) == ("g", "m")


@pytest.mark.usefixtures("liftbridge_conn")
def test_a_group_member_checks_once_leaves_and_its_trigger_joins_as_it(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    _put(liftbridge_client, stream_name, 0, b"no")
    group = f"{stream_name}-g"
    with pytest.raises(TaskDeferred) as info:
        _sensor(stream_name, group, "a", deferrable=True, timeout=30).execute({})
    # The check looked at partition 0's "no" for the group, committed it, and left.
    assert liftbridge_client.fetch_cursor(group_cursor_id(group), stream_name, 0) == 0
    _put(liftbridge_client, stream_name, 1, b"x-1")

    async def first() -> dict[str, Any]:
        async for event in info.value.trigger.run():  # joins as member "a" again
            return dict(event.payload)
        raise AssertionError("no event")

    event = asyncio.run(asyncio.wait_for(first(), 30))
    assert event["status"] == "success" and (event["message"]["partition"], event["message"]["offset"]) == (1, 0)
    already = _sensor(stream_name, group, "b", deferrable=True, timeout=30)
    _put(liftbridge_client, stream_name, 0, b"x-0")
    # Committed before this member looked: it finishes without deferring.
    assert already.execute({})["message"]["partition"] == 0
