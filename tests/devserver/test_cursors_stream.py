"""The internal ``__cursors`` stream: listed in metadata as Liftbridge lists it, cursor calls
served only by the leader of the partition that owns the cursor, and every SetCursor a message of
that partition, compacted by key (``devserver/cursors_stream.py``, ``devserver/cursors.py``).
Probed with the generated stubs only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from airflow_provider_liftbridge.devserver.cursors import COMPACT_MIN
from airflow_provider_liftbridge.devserver.faults import HELD_TASK_PREFIX
from airflow_provider_liftbridge.devserver.log import PartitionLog
from tests import margins

from .helpers import TIMEOUT, rpc_error, subscribe, user_streams

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
            # The cursor messages were replicated like any stream's: the new leader holds them.
            held = pb.FetchPartitionMetadataRequest(stream="__cursors", partition=pid)
            assert stubs[new].FetchPartitionMetadata(held, timeout=TIMEOUT).metadata.newestOffset >= 0
        finally:
            for ch in channels:
                ch.close()


# -- cursors are messages of __cursors ------------------------------------------------------------


def _cursors_newest(stub: Stub, partition: int = 0) -> int:
    req = pb.FetchPartitionMetadataRequest(stream="__cursors", partition=partition)
    return stub.FetchPartitionMetadata(req, timeout=TIMEOUT).metadata.newestOffset


def _cursors_messages(stub: Stub, first: int = 0) -> list[pb.Message]:
    """Every message of ``__cursors`` partition 0 from ``first`` on, read with a plain Subscribe."""
    req = pb.SubscribeRequest(
        stream="__cursors", startPosition=pb.OFFSET, startOffset=first, stopPosition=pb.STOP_LATEST
    )
    sub = subscribe(stub, req)
    assert sub.code == grpc.StatusCode.RESOURCE_EXHAUSTED, (sub.code, sub.details)
    return sub.data


def _cursor_fields(value: bytes) -> tuple[str, int, str, int]:
    # Liftbridge's internal Cursor protobuf (server/protocol/internal.proto): stream = 1,
    # partition = 2, cursorId = 3, offset = 4, decoded field by field here.
    fields: dict[int, object] = {}
    pos = 0
    while pos < len(value):
        tag, pos = _varint(value, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields[number], pos = _varint(value, pos)
        else:
            assert wire == 2, f"unexpected wire type {wire}"
            size, pos = _varint(value, pos)
            fields[number] = value[pos : pos + size].decode()
            pos += size
    return (str(fields.get(1, "")), int(fields.get(2, 0)), str(fields.get(3, "")), int(fields.get(4, 0)))  # type: ignore[call-overload]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, pos


def test_every_set_cursor_is_a_message_keyed_by_cursor_stream_and_partition(stub: Stub, stream_name: str) -> None:
    # The session server is shared: other writers may set cursors meanwhile (busy run c1 saw 127
    # others between the two looks), so this test's own messages are picked out by key.
    before = _cursors_newest(stub)
    for offset in (4, 9):
        stub.SetCursor(pb.SetCursorRequest(cursorId="probe", stream=stream_name, partition=1, offset=offset))
    stub.SetCursor(pb.SetCursorRequest(cursorId="probe", stream=stream_name, partition=0, offset=2))
    after = _cursors_newest(stub)
    assert after >= before + 3  # the newest offset grows with each write (and others')
    written = [m for m in _cursors_messages(stub, before + 1) if stream_name.encode() in m.key]
    offsets = [m.offset for m in written]
    assert offsets == sorted(offsets) and len(set(offsets)) == 3 and before < offsets[0] and offsets[-1] <= after
    assert [(m.key, _cursor_fields(m.value)) for m in written] == [
        (f"probe,{stream_name},1".encode(), (stream_name, 1, "probe", 4)),
        (f"probe,{stream_name},1".encode(), (stream_name, 1, "probe", 9)),
        (f"probe,{stream_name},0".encode(), (stream_name, 0, "probe", 2)),
    ]
    fetched = [
        stub.FetchCursor(pb.FetchCursorRequest(cursorId="probe", stream=stream_name, partition=p), timeout=TIMEOUT)
        for p in (0, 1)
    ]
    assert [f.offset for f in fetched] == [2, 9]


def test_cursor_values_and_messages_survive_a_restart(tmp_path: Path) -> None:
    with DevServer(data_dir=tmp_path) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = Stub(ch)
        for n in range(5):
            stub.SetCursor(pb.SetCursorRequest(cursorId=f"c{n % 2}", stream="s", offset=n), timeout=TIMEOUT)
        assert _cursors_newest(stub) == 4
    with DevServer(data_dir=tmp_path) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = Stub(ch)
        assert _cursors_newest(stub) == 4
        got = [
            stub.FetchCursor(pb.FetchCursorRequest(cursorId=c, stream="s"), timeout=TIMEOUT).offset
            for c in ("c0", "c1")
        ]
        assert got == [4, 3]
        stub.SetCursor(pb.SetCursorRequest(cursorId="c1", stream="s", offset=7), timeout=TIMEOUT)
        assert _cursors_newest(stub) == 5


def test_compaction_keeps_the_cursors_stream_bounded_across_restarts(tmp_path: Path) -> None:
    writes = 3 * COMPACT_MIN
    with DevServer(data_dir=tmp_path) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = Stub(ch)
        for n in range(writes):
            stub.SetCursor(pb.SetCursorRequest(cursorId=f"c{n % 3}", stream="s", offset=n), timeout=TIMEOUT)
        assert _cursors_newest(stub) >= writes - 1  # offsets keep growing
        held = _cursors_messages(stub)
        assert len(held) <= COMPACT_MIN + 3  # compacted: not one record per write
        latest = {m.key: _cursor_fields(m.value)[3] for m in held}  # the last message of a key wins
        assert latest == {b"c0,s,0": writes - 3, b"c1,s,0": writes - 2, b"c2,s,0": writes - 1}
    with DevServer(data_dir=tmp_path) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = Stub(ch)
        fetched = [
            stub.FetchCursor(pb.FetchCursorRequest(cursorId=f"c{i}", stream="s"), timeout=TIMEOUT) for i in range(3)
        ]
        assert [f.offset for f in fetched] == [writes - 3, writes - 2, writes - 1]
        assert len(_cursors_messages(stub)) <= COMPACT_MIN + 3


def test_cursors_of_an_earlier_dev_server_move_into_the_cursors_stream(tmp_path: Path) -> None:
    # Earlier dev servers kept cursors in their own log of SetCursorRequest bodies (DATA_DIR/cursors/).
    old = PartitionLog(tmp_path / "cursors")
    for offset in (3, 8):
        old.append(pb.SetCursorRequest(cursorId="old", stream="s", partition=1, offset=offset).SerializeToString(), 1)
    old.flush()
    old.close()
    with DevServer(data_dir=tmp_path) as srv, grpc.insecure_channel(srv.address) as ch:
        stub = Stub(ch)
        assert (
            stub.FetchCursor(pb.FetchCursorRequest(cursorId="old", stream="s", partition=1), timeout=TIMEOUT).offset
            == 8
        )
        assert [(m.key, _cursor_fields(m.value)) for m in _cursors_messages(stub)] == [(b"old,s,1", ("s", 1, "old", 8))]
    assert not (tmp_path / "cursors").exists()


def test_cluster_restart_reads_cursors_back_from_the_replicated_messages(tmp_path: Path) -> None:
    def owner_stub(stubs: list[Stub], srv: DevServer, cursor_id: str) -> Stub:
        # The restart window has no leaders at first: ask until the owning partition has one.
        return stubs[_cursor_leader(srv, stubs, cursor_id)]

    def run(srv: DevServer, action: Callable[[list[Stub]], None]) -> None:
        channels = [grpc.insecure_channel(a) for a in srv.addresses]
        try:
            action([Stub(ch) for ch in channels])
        finally:
            for ch in channels:
                ch.close()

    def set_them(stubs: list[Stub]) -> None:
        for n in range(4):
            req = pb.SetCursorRequest(cursorId=f"r{n}", stream="s", offset=10 + n)
            owner_stub(stubs, first, f"r{n}").SetCursor(req, timeout=TIMEOUT)

    got: list[int] = []

    def fetch_them(stubs: list[Stub]) -> None:
        for n in range(4):
            req = pb.FetchCursorRequest(cursorId=f"r{n}", stream="s")
            got.append(owner_stub(stubs, second, f"r{n}").FetchCursor(req, timeout=TIMEOUT).offset)

    with DevServer(brokers=3, cursors_partitions=2, data_dir=tmp_path, timings=ClusterTimings.fast()) as first:
        run(first, set_them)
    with DevServer(brokers=3, cursors_partitions=2, data_dir=tmp_path, timings=ClusterTimings.fast()) as second:
        run(second, fetch_them)
    assert got == [10, 11, 12, 13]


# -- a restart under a pending cursor write ---------------------------------------------------------


def _held_writes(srv: DevServer) -> int:
    """Calls a stalled broker holds, to carry out when it resumes (``faults.carried_out``),
    still waiting on the server's loop."""

    async def count() -> int:
        return sum(t.get_name().startswith(HELD_TASK_PREFIX) for t in asyncio.all_tasks())

    return int(srv._run(count()))


def test_cluster_restart_under_a_held_cursor_write_drops_it_and_ends_its_waiter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Seed 5006 of the fault campaign: SetCursor calls reached the brokers a full restart had
    # stopped, and were written to the closed __cursors log. Here the write is pending in the
    # other way a stopped broker keeps one: its leader is stalled (SIGSTOP) and holds the request
    # to carry out when it runs again. The restart replaces the processes: the held write is lost
    # with them (never written to a closed log, never carried out later), and whatever waited for
    # the stalled broker ends instead of waiting forever.
    timings = ClusterTimings.fast(
        replica_max_lag_time=60.0, replica_max_leader_timeout=60.0, metadata_election_timeout=60.0
    )
    cursor = pb.SetCursorRequest(cursorId="held", stream="s", offset=1)
    with DevServer(brokers=3, data_dir=tmp_path, timings=timings) as srv:
        channels = [grpc.insecure_channel(a) for a in srv.addresses]
        stubs = [Stub(ch) for ch in channels]
        try:
            owner = _cursor_leader(srv, stubs, "held")
            stubs[owner].SetCursor(cursor, timeout=TIMEOUT)
            srv.stall_broker(owner)
            late = pb.SetCursorRequest(cursorId="held", stream="s", offset=2)
            err = rpc_error(stubs[owner].SetCursor, late, timeout=0.5)
            assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert _held_writes(srv) == 1  # the stalled leader holds the write

            srv.restart_cluster(down=0.2)
            margins.wait_until(
                lambda: _held_writes(srv) == 0, 10, "the writes held before the restart done", interval=0.05
            )
            srv.resume_broker(owner)  # the new process was never stopped: nothing to carry out

            owner = _cursor_leader(srv, stubs, "held")
            fetch = pb.FetchCursorRequest(cursorId="held", stream="s")
            assert stubs[owner].FetchCursor(fetch, timeout=TIMEOUT).offset == 1
        finally:
            for ch in channels:
                ch.close()
    failed = [r.getMessage() for r in caplog.records if "__cursors" in r.getMessage() and r.levelno >= logging.WARNING]
    assert failed == [], failed


def _cursor_leader(srv: DevServer, stubs: list[Stub], cursor_id: str) -> int:
    """The broker leading the ``__cursors`` partition that owns ``(cursor_id, "s", 0)``, once
    one does (a restarted cluster has no leaders at first)."""

    def leader() -> str:
        with contextlib.suppress(grpc.RpcError):
            md = stubs[0].FetchMetadata(pb.FetchMetadataRequest(streams=["__cursors"]), timeout=TIMEOUT)
            parts = md.streamMetadata[0].partitions
            return parts[_owner(cursor_id, "s", 0, len(parts))].leader if parts else ""
        return ""

    where = margins.caller()
    return srv.broker_ids.index(
        margins.wait_until(leader, 10, "a leader for the cursors partition", interval=0.05, where=where)
    )
