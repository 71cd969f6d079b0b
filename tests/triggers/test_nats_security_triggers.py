"""The ack-inbox trigger (the deferred LiftbridgeAckSensor) and the publish operator's NATS path
connect with the connection's NATS credentials: a real nats-server that demands a token, the
token given in the connection's ``nats_token`` extra."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.devserver import DevServer, NatsServerSecurity
from airflow_provider_liftbridge.nats_security import NatsSecurity
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.triggers.ack import LiftbridgeAckTrigger
from tests.airflow_support import conn_env_name
from tests.triggers.test_triggers import first_event

pytestmark = pytest.mark.timeout(60)
TOKEN = "tok-3b7c0e"


@pytest.fixture(scope="module")
def token_nats() -> Iterator[DevServer]:
    with DevServer(nats_security=NatsServerSecurity(token=TOKEN, client=NatsSecurity(token=TOKEN))) as server:
        yield server


@pytest.fixture
def conn(token_nats: DevServer, monkeypatch: pytest.MonkeyPatch) -> str:
    extra = {"nats_servers": token_nats.nats_url, "nats_token": TOKEN}
    conn = {"conn_type": "liftbridge", "host": token_nats.address, "extra": extra}
    monkeypatch.setenv(conn_env_name("lb_token"), json.dumps(conn))
    return "lb_token"


async def test_ack_inbox_trigger_uses_the_token(token_nats: DevServer, conn: str, stream_name: str) -> None:
    with LiftbridgeClient(token_nats.address) as client:
        client.create_stream(stream_name, stream_name)
    inbox = f"acks.{stream_name}"
    waiting = asyncio.ensure_future(
        first_event(LiftbridgeAckTrigger(ack_inbox=inbox, correlation_ids=["m1"], liftbridge_conn_id=conn))
    )
    await asyncio.sleep(0.5)  # listening before the ack is sent (NATS keeps no history)
    async with await NatsPublisher.connect(token_nats.nats_url, security=NatsSecurity(token=TOKEN)) as publisher:
        await publisher.publish(stream_name, b"one", ack_inbox=inbox, correlation_id="m1")
    event = await asyncio.wait_for(waiting, 15)
    assert event["status"] == "success", event
    assert [a["correlation_id"] for a in event["acks"]] == ["m1"]


def test_publish_operator_publishes_over_nats_with_the_token(
    token_nats: DevServer, conn: str, stream_name: str
) -> None:
    with LiftbridgeClient(token_nats.address) as client:
        client.create_stream(stream_name, stream_name)
    op = LiftbridgePublishOperator(
        task_id="p",
        stream=stream_name,
        records=["a", "b"],
        options=PublishOptions(path="nats"),
        liftbridge_conn_id=conn,
    )
    summary = op.execute({})
    assert summary["count"] == 2
