"""Publish, PublishAsync and PublishToSubject: acks, ack policies, deadlines, OCC, pause and read-only."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import DevServer

from .helpers import TIMEOUT, create, partition_meta, publish, rpc_error, subscribe

Stub = api_pb2_grpc.APIStub


def test_leader_and_all_acks_carry_every_field(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    before = time.time_ns()
    for policy in (pb.LEADER, pb.ALL):
        resp = publish(stub, stream_name, b"v", partition=1, ackPolicy=policy, correlationId="cid-1")
        ack = resp.ack
        assert resp.correlationId == ""  # only PublishAsync sets the top-level correlation id
        assert ack.stream == stream_name
        assert ack.partitionSubject == stream_name
        assert ack.msgSubject == f"{stream_name}.1"
        assert ack.correlationId == "cid-1"
        assert ack.ackPolicy == policy
        assert ack.ackInbox.startswith("liftbridge-default.ack.")
        assert ack.ackError == pb.Ack.OK
        assert before <= ack.receptionTimestamp <= ack.commitTimestamp <= time.time_ns()
    assert publish(stub, stream_name, b"x", ackInbox="my.inbox").ack.ackInbox == "my.inbox"


def test_offsets_grow_by_one_from_zero(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    assert [publish(stub, stream_name, b"%d" % i).ack.offset for i in range(4)] == [0, 1, 2, 3]


def test_none_policy_and_missing_deadline_return_no_ack_but_store(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    assert not publish(stub, stream_name, b"none", ackPolicy=pb.NONE).HasField("ack")
    resp = stub.Publish(pb.PublishRequest(stream=stream_name, value=b"no-deadline"))  # no timeout
    assert not resp.HasField("ack")
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), count=2)
    assert [m.value for m in sub.data] == [b"none", b"no-deadline"]


def test_publish_errors(stub: Stub, stream_name: str) -> None:
    err = rpc_error(publish, stub, stream_name, b"v")
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, f"no such stream: {stream_name}")
    create(stub, stream_name)
    err = rpc_error(publish, stub, stream_name, b"v", partition=9)
    assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "no such partition: 9")
    err = rpc_error(publish, stub, "", b"v")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_expected_offset_is_ignored_without_occ(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    publish(stub, stream_name, b"a")
    assert publish(stub, stream_name, b"b", expectedOffset=57).ack.offset == 1


def test_optimistic_concurrency_control(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, optimisticConcurrencyControl=pb.NullableBool(value=True))
    assert publish(stub, stream_name, b"first", expectedOffset=0).ack.offset == 0
    assert publish(stub, stream_name, b"second", expectedOffset=1).ack.offset == 1
    err = rpc_error(publish, stub, stream_name, b"stale", expectedOffset=1)
    assert (err.code(), err.details()) == (grpc.StatusCode.UNKNOWN, "incorrect expected offset")
    # Unset (0) on a non-empty partition is a mismatch; -1 turns the check off.
    assert rpc_error(publish, stub, stream_name, b"unset").code() == grpc.StatusCode.UNKNOWN
    assert publish(stub, stream_name, b"any", expectedOffset=-1).ack.offset == 2
    err = rpc_error(publish, stub, stream_name, b"none", ackPolicy=pb.NONE, expectedOffset=3)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert partition_meta(stub, stream_name).newestOffset == 2


def test_publish_to_readonly_partition_is_failed_precondition(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    stub.SetStreamReadonly(
        pb.SetStreamReadonlyRequest(name=stream_name, partitions=[1], readonly=True), timeout=TIMEOUT
    )
    err = rpc_error(publish, stub, stream_name, b"v", partition=1)
    assert (err.code(), err.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "readonly partition: 1")
    assert publish(stub, stream_name, b"v", partition=0).ack.offset == 0  # read-only is per partition
    stub.SetStreamReadonly(
        pb.SetStreamReadonlyRequest(name=stream_name, partitions=[1], readonly=False), timeout=TIMEOUT
    )
    assert publish(stub, stream_name, b"v", partition=1).ack.offset == 0


def test_publish_resumes_its_own_partition_or_all_with_resume_all(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT)
    publish(stub, stream_name, b"wake", partition=0)
    # Resumed: the leader answers for partition 0 again, still paused for partition 1.
    assert partition_meta(stub, stream_name, 0).newestOffset == 0
    assert rpc_error(partition_meta, stub, stream_name, 1).code() == grpc.StatusCode.FAILED_PRECONDITION
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name, resumeAll=True), timeout=TIMEOUT)
    publish(stub, stream_name, b"wake-all", partition=0)
    assert partition_meta(stub, stream_name, 1).newestOffset == -1  # resumed with its sibling, still empty


def test_both_metadata_calls_keep_paused_after_a_publish_resumed_the_partition(stub: Stub, stream_name: str) -> None:
    # The real server's behaviour (liftbridge-semantics.md, "Pause"): the flag is sticky in
    # FetchPartitionMetadata as in FetchMetadata; a partition never paused reads False.
    create(stub, stream_name, partitions=2)
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name, partitions=[0]), timeout=TIMEOUT)
    assert publish(stub, stream_name, b"wake", partition=0).ack.offset == 0
    resumed = partition_meta(stub, stream_name, 0)
    assert (resumed.paused, resumed.newestOffset) == (True, 0)
    assert partition_meta(stub, stream_name, 1).paused is False
    meta = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
    assert [meta.streamMetadata[0].partitions[p].paused for p in (0, 1)] == [True, False]


def test_publish_deadline_exceeded_when_the_ack_is_late() -> None:
    """Fault injection: the server's flush is held back, so the ack cannot come before the deadline."""
    with DevServer() as srv:
        stub = api_pb2_grpc.APIStub(grpc.insecure_channel(srv.address))
        create(stub, "late")
        store = srv._running_core().store
        held = store.mark_dirty
        store.mark_dirty = lambda partition: None  # type: ignore[method-assign]  # writes never get flushed
        try:
            err = rpc_error(stub.Publish, pb.PublishRequest(stream="late", value=b"v"), timeout=0.3)
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            store.mark_dirty = held  # type: ignore[method-assign]


def _requests(reqs: list[pb.PublishRequest]) -> Iterator[pb.PublishRequest]:
    yield from reqs


def test_publish_async_correlates_acks_and_errors(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    stub.SetStreamReadonly(
        pb.SetStreamReadonlyRequest(name=stream_name, partitions=[1], readonly=True), timeout=TIMEOUT
    )
    reqs = [
        pb.PublishRequest(stream=stream_name, value=b"%d" % i, correlationId=f"ok-{i}", ackInbox="mine")
        for i in range(5)
    ]
    reqs += [
        pb.PublishRequest(stream=stream_name, value=b"n", correlationId="none", ackPolicy=pb.NONE),
        pb.PublishRequest(stream="missing-" + stream_name, value=b"x", correlationId="missing"),
        pb.PublishRequest(stream=stream_name, partition=7, value=b"x", correlationId="badpart"),
        pb.PublishRequest(stream=stream_name, partition=1, value=b"x", correlationId="ro"),
    ]
    responses = {r.correlationId: r for r in stub.PublishAsync(_requests(reqs), timeout=TIMEOUT)}
    assert set(responses) == {f"ok-{i}" for i in range(5)} | {"missing", "badpart", "ro"}  # NONE gets no response
    offsets = sorted(responses[f"ok-{i}"].ack.offset for i in range(5))
    assert offsets == [0, 1, 2, 3, 4]
    ok = responses["ok-3"]
    assert ok.ack.correlationId == "ok-3" and not ok.HasField("asyncError")
    assert ok.ack.ackInbox != "mine"  # replaced by the session's inbox
    assert responses["missing"].asyncError.code == pb.PublishAsyncError.NOT_FOUND
    assert responses["badpart"].asyncError.code == pb.PublishAsyncError.NOT_FOUND
    assert responses["ro"].asyncError.code == pb.PublishAsyncError.READONLY
    assert responses["ro"].HasField("ack") and responses["ro"].ack.ByteSize() == 0  # an empty ack, as upstream
    assert partition_meta(stub, stream_name).newestOffset == 5


def test_publish_async_occ_errors(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, optimisticConcurrencyControl=pb.NullableBool(value=True))
    reqs = [
        pb.PublishRequest(stream=stream_name, value=b"a", correlationId="a", expectedOffset=0),
        pb.PublishRequest(stream=stream_name, value=b"b", correlationId="b", expectedOffset=0),
        pb.PublishRequest(stream=stream_name, value=b"c", correlationId="c", ackPolicy=pb.NONE),
    ]
    responses = {r.correlationId: r for r in stub.PublishAsync(_requests(reqs), timeout=TIMEOUT)}
    assert responses["a"].ack.offset == 0
    assert responses["b"].asyncError.code == pb.PublishAsyncError.INCORRECT_OFFSET
    assert responses["c"].asyncError.code == pb.PublishAsyncError.BAD_REQUEST


def test_publish_async_many_messages_in_order(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    reqs = [pb.PublishRequest(stream=stream_name, value=b"x" * 100, correlationId=str(i)) for i in range(2000)]
    got = [(int(r.correlationId), r.ack.offset) for r in stub.PublishAsync(_requests(reqs), timeout=30)]
    assert sorted(got) == [(i, i) for i in range(2000)]


def test_publish_to_subject(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    req = pb.PublishToSubjectRequest(subject=f"{stream_name}.1", value=b"v", key=b"k", correlationId="c9")
    ack = stub.PublishToSubject(req, timeout=TIMEOUT).ack
    assert (ack.stream, ack.msgSubject, ack.partitionSubject, ack.offset) == (
        stream_name,
        f"{stream_name}.1",
        stream_name,
        0,
    )
    assert ack.correlationId == "c9"
    none = pb.PublishToSubjectRequest(subject=stream_name, value=b"n", ackPolicy=pb.NONE)
    assert not stub.PublishToSubject(none, timeout=TIMEOUT).HasField("ack")
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, partition=1, startPosition=pb.EARLIEST), count=1)
    assert (sub.data[0].key, sub.data[0].value) == (b"k", b"v")


def test_publish_to_subject_nobody_listens_on_times_out(stub: Stub, stream_name: str) -> None:
    req = pb.PublishToSubjectRequest(subject=f"nobody.{stream_name}", value=b"v")
    assert rpc_error(stub.PublishToSubject, req, timeout=0.5).code() == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("policy", [pb.LEADER, pb.ALL])
def test_ack_only_after_the_record_is_readable(stub: Stub, stream_name: str, policy: int) -> None:
    create(stub, stream_name)
    ack = publish(stub, stream_name, b"v", ackPolicy=policy).ack
    meta = partition_meta(stub, stream_name)
    assert meta.highWatermark >= ack.offset and meta.newestOffset >= ack.offset
