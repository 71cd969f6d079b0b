"""The client's own decisions about paused partitions do not trust the metadata's ``paused`` flag
alone: on Liftbridge v1.9 it stays true after a publish (or a ``resume=True`` subscribe) resumed
the partition (``liftbridge-semantics.md``, "A resumed partition still says paused").

Routing and retries are driven step by step by a scripted answerer (``scripted.py``); what the
dev server answers for a resumed or an empty paused partition is checked against it."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import (
    AckPolicy,
    LiftbridgeClient,
    PartitionPausedError,
    StartPosition,
    operations,
)
from airflow_provider_liftbridge.client.effects import OpenStream, Read, RpcFailure, Unary
from airflow_provider_liftbridge.client.routing import ClientCore
from airflow_provider_liftbridge.client.settings import ConnectionSettings
from airflow_provider_liftbridge.client.subscription import subscribe

from .scripted import drive

NOT_LEADER_FPM = RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "The request should be sent to partition leader")
NOT_LEADER_SUB = RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")


def _core() -> ClientCore:
    settings = ConnectionSettings(brokers=("a:1",), timeout=5.0, max_retries=5, ack_policy=AckPolicy.LEADER)
    return ClientCore(settings)


def _metadata(leader: str, port: int) -> api_pb2.FetchMetadataResponse:
    """Metadata of stream ``s``: one partition led by ``leader``, flagged paused (as after a resume)."""
    return api_pb2.FetchMetadataResponse(
        brokers=[api_pb2.Broker(id="b1", host="b", port=1), api_pb2.Broker(id="b2", host="b", port=2)],
        streamMetadata=[
            api_pb2.StreamMetadata(
                name="s",
                subject="s",
                partitions={0: api_pb2.PartitionMetadata(id=0, leader=leader, paused=True, newestOffset=4)},
            )
        ],
    )


def test_a_leader_change_on_a_resumed_partition_is_not_taken_for_a_pause() -> None:
    # b1 led the resumed partition (metadata still says paused) and lost the leadership to b2:
    # its refusal is a leader change, so the call goes to b2, not up as PartitionPausedError.
    leader = {"id": "b1", "port": 1}
    asked: list[str] = []

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return _metadata(leader["id"], leader["port"])
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            asked.append(e.address)
            if e.address == "b:1":
                leader.update(id="b2", port=2)
                raise NOT_LEADER_FPM
            return api_pb2.FetchPartitionMetadataResponse(metadata=_metadata("b2", 2).streamMetadata[0].partitions[0])
        return None

    run = drive(operations.fetch_partition_metadata(_core(), "s", 0), answer)
    assert asked == ["b:1", "b:2"]
    assert (run.result.leader, run.result.paused, run.result.newest_offset) == ("b2", True, 4)


def test_a_leader_that_keeps_refusing_under_the_paused_flag_means_paused() -> None:
    asked: list[str] = []

    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return _metadata("b1", 1)
        if isinstance(e, Unary) and e.method == "FetchPartitionMetadata":
            asked.append(e.address)
            raise NOT_LEADER_FPM
        return None

    with pytest.raises(PartitionPausedError, match="partition 0 is paused"):
        drive(operations.fetch_partition_metadata(_core(), "s", 0), answer)
    assert asked == ["b:1", "b:1"]  # two refusals by the leader metadata names, not max_retries + 1


def test_subscribe_retries_a_not_leader_answer_whatever_the_paused_flag_says() -> None:
    # A paused partition answers Subscribe in words of its own (test_core's status table), so
    # "Server not partition leader" under a stale paused flag is a leader change: subscribe again.
    leader = {"id": "b1", "port": 1}
    opened: list[str] = []
    streams = {
        1: [NOT_LEADER_SUB],
        2: [api_pb2.Message(), api_pb2.Message(offset=4), RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop")],
    }

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            return _metadata(leader["id"], leader["port"])
        if isinstance(e, OpenStream):
            opened.append(e.address)
            leader.update(id="b2", port=2)  # b1 loses the leadership as it refuses
            return len(opened)
        if isinstance(e, Read):
            item = streams[e.handle].pop(0)
            if isinstance(item, RpcFailure):
                raise item
            return item
        return None

    run = drive(subscribe(_core(), "s", start_at=StartPosition.LATEST, stop_at=4), answer)
    assert opened == ["b:1", "b:2"] and [m.offset for m in run.emitted] == [4]


def test_dev_server_resumed_partition_reads_paused_and_still_answers(lb_address: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.pause_stream(stream_name)
        with pytest.raises(PartitionPausedError):
            client.fetch_partition_metadata(stream_name)
        client.publish(stream_name, b"wake")  # resumes it; the flag stays, as on Liftbridge v1.9
        part = client.fetch_partition_metadata(stream_name)
        assert (part.paused, part.newest_offset) == (True, 0)
        assert client.fetch_metadata([stream_name]).streams[stream_name].partitions[0].paused is True
        assert [m.value for m in client.subscribe(stream_name, stop_at=0)] == [b"wake"]


def test_dev_server_empty_paused_partition_subscribe_is_the_paused_error(lb_address: str, stream_name: str) -> None:
    # The handshake arrives, then FAILED_PRECONDITION "commit log was closed" (Liftbridge v1.9).
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.pause_stream(stream_name)
        with pytest.raises(PartitionPausedError, match="resume=True"):
            list(client.subscribe(stream_name))
        client.publish(stream_name, b"wake")
        assert [m.value for m in client.subscribe(stream_name, stop_at=0)] == [b"wake"]
