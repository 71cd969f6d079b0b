"""LiftbridgeIntervalTrigger: the exact serialize() tuple, and run() driven to its one event against
the dev server (real timestamps, the leader's wall clock): it stays asleep while messages keep
arriving before the interval's end, fires once a committed message at or after the end is there,
fires at end + lateness on a quiet (or empty) partition, and not while a message is written but
not committed (a stalled follower holds the high watermark on a three-broker dev server).

No sleeps: each step waits for an ack, the clock passing a time, a log line or the event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AckPolicy, AsyncLiftbridgeClient, LiftbridgeClient
from airflow_provider_liftbridge.client.reading import partition_complete
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.interval import LiftbridgeIntervalTrigger
from tests.airflow_support import conn_env_name, liftbridge_conn_json

from .test_triggers import first_event

SECOND = 1_000_000_000


def test_interval_trigger_serializes_exactly() -> None:
    trigger = LiftbridgeIntervalTrigger(stream="s", partitions=[2, 0], end_ns=7, lateness_ns=3, liftbridge_conn_id="lb")
    assert trigger.serialize() == (
        "airflow_provider_liftbridge.triggers.interval.LiftbridgeIntervalTrigger",
        {"stream": "s", "partitions": [0, 2], "end_ns": 7, "lateness_ns": 3, "liftbridge_conn_id": "lb"},
    )
    classpath, kwargs = trigger.serialize()
    assert LiftbridgeIntervalTrigger(**kwargs).serialize() == (classpath, kwargs)
    with pytest.raises(LiftbridgeArgumentError, match="end_ns"):
        LiftbridgeIntervalTrigger(stream="s", partitions=[0], end_ns="soon", lateness_ns=0)  # type: ignore[arg-type]
    with pytest.raises(LiftbridgeArgumentError, match="partitions"):
        LiftbridgeIntervalTrigger(stream="s", partitions=[], end_ns=1, lateness_ns=0)


def test_the_completeness_rule_is_the_planners() -> None:
    rule: dict[str, Any] = {"end_ns": 100, "lateness_ns": 10}
    assert partition_complete(committed_timestamp=100, high_watermark=5, newest_offset=9, now_ns=0, **rule)
    assert not partition_complete(committed_timestamp=99, high_watermark=5, newest_offset=5, now_ns=109, **rule)
    assert partition_complete(committed_timestamp=99, high_watermark=5, newest_offset=5, now_ns=110, **rule)
    assert not partition_complete(committed_timestamp=99, high_watermark=5, newest_offset=6, now_ns=999, **rule)
    assert not partition_complete(committed_timestamp=99, high_watermark=5, newest_offset=None, now_ns=999, **rule)
    assert partition_complete(committed_timestamp=None, high_watermark=-1, newest_offset=-1, now_ns=110, **rule) == (
        "empty partition, lateness passed"
    )


async def _until(moment_ns: int) -> None:
    while time.time_ns() < moment_ns:
        await asyncio.sleep(0.01)


@pytest.mark.usefixtures("liftbridge_conn")
async def test_it_sleeps_through_messages_before_the_end_and_fires_once_one_at_or_after_it_is_committed(
    lb_address: str, stream_name: str
) -> None:
    async with AsyncLiftbridgeClient(lb_address) as client:
        await client.create_stream(stream_name, stream_name)
        end_ns = time.time_ns() + 3 * SECOND
        waiting = asyncio.ensure_future(
            first_event(
                LiftbridgeIntervalTrigger(stream=stream_name, partitions=[0], end_ns=end_ns, lateness_ns=3600 * SECOND),
                60,
            )
        )
        # A live stream: a message every 20 ms up to the first one the leader stamps at or after
        # the end. Each one is committed when acked; none before the end may fire the trigger.
        before = 0
        while True:
            ack = await client.publish(stream_name, b"m%d" % before)
            assert ack is not None
            if ack.reception_timestamp >= end_ns:
                after_offset = ack.offset
                break
            await asyncio.sleep(0.02)
            assert not waiting.done(), f"fired before the end, after offset {ack.offset}: {waiting.result()}"
            before += 1
        assert before >= 5  # it did see a live stream before the end (about 150 messages on a quiet machine)
        event = await waiting
    assert event == {
        "status": "success",
        "stream": stream_name,
        "partitions": [0],
        "end_ns": end_ns,
        "complete": {"0": "a committed message at or after the end"},
        "checked_at_ns": event["checked_at_ns"],
    }
    assert event["checked_at_ns"] >= end_ns and after_offset == before


@pytest.mark.usefixtures("liftbridge_conn")
async def test_it_fires_at_end_plus_lateness_on_quiet_and_empty_partitions(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=3)
    liftbridge_client.publish(stream_name, b"quiet", partition=1)
    end_ns, lateness_ns = time.time_ns() + SECOND // 2, SECOND
    waiting = asyncio.ensure_future(
        first_event(
            LiftbridgeIntervalTrigger(stream=stream_name, partitions=[0, 1, 2], end_ns=end_ns, lateness_ns=lateness_ns),
            60,
        )
    )
    await _until(end_ns + SECOND // 10)
    # Partition 2 gets a message after the end: complete at once; the others only at end + lateness.
    ack = liftbridge_client.publish(stream_name, b"after", partition=2)
    assert ack is not None and ack.reception_timestamp >= end_ns
    event = await waiting
    assert event["complete"] == {
        "0": "empty partition, lateness passed",
        "1": "lateness passed, all committed",
        "2": "a committed message at or after the end",
    }
    assert event["checked_at_ns"] >= end_ns + lateness_ns


#: A stalled follower stays in the ISR (holding the high watermark) for a minute.
HOLD_ISR = ClusterTimings.fast(replica_max_lag_time=60.0)


@pytest.fixture
def holding_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[DevServer]:
    with DevServer(brokers=3, timings=HOLD_ISR) as server:
        monkeypatch.setenv(
            conn_env_name("liftbridge_default"), liftbridge_conn_json(server.address, nats_url=server.nats_url)
        )
        yield server


async def test_it_does_not_fire_at_end_plus_lateness_while_a_message_is_written_but_not_committed(
    holding_cluster: DevServer, stream_name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with LiftbridgeClient(holding_cluster.address) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3)
        ack = client.publish(stream_name, b"committed", ack_policy=AckPolicy.ALL)
        assert ack is not None
        info = client.fetch_partition_metadata(stream_name, 0)
        # A follower the connection's broker (broker 0) is not: calls keep going to a running broker.
        follower = next(i for i, b in enumerate(holding_cluster.broker_ids) if b != info.leader and i != 0)
        holding_cluster.stall_broker(follower)
        try:
            held = client.publish(stream_name, b"written", ack_policy=AckPolicy.LEADER)
            assert held is not None and held.offset == 1
            end_ns, lateness_ns = held.reception_timestamp + 1, SECOND // 2
            waiting = asyncio.ensure_future(
                first_event(
                    LiftbridgeIntervalTrigger(
                        stream=stream_name, partitions=[0], end_ns=end_ns, lateness_ns=lateness_ns
                    ),
                    120,
                )
            )
            # The lateness passes; the trigger looks and finds offset 1 written, not committed.
            # (The trigger's log goes through structlog to the standard output.)
            logged = ""
            while "offsets 1..1 are written and not committed yet" not in logged:
                assert not waiting.done(), waiting.result()
                await asyncio.sleep(0.05)
                logged += capfd.readouterr().out
            assert time.time_ns() >= end_ns + lateness_ns
            assert not waiting.done(), waiting.result()
            info = client.fetch_partition_metadata(stream_name, 0)
            assert (info.high_watermark, info.newest_offset) == (0, 1)  # still held: the look was right
        finally:
            holding_cluster.resume_broker(follower)
        event = await waiting  # committed now: its next look finds everything committed
    assert event["complete"] == {"0": "lateness passed, all committed"}
