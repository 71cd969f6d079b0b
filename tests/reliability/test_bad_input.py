"""Bad input that is not covered elsewhere (tests/hooks covers malformed extra fields,
tests/triggers a missing stream for the offset trigger): each gives a clear error or a clean
end, quickly, and nothing is stored half-way."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, MessageTooLargeError, Record
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher, ExactlyOncePublishError
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.exceptions import LiftbridgePublishNotAcknowledgedError
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from tests.airflow_support import conn_env_name

pytestmark = pytest.mark.timeout(60)

BIG_GRPC = 65 * 1024 * 1024  # over the dev server's 64 MiB gRPC receive limit
BIG_NATS = 2 * 1024 * 1024  # over nats-server's default 1 MiB max_payload


def test_extra_that_is_not_json_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_liftbridge.exceptions import LiftbridgeConnectionConfigError
    from airflow_provider_liftbridge.hooks.base import LiftbridgeHook

    conn = {"conn_type": "liftbridge", "host": "127.0.0.1", "extra": '{"nats_servers": "nats://x:4222",'}
    monkeypatch.setenv(conn_env_name("bad_extra"), json.dumps(conn))
    with pytest.raises(LiftbridgeConnectionConfigError, match="extra.*not valid JSON"):
        LiftbridgeHook("bad_extra").settings  # noqa: B018


def test_oversized_grpc_message_is_refused_fast(liftbridge_client: LiftbridgeClient, stream_name: str) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    started = time.monotonic()
    with pytest.raises(MessageTooLargeError, match="over gRPC's size limit.*larger than max"):
        liftbridge_client.publish(stream_name, b"x" * BIG_GRPC)
    assert time.monotonic() - started < 10
    assert liftbridge_client.publish(stream_name, b"small").offset == 0  # nothing half-stored


def test_oversized_nats_record_fails_the_operator_and_stores_nothing(
    liftbridge_conn: str, liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    op = LiftbridgePublishOperator(
        task_id="big",
        stream=stream_name,
        records=[b"ok", b"y" * BIG_NATS],
        options=PublishOptions(path="nats"),
        batch_size=10,
    )
    with pytest.raises(LiftbridgePublishNotAcknowledgedError, match="too large"):
        op.execute({})
    assert liftbridge_client.fetch_partition_metadata(stream_name, 0).newest_offset <= 0


def test_oversized_record_is_not_resumed_by_exactly_once(
    liftbridge_client: LiftbridgeClient, stream_name: str, nats_url: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    with LiftbridgeClient(liftbridge_client.brokers, nats_servers=[nats_url]) as over_nats:
        publisher = ExactlyOncePublisher(
            over_nats, stream_name, "big", backoff=0.5, options=PublishOptions(path="nats")
        )
        started = time.monotonic()
        with pytest.raises(ExactlyOncePublishError, match="too large") as info:
            publisher.publish([Record(b"y" * BIG_NATS)])
    assert info.value.result.resumes == 0
    assert time.monotonic() - started < 5


async def test_message_trigger_on_a_missing_partition_ends_with_an_error(
    liftbridge_conn: str, liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    trigger = LiftbridgeMessageTrigger(
        stream=stream_name,
        apply_function="tests.reliability.dag_support.note_and_match",
        partition=7,
        apply_function_kwargs={"target": "x"},
    )
    event = await asyncio.wait_for(trigger.run().__anext__(), 20)
    assert event.payload["status"] == "error"
    assert event.payload["error_type"] == "NoSuchPartitionError"
    assert "7" in event.payload["message"]


async def test_message_trigger_on_a_readonly_partition_without_a_match_ends(
    liftbridge_conn: str, liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    """An impossible target: nothing more can arrive, so the wait ends instead of hanging."""
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"a", b"b"])
    liftbridge_client.set_stream_readonly(stream_name)
    trigger = LiftbridgeMessageTrigger(
        stream=stream_name,
        apply_function="tests.reliability.dag_support.note_and_match",
        apply_function_kwargs={"target": "never"},
    )
    event = await asyncio.wait_for(trigger.run().__anext__(), 20)
    assert event.payload["status"] == "error"
    assert "without a matching message" in event.payload["message"]


def test_exactly_once_to_a_missing_stream_through_the_operator(liftbridge_conn: str, stream_name: str) -> None:
    op = LiftbridgePublishOperator(
        task_id="eo",
        stream=stream_name,
        records=["a"],
        exactly_once=True,
        producer_id="p",
        options=PublishOptions(path="grpc"),
    )
    with pytest.raises(LiftbridgePublishNotAcknowledgedError, match="does not exist"):
        op.execute({})
