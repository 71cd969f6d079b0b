"""A subscription across a full-cluster restart, step by step (see ``scripted.py``): the window in
which a restarting Liftbridge cluster lists no streams and answers NOT_FOUND is waited out by a
subscription that had worked, and a stream that is really gone is still reported."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import NoSuchStreamError, operations
from airflow_provider_liftbridge.client.effects import OpenStream, Read, RpcFailure, Unary, Write
from airflow_provider_liftbridge.client.publishing import grpc_engine
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.publishing.single import publish
from airflow_provider_liftbridge.client.subscription import subscribe

from .scripted import Run, drive
from .test_ops_scripted import core, metadata

BROKERS = [api_pb2.Broker(id="b1", host="b", port=2)]
NO_STREAMS = api_pb2.FetchMetadataResponse(brokers=BROKERS)
NOT_FOUND = RpcFailure(grpc.StatusCode.NOT_FOUND, "No such partition")
STOPPED = RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")


def other_stream_only() -> api_pb2.FetchMetadataResponse:
    part = api_pb2.PartitionMetadata(id=0, leader="b1")
    return api_pb2.FetchMetadataResponse(
        brokers=BROKERS, streamMetadata=[api_pb2.StreamMetadata(name="other", subject="o", partitions={0: part})]
    )


class Cluster:
    """Answers a subscription to ``s``: offsets 0 and 1, then the brokers go away; ``after``
    is the sequence of metadata answers the restarting cluster gives, the last one repeated."""

    def __init__(self, after: list[api_pb2.FetchMetadataResponse]) -> None:
        self.after = after
        self.down = False
        self.subscribes: list[Any] = []
        self.metadata_asked: list[list[str]] = []

    def answer(self, e: Any) -> Any:
        if isinstance(e, Unary):
            self.metadata_asked.append(list(e.request.streams))
            if not self.down:
                return metadata()
            return self.after.pop(0) if len(self.after) > 1 else self.after[0]
        if isinstance(e, OpenStream):
            self.subscribes.append(e.request)
            if len(self.subscribes) == 1:
                return iter([api_pb2.Message(), api_pb2.Message(offset=0), api_pb2.Message(offset=1), "down"])
            if self.after[0] is not NO_STREAMS and self.after[0].streamMetadata[0].name == "s":
                return iter([api_pb2.Message(), api_pb2.Message(offset=2), STOPPED])
            return iter([NOT_FOUND])
        if isinstance(e, Read):
            item = next(e.handle)
            if item == "down":
                self.down = True
                raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "broker stopped")
            if isinstance(item, RpcFailure):
                raise item
            return item
        return None


def test_a_subscription_waits_out_a_restart_that_lists_no_streams_for_a_while() -> None:
    cluster = Cluster([NO_STREAMS, NO_STREAMS, NO_STREAMS, metadata()])

    run = drive(subscribe(core(), "s", stop_at=2), cluster.answer)
    assert [m.offset for m in run.emitted] == [0, 1, 2]
    assert cluster.subscribes[-1].startOffset == 2  # resumed after the last delivered offset
    assert [] in cluster.metadata_asked  # the missing stream was checked against every stream's metadata


def test_a_stream_deleted_while_subscribed_is_reported_once_a_cluster_with_leaders_confirms_it() -> None:
    cluster = Cluster([other_stream_only()])

    run = Run()
    with pytest.raises(NoSuchStreamError, match="'s'"):
        drive(subscribe(core(), "s"), cluster.answer, run=run)
    assert [m.offset for m in run.emitted] == [0, 1]
    assert len(cluster.subscribes) == 1  # believed at the first confirmation, no further tries


def test_a_stream_never_seen_is_reported_at_once() -> None:
    def answer(e: Any) -> Any:
        return NO_STREAMS if isinstance(e, Unary) else None

    run = Run()
    with pytest.raises(NoSuchStreamError):
        drive(subscribe(core(), "s"), answer, run=run)
    assert not any(isinstance(e, OpenStream) for e in run.effects)


def _publisher_cluster(refusals: int, after: list[api_pb2.FetchMetadataResponse]) -> tuple[list[str], Any]:
    calls: list[str] = []

    def answer(e: Any) -> Any:
        if not isinstance(e, Unary):
            return None
        calls.append(e.method)
        if e.method == "FetchMetadata":
            return after.pop(0) if len(after) > 1 else after[0]
        if calls.count("Publish") <= refusals:
            raise RpcFailure(grpc.StatusCode.NOT_FOUND, "no such stream: s")
        return api_pb2.PublishResponse(ack=api_pb2.Ack(stream="s", partitionSubject="s", msgSubject="s", offset=7))

    return calls, answer


def test_a_publish_refused_with_no_such_stream_right_after_a_restart_is_retried() -> None:
    c = core()
    calls, answer = _publisher_cluster(2, [metadata(), NO_STREAMS, metadata()])
    drive(operations.fetch_metadata(c, ["s"]), answer)  # the client has seen the stream
    run = drive(publish(c, "s", b"x"), answer)
    assert run.result.offset == 7
    assert calls.count("Publish") == 3


def test_a_publish_to_a_stream_never_seen_or_confirmed_missing_fails_at_once() -> None:
    calls, answer = _publisher_cluster(99, [other_stream_only()])
    with pytest.raises(NoSuchStreamError):
        drive(publish(core(), "s", b"x"), answer)
    assert calls == ["Publish"]
    c = core()
    calls, answer = _publisher_cluster(99, [metadata(), other_stream_only()])
    drive(operations.fetch_metadata(c, ["s"]), answer)
    with pytest.raises(NoSuchStreamError):
        drive(publish(c, "s", b"x"), answer)
    assert calls == ["FetchMetadata", "Publish", "FetchMetadata"]


def test_publish_many_sends_again_records_refused_with_no_such_stream_right_after_a_restart() -> None:
    c = core()
    answers = [metadata(), NO_STREAMS, metadata()]
    written: list[str] = []
    refusing = {"left": 2}

    def answer(e: Any) -> Any:
        if isinstance(e, Unary):
            return answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(e, OpenStream):
            return "h"
        if isinstance(e, Write):
            written.append(e.request.correlationId)
            return None
        if isinstance(e, Read):
            cid = written[len(written) - 1]
            if refusing["left"]:
                refusing["left"] -= 1
                error = api_pb2.PublishAsyncError(code=api_pb2.PublishAsyncError.NOT_FOUND, message="no such stream: s")
                return api_pb2.PublishResponse(correlationId=cid, asyncError=error)
            return api_pb2.PublishResponse(correlationId=cid, ack=api_pb2.Ack(stream="s", correlationId=cid, offset=5))
        return None

    drive(operations.fetch_metadata(c, ["s"]), answer)  # the client has seen the stream
    run = drive(grpc_engine.send_over_grpc(c, "s", [b"x"], PublishOptions(window=1)), answer)
    assert [a.offset for a in run.result] == [5]
    assert len(written) == 3  # refused twice (not stored), sent a third time
