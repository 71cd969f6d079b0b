"""Retention as Liftbridge v1.9.0-72's delete cleaner applies it: on the stream's cleaner interval,
whole segments only, never the active one (``server/commitlog/delete_cleaner.go``). Messages of
1,000 bytes in segments of at most 2,500 bytes make three messages a segment: a segment rolls
before the write that finds it full, and the cleaner rolls a full active segment too."""

from __future__ import annotations

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from tests import margins

from .helpers import TIMEOUT, create, partition_meta, publish, subscribe

Stub = api_pb2_grpc.APIStub

BIG = b"x" * 1000
#: Three messages of :data:`BIG` a segment (two stay below it, three reach it).
SEGMENT = pb.NullableInt64(value=2500)
#: A cleaner on every tick of the dev server (0.5 s; a real Liftbridge runs it every 0.1 s).
CLEANER = pb.NullableInt64(value=100)
#: Long enough for a busy machine: a clean takes two cleaner runs at most (a roll, then the clean).
WAIT = 30.0


def _earliest(stub: Stub, stream: str, partition: int = 0) -> int:
    req = pb.SubscribeRequest(stream=stream, partition=partition, startPosition=pb.EARLIEST)
    return subscribe(stub, req, count=1).offsets[0]


def _wait_earliest(stub: Stub, stream: str, offset: int, partition: int = 0) -> None:
    margins.wait_until(
        lambda: _earliest(stub, stream, partition) == offset, WAIT, f"EARLIEST of {stream} at {offset}", interval=0.1
    )


def _publish_big(stub: Stub, stream: str, count: int, partition: int = 0) -> None:
    for i in range(count):
        publish(stub, stream, BIG + b"%d" % i, partition=partition)


def _emptied(stub: Stub, stream: str) -> None:
    """Create ``stream`` keeping two messages, publish six (two full segments) and wait until
    retention removed them all (the dev server's sign: its first timestamp is zeroed)."""
    create(
        stub, stream, retentionMaxMessages=pb.NullableInt64(value=2), segmentMaxBytes=SEGMENT, cleanerInterval=CLEANER
    )
    _publish_big(stub, stream, 6)
    margins.wait_until(
        lambda: partition_meta(stub, stream).messagesReceivedTimestamps.firstTimestamp == 0,
        WAIT,
        "every message expired",
        interval=0.1,
    )


def test_retention_by_messages_keeps_whole_segments_only(stub: Stub, stream_name: str) -> None:
    create(
        stub,
        stream_name,
        retentionMaxMessages=pb.NullableInt64(value=5),
        segmentMaxBytes=SEGMENT,
        cleanerInterval=CLEANER,
    )
    _publish_big(stub, stream_name, 12)  # segments from 0, 3, 6 and 9
    # 9-11 fit in 5, 6-11 do not: three messages are kept, not five.
    _wait_earliest(stub, stream_name, 9)
    meta = partition_meta(stub, stream_name)
    assert (meta.newestOffset, meta.highWatermark) == (11, 11)  # offsets are not reused
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.OFFSET, startOffset=2, stopPosition=pb.STOP_LATEST)
    assert subscribe(stub, req).offsets == [9, 10, 11]  # below EARLIEST reads from EARLIEST


def test_retention_by_bytes_keeps_whole_segments_only(stub: Stub, stream_name: str) -> None:
    create(
        stub,
        stream_name,
        retentionMaxBytes=pb.NullableInt64(value=6000),
        segmentMaxBytes=SEGMENT,
        cleanerInterval=CLEANER,
    )
    _publish_big(stub, stream_name, 12)
    _wait_earliest(stub, stream_name, 9)  # one segment (over 3,000 bytes) fits in 6,000, two do not
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    assert subscribe(stub, req).offsets == [9, 10, 11]


def test_the_active_segment_is_never_deleted(stub: Stub, stream_name: str) -> None:
    create(
        stub,
        stream_name,
        partitions=2,
        retentionMaxMessages=pb.NullableInt64(value=2),
        segmentMaxBytes=SEGMENT,
        cleanerInterval=CLEANER,
    )
    _publish_big(stub, stream_name, 4, partition=0)  # a segment of 3, and 1 in the active one
    for i in range(5):  # five small messages: one segment, the active one
        publish(stub, stream_name, b"%d" % i, partition=1)
    _wait_earliest(stub, stream_name, 3, partition=0)  # the cleaner ran on the stream's partitions
    # Five messages, over the limit of two, all in the active segment: all kept.
    req = pb.SubscribeRequest(stream=stream_name, partition=1, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    assert subscribe(stub, req).offsets == [0, 1, 2, 3, 4]


def test_nothing_expires_before_the_cleaner_interval(stub: Stub, stream_name: str) -> None:
    hourly, default = f"{stream_name}-hourly", f"{stream_name}-default"
    limits = {"retentionMaxMessages": pb.NullableInt64(value=5), "segmentMaxBytes": SEGMENT}
    create(stub, hourly, cleanerInterval=pb.NullableInt64(value=3_600_000), **limits)
    create(stub, default, **limits)  # Liftbridge's default interval: 5 minutes
    create(stub, stream_name, cleanerInterval=CLEANER, **limits)
    for name in (hourly, default, stream_name):
        _publish_big(stub, name, 12)
    _wait_earliest(stub, stream_name, 9)  # created last, cleaned already
    assert (_earliest(stub, hourly), _earliest(stub, default)) == (0, 0)


def test_a_log_emptied_by_retention_and_where_subscriptions_start(stub: Stub, stream_name: str) -> None:
    # As measured on Liftbridge v1.9.0-72: the cleaner rolls the full active segment (a run that
    # rolls does not clean), the next run deletes every older segment, and only an empty segment
    # at the next offset is left; the high watermark stays.
    _emptied(stub, stream_name)
    meta = partition_meta(stub, stream_name)
    assert (meta.newestOffset, meta.highWatermark) == (5, 5)
    offsets = []
    call = stub.Subscribe(pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), timeout=TIMEOUT)
    try:
        for msg in call:
            if msg.ByteSize() == 0:
                publish(stub, stream_name, b"6")  # the handshake: the subscription has its start
                continue
            offsets.append(msg.offset)
            break
    finally:
        call.cancel()
    assert offsets == [6]  # EARLIEST on an empty log: the next message
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.OFFSET, startOffset=2)
    assert subscribe(stub, req, count=1).offsets == [6]


def test_an_emptied_log_takes_earliest_to_latest_and_reads_on_past_the_stop(stub: Stub, stream_name: str) -> None:
    # Liftbridge (server/partition.go getStartOffset / getStopOffset, commitlog OldestOffset): with
    # every record removed, the oldest offset is -1, so EARLIEST starts at 0 and STOP_LATEST stops at
    # the newest offset 5: accepted. Its reader waits for the next record (6), which is past the stop,
    # so nothing ends the subscription: it reads on as with no stop. Refused before ("Stop offset is
    # before start offset: 5 < 6").
    _emptied(stub, stream_name)
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    offsets = []
    call = stub.Subscribe(req, timeout=TIMEOUT)
    try:
        for msg in call:
            if msg.ByteSize() == 0:
                publish(stub, stream_name, b"6")  # the handshake: accepted, and nothing to send yet
                continue
            offsets.append(msg.offset)
            if len(offsets) == 1:
                publish(stub, stream_name, b"7")
            else:
                break
    finally:
        call.cancel()
    assert offsets == [6, 7]  # past the stop offset 5, never "Stop offset reached"


def test_a_stop_offset_that_retention_removed_is_never_reached(stub: Stub, stream_name: str) -> None:
    # Liftbridge (server/partition.go, newSubscribeLoop) ends a subscription only on the message whose
    # offset equals the stop offset, and a reader below the oldest offset starts at the oldest: with
    # the stop offset gone, it reads on past it and waits for new messages, as with no stop at all.
    create(
        stub,
        stream_name,
        retentionMaxMessages=pb.NullableInt64(value=5),
        segmentMaxBytes=SEGMENT,
        cleanerInterval=CLEANER,
    )
    _publish_big(stub, stream_name, 12)
    _wait_earliest(stub, stream_name, 9)
    req = pb.SubscribeRequest(
        stream=stream_name, startPosition=pb.OFFSET, startOffset=2, stopPosition=pb.STOP_OFFSET, stopOffset=4
    )
    offsets = []
    call = stub.Subscribe(req, timeout=TIMEOUT)
    try:
        for msg in call:
            if msg.ByteSize() == 0:
                continue  # the handshake
            offsets.append(msg.offset)
            if len(offsets) == 3:
                publish(stub, stream_name, b"12")  # only now: a message after the subscription started
            if len(offsets) == 4:
                break
    finally:
        call.cancel()
    assert offsets == [9, 10, 11, 12]  # past the stop offset, never ended with "Stop offset reached"
