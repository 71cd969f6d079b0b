"""LiftbridgeIntervalTrigger: the exact serialize() tuple, and run() driven to its event against the
dev server: it fires on the committed offset, or at its time when no message comes."""

from __future__ import annotations

import time

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.interval import LiftbridgeIntervalTrigger

from .test_triggers import first_event

pytestmark = pytest.mark.usefixtures("liftbridge_conn")


def test_interval_trigger_serializes_exactly() -> None:
    trigger = LiftbridgeIntervalTrigger(stream="s", target_offset=5, until_ns=7, partition=2, liftbridge_conn_id="lb")
    assert trigger.serialize() == (
        "airflow_provider_liftbridge.triggers.interval.LiftbridgeIntervalTrigger",
        {"stream": "s", "target_offset": 5, "partition": 2, "liftbridge_conn_id": "lb", "until_ns": 7},
    )
    classpath, kwargs = trigger.serialize()
    assert LiftbridgeIntervalTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(LiftbridgeArgumentError, match="until_ns"):
        LiftbridgeIntervalTrigger(stream="s", target_offset=1, until_ns="soon")  # type: ignore[arg-type]


async def test_it_fires_on_the_offset_or_at_its_time(liftbridge_client: LiftbridgeClient, stream_name: str) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish(stream_name, b"m0")
    far = time.time_ns() + 3600 * 10**9
    event = await first_event(LiftbridgeIntervalTrigger(stream=stream_name, target_offset=0, until_ns=far))
    assert event == {
        "status": "success",
        "stream": stream_name,
        "partition": 0,
        "target_offset": 0,
        "offset": 0,
        "reason": "offset",
    }
    past = time.time_ns() - 10**9  # no message 1 comes: the time is up at once
    event = await first_event(LiftbridgeIntervalTrigger(stream=stream_name, target_offset=1, until_ns=past))
    assert event["status"] == "success" and event["reason"] == "time" and event["offset"] is None
