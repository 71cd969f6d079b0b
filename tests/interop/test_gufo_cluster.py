"""gufo-liftbridge against a three-broker dev-server cluster: it finds partition leaders and the
cursors' leader from metadata alone (seeded with one broker that leads neither), and follows the
cursors' leader when it stops."""

from __future__ import annotations

from typing import Any

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge.devserver import DevServer

TIMEOUT = 10.0


def _leader(raw: Any, cluster: DevServer, stream: str, partition: int) -> int:
    md = raw.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=TIMEOUT)
    return cluster.broker_ids.index(md.streamMetadata[0].partitions[partition].leader)


def test_gufo_routes_by_metadata_and_follows_the_cursors_leader(
    gufo_at: Any, raw_at: Any, fast_cluster: DevServer, stream_name: str
) -> None:
    raws = [raw_at(a) for a in fast_cluster.addresses]
    cursors_leader = _leader(raws[0], fast_cluster, "__cursors", 0)
    seed = (cursors_leader + 1) % 3
    gufo = gufo_at([fast_cluster.addresses[seed]])
    gufo("create", stream=stream_name, partitions=3, replication_factor=3)
    assert {_leader(raws[0], fast_cluster, stream_name, p) for p in range(3)} == {0, 1, 2}
    for p in range(3):
        gufo("publish", stream=stream_name, partition=p, values=[f"p{p}-{i}" for i in range(3)])
    for p in range(3):  # each read from its partition's leader, which gufo learned from metadata
        got = gufo("subscribe", stream=stream_name, partition=p, count=3)["messages"]
        assert [m[1] for m in got] == [f"p{p}-{i}" for i in range(3)]
    # Cursors: gufo asks the leader of __cursors partition 0, which the seed is not.
    gufo("set_cursor", stream=stream_name, partition=1, cursor_id="etl", offset=1)
    assert gufo("get_cursor", stream=stream_name, partition=1, cursor_id="etl")["offset"] == 2
    fetch = pb.FetchCursorRequest(cursorId="etl", stream=stream_name, partition=1)
    assert raws[cursors_leader].FetchCursor(fetch, timeout=TIMEOUT).offset == 2
    try:
        raws[seed].FetchCursor(fetch, timeout=TIMEOUT)
        raise AssertionError("a broker that does not lead the cursor's partition should refuse it")
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    # The cursors' leader stops cleanly: its leadership moves, and gufo finds the new leader.
    fast_cluster.stop_broker(cursors_leader)
    assert gufo("get_cursor", stream=stream_name, partition=1, cursor_id="etl")["offset"] == 2
    gufo("set_cursor", stream=stream_name, partition=1, cursor_id="etl", offset=2)
    new_leader = _leader(raws[seed], fast_cluster, "__cursors", 0)
    assert new_leader != cursors_leader
    assert raws[new_leader].FetchCursor(fetch, timeout=TIMEOUT).offset == 3
