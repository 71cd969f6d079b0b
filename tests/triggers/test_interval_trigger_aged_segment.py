"""LiftbridgeIntervalTrigger on a partition whose newest segment rolled by age and is still empty
(tests/aged_segments.py): the committed message at the interval's end is already there, but
Liftbridge's time lookup from the end answers "the next offset"; the trigger still fires at once on
that message, not at end + lateness. Runs on the dev server and on a real Liftbridge."""

from __future__ import annotations

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading.seek import time_ns
from airflow_provider_liftbridge.triggers.interval import LiftbridgeIntervalTrigger
from tests.aged_segments import at, rolled_partition, server_lookup

from .test_triggers import first_event

HOUR_NS = 3600 * 1_000_000_000


@pytest.mark.usefixtures("liftbridge_conn")
async def test_it_fires_on_the_message_at_the_end_behind_an_empty_rolled_segment(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    stamps = rolled_partition(liftbridge_client, stream_name, 5)
    end = at(stamps[-1])  # the last message is at the end: the partition is complete
    assert server_lookup(liftbridge_client, stream_name, end, 4) is None  # the subscription from the end would wait
    trigger = LiftbridgeIntervalTrigger(stream=stream_name, partitions=[0], end_ns=time_ns(end), lateness_ns=HOUR_NS)
    event = await first_event(trigger, 60)
    assert event["complete"] == {"0": "a committed message at or after the end"}
