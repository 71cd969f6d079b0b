"""gufo-liftbridge against one broker: the session dev server, or an external Liftbridge with
``LIFTBRIDGE_TEST_BROKERS`` (then these are contract checks of the real server, which needs
cursors on, ``cursors.stream.partitions`` 1 or more).

gufo's own conventions are kept as gufo users see them: ``set_cursor(offset=N)`` stores N + 1 (the
next offset to read) and a RESUME subscription starts at the stored value.
"""

from __future__ import annotations

import zlib
from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb

TIMEOUT = 10.0
PAUSED = "Failed to create stream reader: segment has been closed"


def _cursors_partitions(raw: Any) -> int:
    """Partition count of ``__cursors``; skips the test when the server has cursors off."""
    md = raw.FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT)
    if md.streamMetadata[0].error == pb.StreamMetadata.UNKNOWN_STREAM:
        pytest.skip("the server has cursors off (cursors.stream.partitions: 0)")
    return len(md.streamMetadata[0].partitions)


def _owned_by_partition_0(stream: str, partitions: int) -> str:
    """A cursor id that ``__cursors`` partition 0 owns: gufo 0.2 always asks that partition's leader."""
    return next(f"reader-{n}" for n in range(1000) if zlib.crc32(f"reader-{n},{stream},0".encode()) % partitions == 0)


def test_create_publish_subscribe_and_metadata(gufo_at: Any, raw_at: Any, lb_address: str, stream_name: str) -> None:
    gufo, raw = gufo_at([lb_address]), raw_at(lb_address)
    gufo("create", stream=stream_name, partitions=2)
    gufo("publish", stream=stream_name, partition=1, values=["a", "b", "c"], key="k", headers={"h": "x"})
    got = gufo("subscribe", stream=stream_name, partition=1, count=3)["messages"]
    assert [(o, v, k) for o, v, k, _ in got] == [(0, "a", "k"), (1, "b", "k"), (2, "c", "k")]
    assert all(headers["h"] == "x" for *_, headers in got)
    everything = gufo("metadata", stream=None)["streams"]
    by_name = gufo("metadata", stream=stream_name)["streams"]
    assert set(by_name) == {stream_name} and sorted(by_name[stream_name]) == ["0", "1"]
    listed = raw.FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT).streamMetadata[0]
    assert everything[stream_name] == {str(p): listed.partitions[p].leader for p in listed.partitions}
    assert (
        raw.FetchPartitionMetadata(
            pb.FetchPartitionMetadataRequest(stream=stream_name, partition=1), timeout=TIMEOUT
        ).metadata.newestOffset
        == 2
    )


def test_cursors_through_gufos_own_routing(gufo_at: Any, raw_at: Any, lb_address: str, stream_name: str) -> None:
    raw = raw_at(lb_address)
    partitions = _cursors_partitions(raw)
    gufo = gufo_at([lb_address])
    assert "__cursors" in gufo("metadata", stream=None)["streams"]  # what gufo routes cursor calls by
    gufo("create", stream=stream_name)
    gufo("publish", stream=stream_name, partition=0, values=[f"m{i}" for i in range(8)])
    assert len(gufo("subscribe", stream=stream_name, count=8)["messages"]) == 8
    cursor_id = _owned_by_partition_0(stream_name, partitions)
    assert gufo("get_cursor", stream=stream_name, partition=0, cursor_id=cursor_id)["offset"] == -1
    gufo("set_cursor", stream=stream_name, partition=0, cursor_id=cursor_id, offset=4)
    assert gufo("get_cursor", stream=stream_name, partition=0, cursor_id=cursor_id)["offset"] == 5
    # What gufo stored is what any client reads from the owning partition's leader.
    fetch = pb.FetchCursorRequest(cursorId=cursor_id, stream=stream_name, partition=0)
    assert raw.FetchCursor(fetch, timeout=TIMEOUT).offset == 5
    resumed = gufo("subscribe", stream=stream_name, count=3, cursor_id=cursor_id)["messages"]
    assert [m[0] for m in resumed] == [5, 6, 7]


def test_subscribe_to_a_paused_partition(gufo_at: Any, raw_at: Any, lb_address: str, stream_name: str) -> None:
    gufo, raw = gufo_at([lb_address]), raw_at(lb_address)
    gufo("create", stream=stream_name)
    gufo("publish", stream=stream_name, partition=0, values=["a", "b"])
    assert len(gufo("subscribe", stream=stream_name, count=2)["messages"]) == 2
    raw.PauseStream(pb.PauseStreamRequest(name=stream_name, partitions=[0]), timeout=TIMEOUT)
    # The call itself fails, before any handshake message.
    received: list[pb.Message] = []
    with pytest.raises(grpc.RpcError) as refused:
        received.extend(raw.Subscribe(pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), timeout=5))
    assert (received, refused.value.code(), refused.value.details()) == ([], grpc.StatusCode.INTERNAL, PAUSED)
    # gufo keeps retrying such a subscription (it treats INTERNAL as transient): nothing arrives.
    assert gufo("subscribe", stream=stream_name, count=1, wait=1.5)["messages"] == []
    # With resume the partition is resumed and read.
    got = gufo("subscribe", stream=stream_name, count=2, resume=True)["messages"]
    assert [m[1] for m in got] == ["a", "b"]
    # The partition runs again: a plain subscription gets its handshake, then the messages.
    again = raw.Subscribe(pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), timeout=5)
    try:
        assert next(again).ByteSize() == 0 and next(again).value == b"a"
    finally:
        again.cancel()
