"""Lag as time in the view: the age of the oldest unread message per partition and pipeline, from
real messages on the session dev server stamped at known times (its reception clock,
devserver/clock.py), read by a real consume run, through the view's endpoint behind Airflow's auth."""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import set_reception_clock
from tests.exact_retention import ONE_MESSAGE_SEGMENTS, publish_each, wait_for_earliest
from tests.ui.test_api import Api, airflow_app, connections, pipeline_of, run_consume, token  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]
#: Reception times, an hour apart, long before the test runs: of the message a run reads, and of
#: the unread ones (a partition's stamps never go backwards, so all are in the past).
T_READ = dt.datetime(2026, 3, 2, 9, 0, tzinfo=dt.UTC)
T_OLD = T_READ + dt.timedelta(hours=1)
T_NEW = T_OLD + dt.timedelta(hours=1)


def stamped(client: LiftbridgeClient, stream: str, partition: int, at: dt.datetime, value: bytes) -> None:
    """Publish ``value`` to ``partition`` as received at ``at``."""
    set_reception_clock(stream, at)
    try:
        client.publish(stream, value, partition=partition)
    finally:
        set_reception_clock(stream, None)


def timestamp_s(client: LiftbridgeClient, stream: str, partition: int, offset: int) -> float:
    [message] = list(client.subscribe(stream, partition=partition, start_at=offset, stop_at=offset))
    return message.timestamp / 1e9


def test_lag_age_is_the_age_of_the_oldest_unread_message(
    airflow_app: Any,  # noqa: F811  (the imported fixtures)
    stream_name: str,
    lb_address: str,
    connections: Any,  # noqa: F811
) -> None:
    """After a run read everything the age is 0; then partition 0 gets a message stamped at 10:00
    and one at 11:00, partition 1 one at 11:00 and partition 2 nothing: each partition's age is
    the time since its oldest unread message (10:00 on partition 0, not the newer 11:00), the
    pipeline's is the oldest of all, and a partition without lag has age 0."""
    api = Api(airflow_app, token("op"))
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=3)
        for partition in (0, 1, 2):
            stamped(client, stream_name, partition, T_READ, b'{"n": 0}')
    run_consume(stream_name)
    pipeline = pipeline_of(api.get("/api/connections/liftbridge_default/pipelines"), stream_name)
    assert pipeline["lag"] == 0 and pipeline["lag_age_s"] == 0.0
    assert [r["lag_age_s"] for r in pipeline["partitions"]] == [0.0, 0.0, 0.0]

    with LiftbridgeClient(lb_address) as client:
        stamped(client, stream_name, 0, T_OLD, b'{"n": 1}')
        stamped(client, stream_name, 0, T_NEW, b'{"n": 2}')
        stamped(client, stream_name, 1, T_NEW, b'{"n": 3}')
        oldest = {0: timestamp_s(client, stream_name, 0, 1), 1: timestamp_s(client, stream_name, 1, 1)}
    before = time.time()
    pipeline = pipeline_of(api.get("/api/connections/liftbridge_default/pipelines"), stream_name)
    after = time.time()
    rows = {r["partition"]: r for r in pipeline["partitions"]}
    assert {p: r["lag"] for p, r in rows.items()} == {0: 2, 1: 1, 2: 0}
    for partition in (0, 1):
        assert before - oldest[partition] <= rows[partition]["lag_age_s"] <= after - oldest[partition], partition
    assert rows[2]["lag_age_s"] == 0.0
    assert pipeline["lag_age_s"] == rows[0]["lag_age_s"]
    # Partition 0's age is its 10:00 message's: an hour more than partition 1's (11:00).
    assert rows[0]["lag_age_s"] - rows[1]["lag_age_s"] == pytest.approx(oldest[1] - oldest[0], abs=1.0)
    assert oldest[1] - oldest[0] == pytest.approx(3600, abs=60)


def test_a_position_whose_message_retention_removed(
    airflow_app: Any,  # noqa: F811  (the imported fixtures)
    stream_name: str,
    lb_address: str,
    connections: Any,  # noqa: F811
) -> None:
    """A run read offsets 0-2, then retention (5 messages) removed them: the view answers, with no
    commit time for the gone position and the age of the oldest message kept. Subscribing at the
    gone offset with it as the stop reads on past it on Liftbridge (and so on the dev server): on
    a server that waited there instead, this answer never came."""
    api = Api(airflow_app, token("op"))
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, retention_max_messages=5, **ONE_MESSAGE_SEGMENTS)
        publish_each(client, stream_name, [b'{"n": %d}' % i for i in range(3)])
    run_consume(stream_name)
    with LiftbridgeClient(lb_address) as client:
        publish_each(client, stream_name, [b'{"n": %d}' % i for i in range(3, 8)])
        wait_for_earliest(client, stream_name, 3)
        oldest_kept = timestamp_s(client, stream_name, 0, 3)
    before = time.time()
    [row] = pipeline_of(api.get("/api/connections/liftbridge_default/pipelines"), stream_name)["partitions"]
    after = time.time()
    assert (row["position"], row["high_watermark"], row["lag"]) == (2, 7, 5)
    assert row["last_commit_time"] is None
    assert before - oldest_kept <= row["lag_age_s"] <= after - oldest_kept
