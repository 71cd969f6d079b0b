"""LiftbridgeHook and LiftbridgeAsyncHook against the dev server (real gRPC, real NATS)."""

from __future__ import annotations

import socket
import threading

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient
from airflow_provider_liftbridge.client.transport.channels import ASYNC_REGISTRY
from airflow_provider_liftbridge.exceptions import LiftbridgeConnectionConfigError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from tests.airflow_support import conn_env_name, liftbridge_conn_json


def free_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def set_conn(monkeypatch: pytest.MonkeyPatch, conn_id: str, host: str, **extra: object) -> None:
    monkeypatch.setenv(conn_env_name(conn_id), liftbridge_conn_json(host, **extra))  # type: ignore[arg-type]


def test_client_is_cached_and_talks_to_the_server(liftbridge_conn: str, stream_name: str) -> None:
    hook = LiftbridgeHook()
    client = hook.client
    assert isinstance(client, LiftbridgeClient)
    assert hook.client is client and hook.get_conn() is client
    client.create_stream(stream_name, stream_name)
    assert stream_name in client.fetch_metadata([stream_name]).streams
    hook.close()
    assert hook.client is not client  # a new one after close
    hook.close()


def test_connection_settings_reach_the_client(liftbridge_conn: str, nats_url: str) -> None:
    hook = LiftbridgeHook(liftbridge_conn)
    assert hook.settings.nats_servers == (nats_url,)
    assert hook.client.nats_servers == (nats_url,)
    hook.close()


def test_test_connection_reports_brokers_that_answered(liftbridge_conn: str) -> None:
    ok, message = LiftbridgeHook().test_connection()
    assert ok, message
    assert message.startswith("1 of 1 configured broker(s) answered")
    assert "the cluster reports 1 broker(s)" in message


def test_test_connection_names_the_dead_broker(monkeypatch: pytest.MonkeyPatch, lb_address: str) -> None:
    dead = f"127.0.0.1:{free_port()}"
    set_conn(monkeypatch, "lb_half", f"{lb_address},{dead}", timeout=2, max_retries=0)
    ok, message = LiftbridgeHook("lb_half").test_connection()
    assert ok, message
    assert message.startswith("1 of 2 configured broker(s) answered")
    assert f"No answer from {dead}: connection refused" in message
    assert message.count(dead) == 1  # the address once, not again inside gRPC's text


def test_test_connection_fails_when_no_broker_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "lb_dead", f"127.0.0.1:{free_port()}", timeout=1)
    ok, message = LiftbridgeHook("lb_dead").test_connection()
    assert not ok
    assert message.startswith("none of the 1 configured broker(s) answered")


def test_test_connection_names_a_bad_field(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "lb_bad", "127.0.0.1", ack_policy="eventually")
    ok, message = LiftbridgeHook("lb_bad").test_connection()
    assert not ok
    assert "'Default ack policy'" in message and "extra." not in message and "'lb_bad'" not in message


def test_bad_connection_fails_when_used(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "lb_noport", "broker:notaport")
    with pytest.raises(LiftbridgeConnectionConfigError, match="field 'Brokers'"):
        _ = LiftbridgeHook("lb_noport").client


async def test_async_hook_reads_the_connection_without_the_database(
    liftbridge_conn: str, lb_address: str, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    hook = LiftbridgeAsyncHook()
    settings = await hook.get_settings()
    assert settings.brokers == (lb_address,)
    client = await hook.get_async_client()
    assert isinstance(client, AsyncLiftbridgeClient)
    assert await hook.get_async_client() is client
    metadata = await client.fetch_metadata([stream_name])
    assert len(metadata.streams[stream_name].partitions) == 2
    await hook.aclose()
    await hook.aclose()


async def test_async_hook_as_context_manager(liftbridge_conn: str) -> None:
    async with LiftbridgeAsyncHook() as client:
        assert len((await client.fetch_metadata()).brokers) == 1


async def test_async_hook_reports_bad_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    set_conn(monkeypatch, "lb_bad_async", "127.0.0.1", tls_ca_file="/nonexistent.pem")
    with pytest.raises(LiftbridgeConnectionConfigError) as info:
        await LiftbridgeAsyncHook("lb_bad_async").get_settings()
    assert info.value.field == "extra.tls_ca_file"


async def test_async_hook_client_waits_in_the_event_loop_on_one_channel(
    liftbridge_conn: str, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """The triggerer's client: subscriptions start no reader thread and share the broker's one channel."""
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish(stream_name, b"x")
    before = ASYNC_REGISTRY.open_channels()
    async with LiftbridgeAsyncHook() as client:
        subs = [client.subscribe(stream_name) for _ in range(5)]
        got = [await anext(s) for s in subs]
        assert [m.value for m in got] == [b"x"] * 5
        assert ASYNC_REGISTRY.open_channels() == before + 1
        assert not [t for t in threading.enumerate() if t.name == "liftbridge-subscribe-reader"]
        for s in subs:
            await s.aclose()
