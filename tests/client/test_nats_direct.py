"""NATS-direct publishing against the dev server's real nats-server: enveloped messages on a
partition subject, acks read from an ack inbox."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, PublishError, Record, StopPosition
from airflow_provider_liftbridge.client.publishing.nats_engine import partition_subject
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher, publish_many_direct
from airflow_provider_liftbridge.client.publishing.options import PublishOptions


def test_partition_subject() -> None:
    assert partition_subject("orders", 0) == "orders"
    assert partition_subject("orders", 3) == "orders.3"


async def test_publish_many_returns_acks_in_order(nats_url: str, lb_address: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address) as c:
        c.create_stream(stream_name, stream_name, partitions=2)
    records = [Record(b"v%d" % i, key=b"k", partition=i % 2, headers={"h": b"%d" % i}) for i in range(200)]
    async with await NatsPublisher.connect(nats_url) as pub:
        acks = await pub.publish_many(stream_name, records, PublishOptions(window=32))
    assert [a.partition for a in acks] == [i % 2 for i in range(200)]
    assert [a.offset for a in acks if a.partition == 1] == list(range(100))
    with LiftbridgeClient(lb_address) as c:
        msgs = list(c.subscribe(stream_name, partition=1, stop_at=StopPosition.LATEST))
    assert [m.value for m in msgs[:2]] == [b"v1", b"v3"] and msgs[0].headers["h"] == b"1" and msgs[0].key == b"k"


async def test_single_publish_and_ack_inbox(nats_url: str, lb_address: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address) as c:
        c.create_stream(stream_name, stream_name)
    async with await NatsPublisher.connect(nats_url) as pub:
        inbox = pub.new_inbox()
        acks = pub.acks(inbox)
        first = asyncio.ensure_future(acks.__anext__())
        await asyncio.sleep(0.1)  # the inbox subscription is in place
        await pub.publish(stream_name, b"x", ack_inbox=inbox, correlation_id="c1", ack_policy=AckPolicy.ALL)
        ack: Any = await asyncio.wait_for(first, 5)
        await acks.aclose()  # type: ignore[attr-defined]
    assert (ack.stream, ack.offset, ack.correlation_id) == (stream_name, 0, "c1")


def test_blocking_wrapper_and_timeouts(nats_url: str, lb_address: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address) as c:
        c.create_stream(stream_name, stream_name)
        acks = publish_many_direct(nats_url, stream_name, [b"a", b"b"])
        assert [a.offset for a in acks] == [0, 1]
        c.pause_stream(stream_name)
    # Raw NATS publishes to a paused partition are dropped: no ack comes back.
    with pytest.raises(PublishError) as exc:
        publish_many_direct(nats_url, stream_name, [b"c"], PublishOptions(timeout=0.5))
    assert (exc.value.acked, exc.value.index) == (0, 0)
