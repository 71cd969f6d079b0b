"""Subscribe: handshake, start and stop positions, delivered fields, and how subscriptions end."""

from __future__ import annotations

import time

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc

from .helpers import TIMEOUT, create, partition_meta, publish, rpc_error, subscribe, subscribe_while

Stub = api_pb2_grpc.APIStub


def _filled(stub: Stub, name: str, n: int = 5) -> list[int]:
    """Create ``name`` with ``n`` messages; return their reception timestamps."""
    create(stub, name)
    return [publish(stub, name, b"m%d" % i).ack.receptionTimestamp for i in range(n)]


def test_every_subscription_starts_with_an_empty_handshake(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 2)
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), count=2)
    assert sub.messages[0].SerializeToString() == b""
    assert sub.offsets == [0, 1]


def test_missing_stream_or_partition_is_not_found_without_handshake(stub: Stub, stream_name: str) -> None:
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name))
    assert (sub.code, sub.details, sub.messages) == (grpc.StatusCode.NOT_FOUND, "No such partition", [])
    create(stub, stream_name)
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, partition=3))
    assert (sub.code, sub.messages) == (grpc.StatusCode.NOT_FOUND, [])


def test_start_positions(stub: Stub, stream_name: str) -> None:
    ts = _filled(stub, stream_name, 5)

    def first(**kw: object) -> int:
        return subscribe(stub, pb.SubscribeRequest(stream=stream_name, **kw), count=1).offsets[0]  # type: ignore[arg-type]

    assert first(startPosition=pb.EARLIEST) == 0
    assert first(startPosition=pb.LATEST) == 4
    assert first(startPosition=pb.OFFSET, startOffset=3) == 3
    assert first(startPosition=pb.OFFSET, startOffset=-7) == 0
    assert first(startPosition=pb.TIMESTAMP, startTimestamp=ts[2]) == 2
    assert first(startPosition=pb.TIMESTAMP, startTimestamp=ts[2] + 1) == 3
    # NEW_ONLY waits for the next message.
    sub = subscribe_while(
        stub, pb.SubscribeRequest(stream=stream_name), lambda: publish(stub, stream_name, b"new"), count=1
    )
    assert sub.offsets == [5] and sub.data[0].value == b"new"


def test_delivered_message_fields(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    publish(
        stub,
        stream_name,
        b"val",
        key=b"key",
        partition=1,
        headers={"h": b"1"},
        ackInbox="x.y",
        correlationId="cid",
        ackPolicy=pb.ALL,
    )
    msg = subscribe(
        stub, pb.SubscribeRequest(stream=stream_name, partition=1, startPosition=pb.EARLIEST), count=1
    ).data[0]
    assert (msg.offset, msg.key, msg.value, msg.stream, msg.partition) == (0, b"key", b"val", stream_name, 1)
    assert msg.subject == f"{stream_name}.1" and msg.replySubject == ""
    assert dict(msg.headers) == {"h": b"1", "subject": f"{stream_name}.1".encode(), "reply": b""}
    assert (msg.ackInbox, msg.correlationId, msg.ackPolicy) == ("", "", pb.LEADER)
    assert abs(msg.timestamp - time.time_ns()) < 60 * 10**9


def test_stop_offset_and_stop_latest(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 5)
    sub = subscribe(
        stub,
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_OFFSET, stopOffset=2),
    )
    assert sub.offsets == [0, 1, 2]
    assert (sub.code, sub.details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")
    sub = subscribe(
        stub,
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.OFFSET, startOffset=3, stopPosition=pb.STOP_LATEST),
    )
    assert sub.offsets == [3, 4] and sub.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_stop_timestamp(stub: Stub, stream_name: str) -> None:
    ts = _filled(stub, stream_name, 5)
    req = pb.SubscribeRequest(
        stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_TIMESTAMP, stopTimestamp=ts[1]
    )
    sub = subscribe(stub, req)
    assert sub.offsets == [0, 1] and sub.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_stop_offset_in_the_future_waits_for_it(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 1)
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_OFFSET, stopOffset=2)
    sub = subscribe_while(stub, req, lambda: [publish(stub, stream_name, v) for v in (b"a", b"b")], settle=0.2)
    assert sub.offsets == [0, 1, 2] and sub.details == "Stop offset reached"


def test_stop_latest_on_empty_and_stop_before_start_fail_without_handshake(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, stopPosition=pb.STOP_LATEST))
    assert (sub.code, sub.details, sub.messages) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "Stream is empty", [])
    for i in range(3):
        publish(stub, stream_name, b"%d" % i)
    req = pb.SubscribeRequest(
        stream=stream_name, startPosition=pb.OFFSET, startOffset=2, stopPosition=pb.STOP_OFFSET, stopOffset=1
    )
    sub = subscribe(stub, req)
    assert (sub.code, sub.messages) == (grpc.StatusCode.INVALID_ARGUMENT, [])


def test_subscribers_see_committed_messages_in_order_live(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    acked: list[int] = []
    sub = subscribe_while(
        stub,
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST),
        lambda: acked.extend(publish(stub, stream_name, b"%d" % i).ack.offset for i in range(50)),
        count=50,
        settle=0,
        timeout=25.0,  # open over all 50 publishes: 3.7 s of the old 5 s under --busy, 0.06 s quiet
    )
    assert sub.offsets == acked == list(range(50))
    assert partition_meta(stub, stream_name).highWatermark == 49


def test_pause_while_subscribed_is_failed_precondition(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 1)
    sub = subscribe_while(
        stub,
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST),
        lambda: stub.PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT),
    )
    assert sub.offsets == [0] and sub.code == grpc.StatusCode.FAILED_PRECONDITION


def test_subscribe_to_paused_partition_needs_resume(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 2)
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT)
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST))
    # As Liftbridge v1.9: the call itself fails, no handshake (the paused partition's log is closed).
    assert (sub.messages, sub.code, sub.details) == (
        [],
        grpc.StatusCode.INTERNAL,
        "Failed to create stream reader: segment has been closed",
    )
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, resume=True), count=2)
    assert sub.offsets == [0, 1]
    # Resumed: the leader answers FetchPartitionMetadata again, and, as Liftbridge v1.9, both
    # metadata calls still say paused (the saved flag is never cleared).
    resumed = partition_meta(stub, stream_name)
    assert (resumed.newestOffset, resumed.paused) == (1, True)
    meta = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
    assert meta.streamMetadata[0].partitions[0].paused is True


def test_subscribe_to_an_empty_paused_partition_is_accepted_then_ends(stub: Stub, stream_name: str) -> None:
    # Liftbridge v1.9, measured: an empty paused partition accepts the subscription (handshake),
    # then ends it with FAILED_PRECONDITION; its reader opened no segment of the closed log.
    create(stub, stream_name)
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT)
    for position in (pb.EARLIEST, pb.LATEST, pb.NEW_ONLY):
        sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=position))
        assert (sub.handshake, sub.data, sub.code, sub.details) == (
            True,
            [],
            grpc.StatusCode.FAILED_PRECONDITION,
            "commit log was closed",
        ), position
    # Still paused: nothing above resumed it (FetchPartitionMetadata is refused while paused).
    assert rpc_error(partition_meta, stub, stream_name).code() == grpc.StatusCode.FAILED_PRECONDITION


def test_paused_partition_with_messages_fails_at_once_unless_reading_past_them(stub: Stub, stream_name: str) -> None:
    # A start at a stored offset fails before the handshake (measured); NEW_ONLY starts past the
    # high watermark, which Liftbridge's reader treats like an empty log (server/commitlog/reader.go).
    _filled(stub, stream_name, 3)
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT)
    for req in (
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.LATEST),
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.OFFSET, startOffset=2),
    ):
        sub = subscribe(stub, req)
        assert (sub.messages, sub.code) == ([], grpc.StatusCode.INTERNAL), req
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.NEW_ONLY))
    assert (sub.handshake, sub.data, sub.code) == (True, [], grpc.StatusCode.FAILED_PRECONDITION)


def test_delete_while_subscribed_is_not_found(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 1)
    sub = subscribe_while(
        stub,
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST),
        lambda: stub.DeleteStream(pb.DeleteStreamRequest(name=stream_name), timeout=TIMEOUT),
    )
    assert sub.offsets == [0] and sub.code == grpc.StatusCode.NOT_FOUND


def test_readonly_partition_ends_subscriptions(stub: Stub, stream_name: str) -> None:
    _filled(stub, stream_name, 3)
    # A subscriber waiting live when the partition turns read-only.
    sub = subscribe_while(
        stub,
        pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST),
        lambda: stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=stream_name, readonly=True), timeout=TIMEOUT),
    )
    assert sub.offsets == [0, 1, 2]
    assert (sub.code, sub.details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")
    # A new subscriber reads to the end and stops there.
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.OFFSET, startOffset=1))
    assert sub.offsets == [1, 2] and (sub.code, sub.details) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "Stop offset reached",
    )


def test_empty_readonly_partition(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name=stream_name, readonly=True), timeout=TIMEOUT)
    sub = subscribe(stub, pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST))
    assert sub.handshake and (sub.code, sub.details) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "End of readonly partition",
    )
