"""Cluster mode replicates like Liftbridge: per-broker replicas, ISR, high watermark, ack policies,
leader election with truncation, the full-restart window, and the fault hooks that drive them.

Every test runs a fresh 3-broker server with short time-outs (``ClusterTimings.fast()``: lag time
and leader timeout 0.5 s, the restart window a tenth of the real one) and talks to it over raw
generated stubs and a plain nats-py connection. Where a stalled follower must stay in the ISR
while the test looks, the lag time is long (``HOLD_ISR``), so a loaded machine cannot shrink it
early. Waits poll for an observable state; none asserts how fast something happened.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import nats
import pytest

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message, unmarshal_ack
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer, DevServerProcess, ServerStateError
from tests import margins
from tests.margins import bounded

from .helpers import TIMEOUT, create, known_everywhere, publish, rpc_error, subscribe, user_streams

Stub = api_pb2_grpc.APIStub
#: Followers stay in the ISR for the whole test; leaders are still replaced after 0.5 s.
HOLD_ISR = ClusterTimings.fast(replica_max_lag_time=60.0)


@pytest.fixture
def holding_cluster() -> Iterator[DevServer]:
    with DevServer(brokers=3, timings=HOLD_ISR) as server:
        yield server


def _stubs(addresses: list[str]) -> list[Stub]:
    return [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in addresses]


def _meta(stub: Stub, stream: str, partition: int = 0) -> pb.PartitionMetadata:
    """The partition as FetchMetadata lists it (offsets -1 and no leader while the stream is not listed)."""
    resp = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=TIMEOUT)
    listed = resp.streamMetadata[0].partitions
    # A protobuf map answers a missing key with a default value (offsets 0): say "unknown" instead.
    return listed[partition] if partition in listed else pb.PartitionMetadata(highWatermark=-1, newestOffset=-1)


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    margins.wait_until(check, timeout, what, interval=0.02)


def _roles(server: DevServer | DevServerProcess, stub: Stub, stream: str) -> tuple[int, list[int]]:
    """Index of the partition's leader and of its followers."""
    ids = [f"broker-{i}" for i in range(len(server.addresses))]
    leader = ids.index(_meta(stub, stream).leader)
    return leader, [i for i in range(len(ids)) if i != leader]


def _all(stub: Stub, stream: str, stop: int) -> list[bytes]:
    req = pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_OFFSET, stopOffset=stop)
    return [m.value for m in subscribe(stub, req).data]


def test_a_stalled_follower_holds_the_high_watermark_and_all_acks(holding_cluster: DevServer, stream_name: str) -> None:
    # The stalled follower stays in the ISR, as in the first 15 s on Liftbridge.
    stubs = _stubs(holding_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _roles(holding_cluster, stubs[0], stream_name)
    lead = stubs[leader]
    assert publish(lead, stream_name, b"r0", ackPolicy=pb.ALL).ack.offset == 0
    holding_cluster.stall_broker(f1)
    # LEADER acks come as soon as the leader wrote it; the leader's log runs ahead of the HW.
    assert publish(lead, stream_name, b"r1", ackPolicy=pb.LEADER).ack.offset == 1
    meta = lead.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream_name), timeout=TIMEOUT).metadata
    assert (meta.highWatermark, meta.newestOffset) == (0, 1)
    # A subscriber sees only what is committed.
    live = lead.Subscribe(pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST), timeout=TIMEOUT)
    assert next(live).ByteSize() == 0  # handshake
    assert next(live).value == b"r0"
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(next(live).value))
    reader.start()
    reader.join(0.3)
    assert got == []  # r1 is above the high watermark
    holding_cluster.resume_broker(f1)
    reader.join(TIMEOUT)
    assert got == [b"r1"]
    live.cancel()
    _wait_for("the high watermark to reach 1", lambda: _meta(lead, stream_name).highWatermark == 1)


def test_all_acks_wait_for_the_isr_and_leader_acks_do_not(stream_name: str) -> None:
    with DevServer(brokers=3, timings=ClusterTimings.fast(replica_max_lag_time=2.0)) as server:
        stubs = _stubs(server.addresses)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        leader, (f1, _) = _roles(server, stubs[0], stream_name)
        server.stall_broker(f1)
        # With the follower stalled the ALL ack waits until it leaves the ISR (lag time 2 s).
        err = rpc_error(
            stubs[leader].Publish, pb.PublishRequest(stream=stream_name, value=b"all", ackPolicy=pb.ALL), timeout=0.3
        )
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert publish(stubs[leader], stream_name, b"leader", ackPolicy=pb.LEADER).ack.offset == 1
        # After the lag time the follower is out of the ISR and ALL acks go through again.
        _wait_for(
            "the stalled follower to leave the ISR",
            lambda: f"broker-{f1}" not in _meta(stubs[leader], stream_name).isr,
        )
        meta = _meta(stubs[leader], stream_name)
        assert meta.highWatermark == meta.newestOffset == 1
        assert publish(stubs[leader], stream_name, b"all-2", ackPolicy=pb.ALL).ack.offset == 2
        server.resume_broker(f1)
        _wait_for("the follower to rejoin the ISR", lambda: f"broker-{f1}" in _meta(stubs[leader], stream_name).isr)
        # Its replica serves what the leader has (readISRReplica reads the follower's own copy).
        req = pb.SubscribeRequest(
            stream=stream_name,
            startPosition=pb.EARLIEST,
            stopPosition=pb.STOP_OFFSET,
            stopOffset=2,
            readISRReplica=True,
        )
        assert [m.value for m in subscribe(stubs[f1], req).data] == [b"all", b"leader", b"all-2"]


async def test_nats_acks_follow_the_ack_policy(holding_cluster: DevServer, stream_name: str) -> None:
    stubs = _stubs(holding_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _roles(holding_cluster, stubs[0], stream_name)
    nc = await nats_adapter.connect(holding_cluster.nats_url)
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await asyncio.to_thread(holding_cluster.stall_broker, f1)
        await nc.publish(stream_name, new_message(b"all", ack_inbox=inbox, correlation_id="a", ack_policy=pb.ALL))
        await nc.publish(stream_name, new_message(b"ldr", ack_inbox=inbox, correlation_id="l", ack_policy=pb.LEADER))
        first = unmarshal_ack((await sub.next_msg(timeout=TIMEOUT)).data)
        assert (first.correlationId, first.offset) == ("l", 1)  # the LEADER ack overtakes the ALL ack
        with pytest.raises(nats.errors.TimeoutError):
            await sub.next_msg(timeout=0.2)
        await asyncio.to_thread(holding_cluster.resume_broker, f1)
        second = unmarshal_ack((await sub.next_msg(timeout=TIMEOUT)).data)
        assert (second.correlationId, second.offset, second.ackPolicy) == ("a", 0, pb.ALL)
    finally:
        await nc.close()


def test_min_isr_stops_commits_below_it(fast_cluster: DevServer, stream_name: str) -> None:
    stubs = _stubs(fast_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3, minIsr=pb.NullableInt32(value=3))
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _roles(fast_cluster, stubs[0], stream_name)
    lead = stubs[leader]
    assert publish(lead, stream_name, b"ok", ackPolicy=pb.ALL).ack.offset == 0
    fast_cluster.stall_broker(f1)
    _wait_for("the stalled follower to leave the ISR", lambda: len(_meta(lead, stream_name).isr) == 2)
    # Liftbridge's leader still appends (and sends LEADER acks) but commits nothing below the minimum ISR.
    assert publish(lead, stream_name, b"uncommitted", ackPolicy=pb.LEADER).ack.offset == 1
    err = rpc_error(lead.Publish, pb.PublishRequest(stream=stream_name, value=b"x", ackPolicy=pb.ALL), timeout=0.3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    meta = _meta(lead, stream_name)
    assert (meta.highWatermark, meta.newestOffset) == (0, 2)
    fast_cluster.resume_broker(f1)
    _wait_for("the partition to commit again", lambda: _meta(lead, stream_name).highWatermark == 2)
    assert _all(lead, stream_name, 2) == [b"ok", b"uncommitted", b"x"]


def test_a_killed_leader_is_replaced_and_its_uncommitted_tail_is_lost(
    holding_cluster: DevServer, stream_name: str
) -> None:
    stubs = _stubs(holding_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, followers = _roles(holding_cluster, stubs[0], stream_name)
    lead = stubs[leader]
    assert publish(lead, stream_name, b"committed", ackPolicy=pb.ALL).ack.offset == 0
    for f in followers:
        holding_cluster.stall_broker(f)
    assert publish(lead, stream_name, b"tail-1", ackPolicy=pb.LEADER).ack.offset == 1
    assert publish(lead, stream_name, b"tail-2", ackPolicy=pb.LEADER).ack.offset == 2
    assert (_meta(lead, stream_name).highWatermark, _meta(lead, stream_name).newestOffset) == (0, 2)
    holding_cluster.kill_broker(leader)
    for f in followers:
        holding_cluster.resume_broker(f)
    other = stubs[followers[0]]
    # After the leader timeout an ISR member leads, without the tail.
    _wait_for("a new leader", lambda: _meta(other, stream_name).leader not in ("", f"broker-{leader}"))
    # It starts from the high watermark it knew as a follower (one fetch behind) and commits
    # offset 0 again once the other follower fetched from it.
    _wait_for("the new leader to commit", lambda: _meta(other, stream_name).highWatermark == 0)
    meta = _meta(other, stream_name)
    assert meta.leader in {f"broker-{f}" for f in followers}
    assert f"broker-{leader}" not in meta.isr
    assert (meta.highWatermark, meta.newestOffset) == (0, 0)
    new_lead = stubs[int(meta.leader.rsplit("-", 1)[1])]
    assert publish(new_lead, stream_name, b"after", ackPolicy=pb.ALL).ack.offset == 1
    # The old leader comes back as a follower: it drops its tail and copies the new leader's log.
    holding_cluster.start_broker(leader)
    assert f"broker-{leader}" in _meta(new_lead, stream_name).isr
    req = pb.SubscribeRequest(
        stream=stream_name, startPosition=pb.EARLIEST, stopPosition=pb.STOP_OFFSET, stopOffset=1, readISRReplica=True
    )
    assert [m.value for m in subscribe(stubs[leader], req).data] == [b"committed", b"after"]
    assert _all(new_lead, stream_name, 1) == [b"committed", b"after"]


def test_a_leader_back_within_the_leader_timeout_stays_leader(stream_name: str) -> None:
    with DevServer(brokers=3, timings=ClusterTimings.fast(replica_max_leader_timeout=30.0)) as server:
        stubs = _stubs(server.addresses)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        leader, _ = _roles(server, stubs[0], stream_name)
        publish(stubs[leader], stream_name, b"a", ackPolicy=pb.ALL)
        server.kill_broker(leader)
        other = stubs[(leader + 1) % 3]
        # A publish while the leader is dead is lost: no one takes it, the call runs out of time.
        err = rpc_error(other.Publish, pb.PublishRequest(stream=stream_name, value=b"lost"), timeout=0.3)
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        server.start_broker(leader)
        assert _meta(other, stream_name).leader == f"broker-{leader}"
        assert publish(stubs[leader], stream_name, b"b", ackPolicy=pb.ALL).ack.offset == 1


def test_a_full_restart_goes_through_the_restart_window(stream_name: str) -> None:
    # Phases long enough to be seen from a loaded machine: no streams until 0.8 s after the restart,
    # no leaders until 1.6 s, high watermarks unknown until 2.4 s.
    timings = ClusterTimings.fast(restart_no_streams=0.8, restart_no_leaders=1.6, restart_hw_unknown=2.4)
    with DevServer(brokers=3, timings=timings) as server:
        stubs = _stubs(server.addresses)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        leader, _ = _roles(server, stubs[0], stream_name)
        publish(stubs[leader], stream_name, b"kept", ackPolicy=pb.ALL)
        server.restart_cluster()

        def phase() -> str:
            resp = stubs[0].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT, wait_for_ready=True)
            if not user_streams(resp):
                return "no streams"
            part = user_streams(resp)[0].partitions[0]
            if not part.leader:
                return "no leader"
            return "hw unknown" if part.highWatermark == -1 else "normal"

        def refusal(call: Callable[[], object]) -> str:
            try:
                call()
            except grpc.RpcError as err:
                return f"{err.code().name} {err.details()}"
            return "OK"

        seen: list[str] = []
        answers: set[tuple[str, str]] = set()
        with bounded("the phases seen", 20):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and (not seen or seen[-1] != "normal"):
                before = phase()
                publish_answer = refusal(lambda: publish(stubs[0], stream_name, b"probe", ackPolicy=pb.NONE))
                part_answer = refusal(lambda: _meta_of_partition(stubs[leader], stream_name))
                if phase() == before:  # the answers belong to that phase
                    answers |= {(before, "publish " + publish_answer), (before, "partition " + part_answer)}
                if not seen or seen[-1] != before:
                    seen.append(before)
                time.sleep(0.02)
        order = ["no streams", "no leader", "hw unknown", "normal"]
        assert seen == order, seen
        assert ("no streams", f"publish NOT_FOUND no such stream: {stream_name}") in answers
        assert ("no streams", "partition NOT_FOUND partition not found") in answers
        assert ("no leader", f"publish NOT_FOUND no such stream: {stream_name}") in answers
        assert ("hw unknown", "publish OK") in answers
        leader, _ = _roles(server, stubs[0], stream_name)
        assert _all(stubs[leader], stream_name, 0) == [b"kept"]  # nothing committed was lost


def _meta_of_partition(stub: Stub, stream: str) -> pb.PartitionMetadata:
    req = pb.FetchPartitionMetadataRequest(stream=stream)
    return stub.FetchPartitionMetadata(req, timeout=TIMEOUT).metadata


def test_metadata_keeps_paused_after_a_publish_resumed_the_partition(fast_cluster: DevServer, stream_name: str) -> None:
    stubs = _stubs(fast_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    stubs[0].PauseStream(pb.PauseStreamRequest(name=stream_name), timeout=TIMEOUT)
    assert publish(stubs[1], stream_name, b"wake", ackPolicy=pb.ALL).ack.offset == 0
    assert _meta(stubs[2], stream_name).paused is True  # as the real server's FetchMetadata
    leader, _ = _roles(fast_cluster, stubs[0], stream_name)
    part = stubs[leader].FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream_name), timeout=TIMEOUT)
    assert part.metadata.paused is True  # FetchPartitionMetadata too, as the real server


def test_fault_hooks_need_a_cluster(devserver: DevServer) -> None:
    with pytest.raises(ServerStateError, match="one broker"):
        devserver.stall_broker(0)


def test_fault_hooks_of_the_server_process() -> None:
    # Publish is refused for 2 s after a restart: long enough to be seen from a loaded machine.
    timings = ClusterTimings.fast(replica_max_lag_time=2.0, restart_no_leaders=2.0, restart_hw_unknown=2.5)
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data, brokers=3, timings=timings) as proc:
        stubs = _stubs(proc.addresses)
        create(stubs[0], "proc", replicationFactor=3)
        known_everywhere(stubs, "proc")
        leader, (f1, f2) = _roles(proc, stubs[0], "proc")
        lead = stubs[leader]
        proc.stall_broker(f1)
        publish(lead, "proc", b"a", ackPolicy=pb.LEADER)
        assert (_meta(lead, "proc").highWatermark, _meta(lead, "proc").newestOffset) == (-1, 0)
        proc.resume_broker(f1)
        _wait_for("the commit", lambda: _meta(lead, "proc").highWatermark == 0)
        proc.kill_broker(f2)
        _wait_for("the killed follower to leave the ISR", lambda: f"broker-{f2}" not in _meta(lead, "proc").isr)
        proc.start_broker(f2)
        assert f"broker-{f2}" in _meta(lead, "proc").isr
        proc.restart_cluster()
        err = rpc_error(stubs[0].Publish, pb.PublishRequest(stream="proc", value=b"b"), timeout=TIMEOUT)
        assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "no such stream: proc")
        _wait_for("the restart window to end", lambda: _meta(stubs[0], "proc").highWatermark == 0)
        with pytest.raises(Exception, match="no broker 9"):
            proc.stall_broker(9)


def test_publish_async_acks_follow_the_ack_policy(holding_cluster: DevServer, stream_name: str) -> None:
    stubs = _stubs(holding_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _roles(holding_cluster, stubs[0], stream_name)
    holding_cluster.stall_broker(f1)
    requests = [
        pb.PublishRequest(stream=stream_name, value=b"all", correlationId="all", ackPolicy=pb.ALL),
        pb.PublishRequest(stream=stream_name, value=b"leader", correlationId="leader", ackPolicy=pb.LEADER),
    ]
    release = threading.Event()

    def gen() -> Iterator[pb.PublishRequest]:
        yield from requests
        release.wait(TIMEOUT)  # keep the stream open while the ALL ack is pending

    call = stubs[leader].PublishAsync(gen(), timeout=TIMEOUT)
    first = next(call)
    assert (first.correlationId, first.ack.offset) == ("leader", 1)  # the LEADER ack comes first
    holding_cluster.resume_broker(f1)
    second = next(call)
    assert (second.correlationId, second.ack.offset, second.ack.ackPolicy) == ("all", 0, pb.ALL)
    release.set()
    call.cancel()


def test_a_stalled_leader_is_replaced_and_follows_when_it_resumes(holding_cluster: DevServer, stream_name: str) -> None:
    stubs = _stubs(holding_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _roles(holding_cluster, stubs[0], stream_name)
    publish(stubs[leader], stream_name, b"a", ackPolicy=pb.ALL)
    holding_cluster.stall_broker(leader)
    # Calls to the frozen broker wait (here past their deadline), as with a SIGSTOPped process.
    err = rpc_error(stubs[leader].FetchMetadata, pb.FetchMetadataRequest(), timeout=0.3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait_for("a new leader", lambda: _meta(stubs[f1], stream_name).leader not in ("", f"broker-{leader}"))
    new_lead = stubs[int(_meta(stubs[f1], stream_name).leader.rsplit("-", 1)[1])]
    assert publish(new_lead, stream_name, b"b", ackPolicy=pb.LEADER).ack.offset == 1
    holding_cluster.resume_broker(leader)
    # The former leader answers again, as a follower: it does not serve the partition's reads.
    sub = subscribe(stubs[leader], pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST))
    assert (sub.code, sub.details) == (grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
    _wait_for("the former leader to rejoin the ISR", lambda: f"broker-{leader}" in _meta(new_lead, stream_name).isr)
    assert _all(new_lead, stream_name, 1) == [b"a", b"b"]


def test_a_killed_and_restarted_cluster_process_goes_through_the_restart_window(tmp_path: Path) -> None:
    timings = ClusterTimings.fast(restart_no_streams=0.5, restart_no_leaders=2.0, restart_hw_unknown=2.5)
    with DevServerProcess(tmp_path, brokers=3, timings=timings) as proc:
        stubs = _stubs(proc.addresses)
        create(stubs[0], "restarted", replicationFactor=3)
        publish(stubs[0], "restarted", b"kept", ackPolicy=pb.ALL)
        proc.kill()
        proc.start()  # SIGKILL of the whole process, then a start on the same data: a full-cluster restart
        stubs = _stubs(proc.addresses)
        err = rpc_error(stubs[1].Publish, pb.PublishRequest(stream="restarted", value=b"x"), timeout=TIMEOUT)
        assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, "no such stream: restarted")
        _wait_for("the restart window to end", lambda: _meta(stubs[0], "restarted").highWatermark == 0, timeout=20)
        leader, _ = _roles(proc, stubs[0], "restarted")
        assert _all(stubs[leader], "restarted", 0) == [b"kept"]


def test_a_subscriber_waiting_out_the_restart_window_gets_the_committed_messages(stream_name: str) -> None:
    timings = ClusterTimings.fast(restart_no_streams=0.05, restart_no_leaders=0.1, restart_hw_unknown=1.5)
    with DevServer(brokers=3, timings=timings) as server:
        stubs = _stubs(server.addresses)
        create(stubs[0], stream_name, replicationFactor=3)
        known_everywhere(stubs, stream_name)
        publish(stubs[0], stream_name, b"kept", ackPolicy=pb.ALL)
        server.restart_cluster()
        _wait_for("partition leaders", lambda: _meta(stubs[0], stream_name).leader != "")
        leader, _ = _roles(server, stubs[0], stream_name)
        assert _meta(stubs[0], stream_name).highWatermark == -1  # committed, but not known yet
        req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST)
        assert subscribe(stubs[leader], req, count=1).offsets == [0]  # delivered once the window ends
