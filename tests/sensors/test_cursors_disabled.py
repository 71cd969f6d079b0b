"""The Airflow features that need cursors fail fast, naming the server setting, on a cluster with
cursors off (stock Liftbridge's default): LiftbridgeMessageSensor(cursor_id=...), the event trigger
(AssetWatcher) and exactly-once publishing. Real dev server with ``cursors=False``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger, LiftbridgeWatcherError
from tests.airflow_support import conn_env_name, liftbridge_conn_json

pytestmark = pytest.mark.timeout(60)
SETTING = "cursors.stream.partitions"


@pytest.fixture(scope="module")
def no_cursors() -> Iterator[DevServer]:
    with DevServer(brokers=1, cursors=False) as server:
        yield server


@pytest.fixture
def stream(no_cursors: DevServer, stream_name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(no_cursors.address))
    with LiftbridgeClient(no_cursors.address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish(stream_name, b"ready")
    return stream_name


def test_message_sensor_with_a_cursor_fails_at_once(stream: str) -> None:
    sensor = LiftbridgeMessageSensor(
        task_id="m", stream=stream, apply_function="builtins.bool", cursor_id="c", poke_interval=0.1, timeout=30
    )
    with pytest.raises(Exception, match=SETTING) as info:
        sensor.execute({})
    assert "cursors are disabled" in str(info.value)


async def test_event_trigger_fails_at_once(stream: str) -> None:
    trigger = LiftbridgeEventTrigger(stream=stream, start_at="earliest")
    with pytest.raises(LiftbridgeWatcherError, match=SETTING):
        async for _ in trigger.run():
            pytest.fail("no event can fire without cursors")


def test_exactly_once_operator_fails_at_once(stream: str) -> None:
    op = LiftbridgePublishOperator(task_id="p", stream=stream, records=["a"], exactly_once=True, producer_id="x")
    with pytest.raises(Exception, match=SETTING) as info:
        op.execute({})
    assert "resumption" not in str(info.value)  # stopped at the first cursor call, no resumption
