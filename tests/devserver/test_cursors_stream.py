"""The internal ``__cursors`` stream: listed in metadata as Liftbridge lists it, and cursor calls
served only by the leader of the partition that owns the cursor (``devserver/cursors.py``)."""

from __future__ import annotations

import zlib

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer

from .helpers import TIMEOUT, rpc_error, user_streams

Stub = api_pb2_grpc.APIStub


def _owner(cursor_id: str, stream: str, partition: int, partitions: int) -> int:
    # Written out here rather than imported: the rule of Liftbridge's cursors.go and go-liftbridge.
    return zlib.crc32(f"{cursor_id},{stream},{partition}".encode()) % partitions


def test_cursors_stream_is_listed_with_all_streams_and_by_name(stub: Stub) -> None:
    everything = stub.FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT)
    listed = [s for s in everything.streamMetadata if s.name == "__cursors"]
    assert len(listed) == 1 and "__cursors" not in {s.name for s in user_streams(everything)}
    by_name = stub.FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT).streamMetadata
    assert [(s.name, s.error, s.subject) for s in by_name] == [
        ("__cursors", pb.StreamMetadata.OK, "liftbridge-default.cursors")
    ]
    (part,) = by_name[0].partitions.values()  # the default: cursors.stream.partitions 1
    assert (part.id, part.leader, list(part.isr)) == (0, "broker-0", ["broker-0"])


def test_partition_count_is_a_setting_and_cursors_off_has_no_stream() -> None:
    with DevServer(cursors_partitions=4) as srv, grpc.insecure_channel(srv.address) as ch:
        md = Stub(ch).FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT)
        assert sorted(md.streamMetadata[0].partitions) == [0, 1, 2, 3]
        Stub(ch).SetCursor(pb.SetCursorRequest(cursorId="c", stream="s", partition=2, offset=9), timeout=TIMEOUT)
        assert Stub(ch).FetchCursor(pb.FetchCursorRequest(cursorId="c", stream="s", partition=2)).offset == 9
    with DevServer(cursors=False) as srv, grpc.insecure_channel(srv.address) as ch:
        md = Stub(ch).FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT)
        assert md.streamMetadata[0].error == pb.StreamMetadata.UNKNOWN_STREAM
        err = rpc_error(Stub(ch).FetchCursor, pb.FetchCursorRequest(cursorId="c", stream="s"), timeout=TIMEOUT)
        assert (err.code(), err.details()) == (grpc.StatusCode.INTERNAL, "Cursors stream does not exist")


def test_cluster_only_the_owning_partitions_leader_serves_a_cursor() -> None:
    with DevServer(brokers=3, cursors_partitions=3, timings=ClusterTimings.fast()) as srv:
        channels = [grpc.insecure_channel(a) for a in srv.addresses]
        stubs = [Stub(ch) for ch in channels]
        try:
            md = stubs[1].FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT)
            parts = md.streamMetadata[0].partitions
            # Replicated on every broker (Liftbridge's default factor), leaders spread over them.
            assert all(sorted(parts[p].replicas) == sorted(srv.broker_ids) for p in parts)
            assert sorted(parts[p].leader for p in parts) == sorted(srv.broker_ids)
            for n in range(6):
                cid, pid = f"reader-{n}", _owner(f"reader-{n}", "orders", n % 2, 3)
                leader = srv.broker_ids.index(parts[pid].leader)
                for i, stub in enumerate(stubs):
                    req = pb.SetCursorRequest(cursorId=cid, stream="orders", partition=n % 2, offset=n)
                    if i == leader:
                        stub.SetCursor(req, timeout=TIMEOUT)
                        continue
                    err = rpc_error(stub.SetCursor, req, timeout=TIMEOUT)
                    assert (err.code(), err.details()) == (
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"Server not leader for cursors partition {pid}",
                    )
            # A clean stop moves the leaderships; the new leader serves the cursors set before.
            cid, pid = "reader-0", _owner("reader-0", "orders", 0, 3)
            old = srv.broker_ids.index(parts[pid].leader)
            srv.stop_broker(old)
            alive = stubs[(old + 1) % 3]
            moved = alive.FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT)
            new = srv.broker_ids.index(moved.streamMetadata[0].partitions[pid].leader)
            assert new != old
            fetch = pb.FetchCursorRequest(cursorId=cid, stream="orders", partition=0)
            assert stubs[new].FetchCursor(fetch, timeout=TIMEOUT).offset == 0
        finally:
            for ch in channels:
                ch.close()
