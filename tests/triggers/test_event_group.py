"""LiftbridgeEventTrigger with ``consumer_group``: watchers share a stream's partitions through a
Liftbridge consumer group (dev server with short group timeouts, real group RPCs), on the run() path
and in ack mode (Airflow's own SharedStreamManager, the supervisor's confirmations played by the test)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, Record
from airflow_provider_liftbridge.client.consumer import group_cursor_id
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger
from tests import group_log
from tests.airflow_conftest import needs_ack_mode
from tests.triggers.test_event_trigger import Runner

pytestmark = pytest.mark.timeout(90)


def _watcher(server: DevServer, stream: str, group: str, member: str) -> LiftbridgeEventTrigger:
    return LiftbridgeEventTrigger(
        stream=stream, brokers=server.address, consumer_group=group, consumer_id=member, start_at="earliest"
    )


def _put(server: DevServer, stream: str, per_partition: int) -> None:
    with LiftbridgeClient(server.address) as client:
        for p in (0, 1):
            client.publish_many(stream, [Record(f"{p}-{i}".encode(), partition=p) for i in range(per_partition)])


async def test_two_watchers_share_the_partitions_and_fire_each_message_once(
    groups_server: DevServer, caplog: pytest.LogCaptureFixture, stream_name: str
) -> None:
    group_log.listen(caplog)
    with LiftbridgeClient(groups_server.address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
    group = f"{stream_name}-watchers"
    fired: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}

    async def watch(member: str) -> None:
        async for event in _watcher(groups_server, stream_name, group, member).run():
            assert event.payload["cursor_id"] == group_cursor_id(group)
            message = event.payload["message"]
            fired[member].append((message["partition"], message["offset"]))

    tasks = [asyncio.create_task(watch(m)) for m in fired]
    try:
        # Both joined, the coordinator split the two partitions, and each took its own: that lasts
        # while both watch (their keepers heartbeat).
        await asyncio.wait_for(
            group_log.until_split(caplog, group, {"a": {stream_name: [0]}, "b": {stream_name: [1]}}), 60
        )
        _put(groups_server, stream_name, 3)
        for _ in range(200):
            if len(fired["a"]) + len(fired["b"]) >= 6:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # nothing more may come
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    everything = sorted(fired["a"] + fired["b"])
    assert everything == [(p, o) for p in (0, 1) for o in range(3)]  # every message once, none twice
    assert {p for p, _ in fired["a"]} == {0} and {p for p, _ in fired["b"]} == {1}


@needs_ack_mode
async def test_ack_mode_writes_the_group_positions_once_events_are_stored(
    groups_server: DevServer, stream_name: str
) -> None:
    from airflow.triggers.shared_stream import SharedStreamManager

    with LiftbridgeClient(groups_server.address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        _put(groups_server, stream_name, 2)
        group = f"{stream_name}-ack"
        trigger = _watcher(groups_server, stream_name, group, "solo")
        runner = Runner(SharedStreamManager(ack_timeout=60), trigger)
        async with runner.running():
            await runner.wait_for(4)
            for _ in range(100):
                cursors = [client.fetch_cursor(group_cursor_id(group), stream_name, p) for p in (0, 1)]
                if cursors == [1, 1]:
                    break
                await asyncio.sleep(0.1)
        assert cursors == [1, 1]
        assert sorted((e["message"]["partition"], e["message"]["offset"]) for e in runner.events) == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        ]


def test_group_watcher_arguments_and_serialization() -> None:
    trigger = LiftbridgeEventTrigger(stream="s", consumer_group="g", consumer_id="m")
    classpath, kwargs = trigger.serialize()
    assert (kwargs["consumer_group"], kwargs["consumer_id"]) == ("g", "m")
    assert LiftbridgeEventTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert "consumer_group" not in LiftbridgeEventTrigger(stream="s").serialize()[1]
    with pytest.raises(LiftbridgeArgumentError, match="exclude each other"):
        LiftbridgeEventTrigger(stream="s", consumer_group="g", cursor_id="c")
    with pytest.raises(LiftbridgeArgumentError, match="start_at must be"):
        LiftbridgeEventTrigger(stream="s", consumer_group="g", start_at=3)
