"""Waiting triggers under faults: the nats-server restarting under the dev server while a message
trigger waits, and a trigger re-created from ``serialize()`` as after a triggerer restart."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from tests.airflow_support import conn_env_name, liftbridge_conn_json
from tests.margins import bounded

from . import dag_support
from .scenarios import count, read_stream, values

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def external_nats() -> Iterator[NatsServerProcess]:
    proc = NatsServerProcess()
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _trigger(stream: str, target: str, start_at: Any = 0) -> LiftbridgeMessageTrigger:
    return LiftbridgeMessageTrigger(
        stream=stream,
        apply_function="tests.reliability.dag_support.note_and_match",
        start_at=start_at,
        apply_function_kwargs={"target": target},
    )


async def _wait_seen(n: int, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    with bounded("the trigger saw the messages", timeout):
        deadline = loop.time() + timeout
        while len(dag_support.SEEN) < n:
            assert loop.time() < deadline, f"the trigger saw {len(dag_support.SEEN)} of {n} messages"
            await asyncio.sleep(0.02)


async def test_message_trigger_keeps_waiting_across_a_nats_server_restart(
    external_nats: NatsServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trigger reads over gRPC; the dev server takes NATS-direct publishes through its NATS
    connection, which must come back after the nats-server restarts (same port)."""
    port = external_nats.port
    with DevServer(nats_url=external_nats.url) as server:
        monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(server.address))
        stream = f"trig-{uuid.uuid4().hex[:8]}"
        records = values(10)
        with LiftbridgeClient(server.address, nats_servers=[external_nats.url]) as client:
            client.create_stream(stream, stream)
            dag_support.SEEN.clear()
            waiting = asyncio.ensure_future(_trigger(stream, records[-1].decode()).run().__anext__())
            pub = ExactlyOncePublisher(client, stream, "trig", options=PublishOptions(path="nats", timeout=1.0))
            await asyncio.to_thread(pub.publish, records[:5])
            await _wait_seen(5)
            external_nats.stop()
            restarted = NatsServerProcess(port=port)
            restarted.start()
            try:
                assert not waiting.done()
                await asyncio.to_thread(pub.publish, records[5:])
                event = await asyncio.wait_for(waiting, 15)
            finally:
                restarted.stop()
            assert event.payload["status"] == "success", event.payload
            assert event.payload["message"]["offset"] == 9
            assert dag_support.SEEN == list(range(10))  # no gap, no duplicate
            assert count(records, read_stream(client, stream))[1:] == (0, 0)


async def test_trigger_recreated_from_serialize_continues(
    lb_address: str, monkeypatch: pytest.MonkeyPatch, stream_name: str
) -> None:
    """A triggerer restart: the running trigger is cancelled, a new one is built from
    ``serialize()`` and finds the message published while no trigger ran."""
    from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor

    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(lb_address))
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, values(3, "old"))
        sensor = LiftbridgeMessageSensor(
            task_id="wait",
            stream=stream_name,
            apply_function="tests.reliability.dag_support.note_and_match",
            apply_function_kwargs={"target": "rec-000004"},
            start_at="new_only",  # pinned to offset 3 by prepare(): the restart must not lose its place
            deferrable=True,
        )
        await asyncio.to_thread(sensor.prepare, {})
        first = sensor.make_trigger({})
        dag_support.SEEN.clear()
        running = asyncio.ensure_future(first.run().__anext__())
        client.publish_many(stream_name, values(2))  # rec-000000, rec-000001 at offsets 3 and 4
        await _wait_seen(2)
        running.cancel()  # the triggerer goes away
        with pytest.raises(asyncio.CancelledError):
            await running
        client.publish_many(stream_name, values(5)[2:])  # published while no trigger runs
        classpath, kwargs = first.serialize()
        assert classpath == "airflow_provider_liftbridge.triggers.message.LiftbridgeMessageTrigger"
        json.dumps(kwargs)  # what the triggerer stores
        again = LiftbridgeMessageTrigger(**kwargs)
        event = await asyncio.wait_for(again.run().__anext__(), 15)
        assert event.payload["status"] == "success", event.payload
        assert event.payload["message"]["offset"] == 7  # old-0..2, rec-0..4: rec-000004 is offset 7
        # Re-created from its start offset: it reads 3 and 4 again (no gap), then goes on.
        assert dag_support.SEEN == [3, 4, 3, 4, 5, 6, 7]
