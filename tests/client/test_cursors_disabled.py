"""A cluster with cursors off (stock Liftbridge's default, ``cursors.stream.partitions: 0``): the
dev server's ``cursors=False`` answers SetCursor/FetchCursor as Liftbridge does (INTERNAL "Cursors
stream does not exist"); the client turns it into a typed, non-retried CursorsDisabledError and
exactly-once publishing stops at once instead of resuming."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2, api_pb2_grpc
from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, CursorsDisabledError, LiftbridgeClient
from airflow_provider_liftbridge.client.effects import RpcFailure
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher, ExactlyOncePublishError
from airflow_provider_liftbridge.client.retry import is_transient
from airflow_provider_liftbridge.devserver import DevServer


@pytest.fixture(scope="module")
def no_cursors() -> Iterator[DevServer]:
    with DevServer(brokers=1, cursors=False) as server:
        yield server


def test_the_dev_server_answers_like_stock_liftbridge(no_cursors: DevServer) -> None:
    with grpc.insecure_channel(no_cursors.address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.FetchCursor(api_pb2.FetchCursorRequest(cursorId="c", stream="s", partition=0), timeout=5)
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == "Cursors stream does not exist"
        with pytest.raises(grpc.RpcError) as empty:  # the request's fields are checked first, as upstream
            stub.SetCursor(api_pb2.SetCursorRequest(cursorId="", stream="s"), timeout=5)
        assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_cursor_calls_raise_a_typed_error_naming_the_setting(no_cursors: DevServer) -> None:
    with LiftbridgeClient(no_cursors.address, max_retries=5) as client:
        for call in (lambda: client.fetch_cursor("c", "s", 0), lambda: client.set_cursor("c", "s", 0, 3)):
            with pytest.raises(CursorsDisabledError) as info:
                call()
            text = str(info.value)
            assert "cursors are disabled" in text
            assert "cursors.stream.partitions" in text and "cursors.stream.replication.factor" in text


async def test_async_client_raises_it_too(no_cursors: DevServer) -> None:
    async with AsyncLiftbridgeClient(no_cursors.address) as client:
        with pytest.raises(CursorsDisabledError, match="cursors.stream.partitions"):
            await client.fetch_cursor("c", "s", 0)


def test_it_is_not_retried() -> None:
    # One round trip: the status that means "cursors off" is not one a retry could change, while
    # any other INTERNAL (a broker dying mid-call) still is.
    assert not is_transient(RpcFailure(grpc.StatusCode.INTERNAL, "Cursors stream does not exist"))
    assert is_transient(RpcFailure(grpc.StatusCode.INTERNAL, "Internal error from Core"))


def test_exactly_once_stops_at_once(no_cursors: DevServer, stream_name: str) -> None:
    with LiftbridgeClient(no_cursors.address) as client:
        client.create_stream(stream_name, stream_name)
        publisher = ExactlyOncePublisher(client, stream_name, "p1")
        with pytest.raises(ExactlyOncePublishError) as info:
            publisher.publish([b"a", b"b"])
        assert isinstance(info.value.__cause__, CursorsDisabledError)
        assert info.value.result.resumes == 0
        text = str(info.value)
        assert "cursors.stream.partitions" in text
        assert "once that is fixed, publishing again" in text and ".." not in text
        assert client.fetch_partition_metadata(stream_name, 0).newest_offset == -1  # nothing written
