"""Retention by age as Liftbridge v1.9.0-72's delete cleaner applies it (``applyAgeLimit`` in
``server/commitlog/delete_cleaner.go``): the leading segments whose last message is older than the
age go; a segment with one young message stays whole. Messages are stamped an hour back with the
dev server's reception clock, so this file runs on the in-process dev server only."""

from __future__ import annotations

import datetime as dt

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import set_reception_clock

from .helpers import create, subscribe
from .test_retention import CLEANER, SEGMENT, _publish_big, _wait_earliest

Stub = api_pb2_grpc.APIStub


def test_retention_by_age_keeps_a_segment_with_one_young_message(stub: Stub, stream_name: str) -> None:
    create(
        stub,
        stream_name,
        retentionMaxAge=pb.NullableInt64(value=60_000),
        segmentMaxBytes=SEGMENT,
        cleanerInterval=CLEANER,
    )
    set_reception_clock(stream_name, dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    try:
        _publish_big(stub, stream_name, 5)  # a segment of 0-2, and 3-4 in the next: an hour old
    finally:
        set_reception_clock(stream_name, None)
    _publish_big(stub, stream_name, 2)  # 5 completes the segment of 3-5; 6 starts the active one
    # The segment of 0-2 goes; the one of 3-5 stays whole for its young message 5.
    _wait_earliest(stub, stream_name, 3)
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST)
    assert subscribe(stub, req).offsets == [3, 4, 5, 6]
