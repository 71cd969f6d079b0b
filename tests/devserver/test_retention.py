"""Retention by max messages, max bytes and max age: the oldest messages go and EARLIEST moves forward."""

from __future__ import annotations

import time

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from tests import margins

from .helpers import TIMEOUT, create, partition_meta, publish, subscribe

Stub = api_pb2_grpc.APIStub


def _earliest(stub: Stub, stream: str) -> int:
    return subscribe(stub, pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST), count=1).offsets[0]


def test_retention_max_messages(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, retentionMaxMessages=pb.NullableInt64(value=5))
    for i in range(12):
        publish(stub, stream_name, b"%d" % i)
    assert _earliest(stub, stream_name) == 7
    meta = partition_meta(stub, stream_name)
    assert (meta.newestOffset, meta.highWatermark) == (11, 11)  # offsets are not reused
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.OFFSET, startOffset=2, stopPosition=pb.STOP_LATEST)
    assert subscribe(stub, req).offsets == [7, 8, 9, 10, 11]  # below EARLIEST reads from EARLIEST


def test_retention_max_bytes(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, retentionMaxBytes=pb.NullableInt64(value=2000))
    for i in range(50):
        publish(stub, stream_name, b"x" * 100 + b"%d" % i)
    earliest = _earliest(stub, stream_name)
    assert 30 < earliest < 49  # about 2,000 bytes of records are kept, the rest expired
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    kept = subscribe(stub, req).data
    assert sum(len(m.SerializeToString()) for m in kept) <= 2000


def test_retention_max_age(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, retentionMaxAge=pb.NullableInt64(value=500))  # milliseconds, as the Go client sends
    for i in range(3):
        publish(stub, stream_name, b"old%d" % i)
    time.sleep(0.7)
    publish(stub, stream_name, b"fresh")
    margins.wait_until(lambda: _earliest(stub, stream_name) == 3, 5, "the old messages aged out", interval=0.1)


def test_a_stop_offset_that_retention_removed_is_never_reached(stub: Stub, stream_name: str) -> None:
    # Liftbridge (server/partition.go, newSubscribeLoop) ends a subscription only on the message whose
    # offset equals the stop offset, and a reader below the oldest offset starts at the oldest: with
    # the stop offset gone, it reads on past it and waits for new messages, as with no stop at all.
    create(stub, stream_name, retentionMaxMessages=pb.NullableInt64(value=5))
    for i in range(12):
        publish(stub, stream_name, b"%d" % i)
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
            if len(offsets) == 5:
                publish(stub, stream_name, b"12")  # only now: it moves the oldest offset to 8
            if len(offsets) == 6:
                break
    finally:
        call.cancel()
    assert offsets == [7, 8, 9, 10, 11, 12]  # past the stop offset, never ended with "Stop offset reached"
