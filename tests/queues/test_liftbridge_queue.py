"""The liftbridge queue provider: discovered by Airflow from the provider metadata, and
``MessageQueueTrigger`` (common.messaging) resolving ``liftbridge://`` URIs and the ``liftbridge``
scheme to LiftbridgeEventTrigger, which then fires against the dev server."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.queues.liftbridge import (
    LiftbridgeMessageQueueProvider,
    LiftbridgeQueueUriError,
    parse_queue_uri,
)
from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger

CLASSPATH = "airflow_provider_liftbridge.triggers.event.LiftbridgeEventTrigger"
PROVIDER = "airflow_provider_liftbridge.queues.liftbridge.LiftbridgeMessageQueueProvider"
MATCHER = "airflow_provider_liftbridge.sensors.matchers.value_contains"


def message_queue_trigger(**kwargs: Any) -> Any:
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # common.messaging deprecates queue= in favour of scheme=
        return MessageQueueTrigger(**kwargs)


def test_airflow_discovers_the_queue_provider() -> None:
    from airflow.providers.common.messaging.triggers import msg_queue
    from airflow.providers_manager import ProvidersManager

    assert PROVIDER in ProvidersManager().queue_class_names
    ours = [p for p in msg_queue.MESSAGE_QUEUE_PROVIDERS if isinstance(p, LiftbridgeMessageQueueProvider)]
    assert len(ours) == 1
    assert ours[0].trigger_class() is LiftbridgeEventTrigger
    # Only liftbridge:// URIs and the liftbridge scheme: no collision with other providers.
    assert ours[0].queue_matches("liftbridge://h:1/s") and ours[0].queue_matches("LIFTBRIDGE:///s")
    assert not ours[0].queue_matches("kafka://h:9092/topic")
    assert ours[0].scheme_matches("liftbridge") and not ours[0].scheme_matches("kafka")


def test_queue_uri_resolves_to_the_event_trigger() -> None:
    trigger = message_queue_trigger(
        queue="liftbridge://10.0.0.1:9292,10.0.0.2:9292/orders?partition=2&start_at=earliest&cursor_id=c1",
        apply_function=MATCHER,
        apply_function_args=["ready"],
    )
    assert trigger.serialize() == (
        CLASSPATH,
        {
            "stream": "orders",
            "partition": 2,
            "apply_function": MATCHER,
            "apply_function_args": ["ready"],
            "apply_function_kwargs": {},
            "cursor_id": "c1",
            "start_at": "earliest",
            "brokers": "10.0.0.1:9292,10.0.0.2:9292",
            "poll_interval": 5.0,
            "liftbridge_conn_id": "liftbridge_default",
            "max_in_flight": 256,
            "commit_interval": 0.5,
            "commit_every": 100,
        },
    )


def test_scheme_form_passes_the_keyword_arguments() -> None:
    trigger = message_queue_trigger(scheme="liftbridge", stream="orders", partition=1, liftbridge_conn_id="lb")
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    assert (kwargs["stream"], kwargs["partition"], kwargs["liftbridge_conn_id"], kwargs["brokers"]) == (
        "orders",
        1,
        "lb",
        None,
    )


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("liftbridge://127.0.0.1:9292/orders", {"brokers": "127.0.0.1:9292", "stream": "orders"}),
        ("liftbridge:///orders?conn_id=lb_prod", {"stream": "orders", "liftbridge_conn_id": "lb_prod"}),
        ("liftbridge://h:1/a%20b?partition=0", {"brokers": "h:1", "stream": "a b", "partition": 0}),
        ("liftbridge://[::1]:9292/s?poll_interval=0.5", {"brokers": "[::1]:9292", "stream": "s", "poll_interval": 0.5}),
        ("liftbridge://h:1/s?start_at=new_only", {"brokers": "h:1", "stream": "s", "start_at": "new_only"}),
    ],
)
def test_parse_queue_uri(uri: str, expected: dict[str, Any]) -> None:
    assert parse_queue_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("kafka://h:1/s", "scheme must be 'liftbridge'"),
        ("liftbridge://h:1", "stream name is missing"),
        ("liftbridge://h:1/", "stream name is missing"),
        ("liftbridge://h:1/a/b", "must be one stream name"),
        ("liftbridge://h/s", "broker 'h' is not HOST:PORT"),
        ("liftbridge://h:99999/s", "port from 1 to 65535"),
        ("liftbridge://h:1,:2/s", "broker ':2'"),
        ("liftbridge://user:pw@h:1/s", "credentials"),
        ("liftbridge://h:1/s?partiton=1", "unknown parameter 'partiton'"),
        ("liftbridge://h:1/s?partition=1&partition=2", "given once"),
        ("liftbridge://h:1/s?partition=", "given once, with a value"),
        ("liftbridge://h:1/s?partition=one", "partition 'one' is not a partition number"),
        ("liftbridge://h:1/s?poll_interval=soon", "poll_interval 'soon' is not a number"),
        ("liftbridge://h:1/s?partition", "is not name=value"),
        ("liftbridge://h:1/s#x", "fragment"),
    ],
)
def test_malformed_uris_say_what_is_wrong(uri: str, words: str) -> None:
    with pytest.raises(LiftbridgeQueueUriError, match=words) as caught:
        parse_queue_uri(uri)
    assert "expected liftbridge://HOST:PORT" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_malformed_uri_fails_when_the_dag_is_parsed() -> None:
    # MessageQueueTrigger resolves the provider lazily; serialize() is what DAG parsing calls.
    trigger = message_queue_trigger(queue="liftbridge://h:1/s?partition=x")
    with pytest.raises(LiftbridgeQueueUriError, match="not a partition number"):
        trigger.serialize()
    bad_argument = message_queue_trigger(queue="liftbridge://h:1/s", start_at="latest")
    with pytest.raises(ValueError, match="cannot start a watcher"):
        bad_argument.serialize()


def test_uri_and_keyword_arguments_must_agree() -> None:
    same = message_queue_trigger(queue="liftbridge://h:1/s?partition=3", partition=3)
    assert same.serialize()[1]["partition"] == 3
    clash = message_queue_trigger(queue="liftbridge://h:1/s?partition=3", partition=4)
    with pytest.raises(LiftbridgeQueueUriError, match="partition=3 in the URI contradicts"):
        clash.serialize()


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("liftbridge_conn")
async def test_message_queue_trigger_fires_against_the_dev_server(
    lb_address: str, liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    for value in (b"pending", b"ready", b"pending", b"ready again"):
        liftbridge_client.publish(stream_name, value)
    trigger = message_queue_trigger(
        queue=f"liftbridge://{lb_address}/{stream_name}?start_at=earliest",
        apply_function=MATCHER,
        apply_function_args=["ready"],
    )
    events = trigger.run()
    try:
        first = await asyncio.wait_for(events.__anext__(), 10)
        second = await asyncio.wait_for(events.__anext__(), 10)
    finally:
        await events.aclose()
    assert [first.payload["message"]["offset"], second.payload["message"]["offset"]] == [1, 3]
    assert second.payload["message"]["value_text"] == "ready again"
