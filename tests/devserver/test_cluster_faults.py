"""Cluster mode is as unkind as a real Liftbridge cluster (devserver/faults.py): a stalled broker
carries out what it received once it runs again, even after the client gave up; metadata changes
wait for a stalled metadata leader; FetchMetadata waits for a stalled peer unless its broker list is
cached; a new stream reaches the brokers other than the creating one a moment later.

Raw generated stubs, a fresh 3-broker server per test. Waits poll an observable state.
"""

from __future__ import annotations

import queue
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer, DevServerProcess
from tests import margins

from .helpers import TIMEOUT, create, known_everywhere, publish, rpc_error

Stub = api_pb2_grpc.APIStub
#: Followers stay in the ISR and leaders keep leading while a test looks (nothing moves by time-out).
STILL = ClusterTimings.fast(replica_max_lag_time=60.0, replica_max_leader_timeout=60.0, metadata_election_timeout=60.0)


def _stubs(addresses: list[str]) -> list[Stub]:
    return [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in addresses]


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    margins.wait_until(check, timeout, what, interval=0.02)


def _offsets(stub: Stub, stream: str) -> tuple[int, int]:
    """(high watermark, newest offset) of partition 0 as its leader reports them."""
    req = pb.FetchPartitionMetadataRequest(stream=stream)
    meta = stub.FetchPartitionMetadata(req, timeout=TIMEOUT).metadata
    return meta.highWatermark, meta.newestOffset


@pytest.fixture
def still_cluster() -> Iterator[DevServer]:
    with DevServer(brokers=3, timings=STILL) as server:
        yield server


def _leader_and_followers(stub: Stub, server: DevServer, stream: str) -> tuple[int, list[int]]:
    meta = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=TIMEOUT)
    leader = server.broker_ids.index(meta.streamMetadata[0].partitions[0].leader)
    return leader, [i for i in range(3) if i != leader]


def test_a_stalled_broker_carries_out_a_publish_the_client_gave_up_on(
    still_cluster: DevServer, stream_name: str
) -> None:
    stubs = _stubs(still_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _leader_and_followers(stubs[0], still_cluster, stream_name)
    still_cluster.stall_broker(f1)
    err = rpc_error(stubs[f1].Publish, pb.PublishRequest(stream=stream_name, value=b"late"), timeout=0.3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The leader sees nothing pending: "nothing above the high watermark" proves nothing here.
    assert _offsets(stubs[leader], stream_name) == (-1, -1)
    still_cluster.resume_broker(f1)
    _wait_for("the late copy", lambda: _offsets(stubs[leader], stream_name)[1] == 0)


def test_a_stalled_broker_carries_out_buffered_publish_async_requests(
    still_cluster: DevServer, stream_name: str
) -> None:
    stubs = _stubs(still_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _leader_and_followers(stubs[0], still_cluster, stream_name)
    requests: queue.Queue[pb.PublishRequest | None] = queue.Queue()

    def feed() -> Iterator[pb.PublishRequest]:
        while (req := requests.get()) is not None:
            yield req

    channel = grpc.insecure_channel(still_cluster.addresses[f1])
    call = api_pb2_grpc.APIStub(channel).PublishAsync(feed(), timeout=30)
    requests.put(pb.PublishRequest(stream=stream_name, value=b"0", correlationId="0", ackPolicy=pb.LEADER))
    assert next(call).correlationId == "0"
    still_cluster.stall_broker(f1)
    for i in range(1, 4):
        requests.put(pb.PublishRequest(stream=stream_name, value=b"%d" % i, correlationId=str(i), ackPolicy=pb.LEADER))
    time.sleep(0.3)  # the requests travel to the frozen broker; nothing can show that they arrived
    call.cancel()
    channel.close()
    assert _offsets(stubs[leader], stream_name)[1] == 0  # only the first one, so far
    still_cluster.resume_broker(f1)
    _wait_for("the held requests", lambda: _offsets(stubs[leader], stream_name)[1] == 3)


def test_a_publish_forwarded_to_a_stalled_leader_is_taken_when_it_resumes(
    still_cluster: DevServer, stream_name: str
) -> None:
    stubs = _stubs(still_cluster.addresses)
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    leader, (f1, _) = _leader_and_followers(stubs[0], still_cluster, stream_name)
    still_cluster.stall_broker(leader)
    err = rpc_error(stubs[f1].Publish, pb.PublishRequest(stream=stream_name, value=b"late"), timeout=0.3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    still_cluster.resume_broker(leader)
    _wait_for("the forwarded copy", lambda: _offsets(stubs[leader], stream_name)[1] == 0)


def test_metadata_changes_wait_for_a_stalled_metadata_leader(still_cluster: DevServer, stream_name: str) -> None:
    stubs = _stubs(still_cluster.addresses)
    assert still_cluster.metadata_leader == 0
    still_cluster.stall_broker(0)
    req = pb.CreateStreamRequest(name=stream_name, subject=stream_name)
    assert rpc_error(stubs[1].CreateStream, req, timeout=0.3).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    still_cluster.resume_broker(0)
    create(stubs[1], f"{stream_name}-b")
    still_cluster.move_metadata_leader(2)
    still_cluster.stall_broker(2)
    req = pb.CreateStreamRequest(name=f"{stream_name}-c", subject=stream_name)
    assert rpc_error(stubs[0].CreateStream, req, timeout=0.3).code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_another_metadata_leader_is_elected_after_the_election_timeout(stream_name: str) -> None:
    with DevServer(brokers=3, timings=ClusterTimings.fast(metadata_election_timeout=0.3)) as server:
        stubs = _stubs(server.addresses)
        server.stall_broker(0)
        create(stubs[1], stream_name)  # waits out the election
        assert server.metadata_leader == 1
        server.resume_broker(0)
        assert server.metadata_leader == 1  # the old leader comes back as a follower


def test_fetch_metadata_waits_for_a_stalled_peer_unless_its_broker_list_is_cached(still_cluster: DevServer) -> None:
    stubs = _stubs(still_cluster.addresses)
    still_cluster.stall_broker(2)
    err = rpc_error(stubs[1].FetchMetadata, pb.FetchMetadataRequest(), timeout=0.3)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    still_cluster.resume_broker(2)
    assert len(stubs[1].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT).brokers) == 3
    still_cluster.stall_broker(2)
    assert stubs[1].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT).brokers  # cached: no survey
    still_cluster.resume_broker(2)


def test_a_new_stream_reaches_the_other_brokers_a_moment_later(stream_name: str) -> None:
    # A propagation delay long enough to be seen from a loaded machine.
    with DevServer(brokers=3, timings=ClusterTimings.fast(stream_propagation=1.5)) as server:
        stubs = _stubs(server.addresses)
        server.move_metadata_leader(2)
        create(stubs[0], stream_name)  # forwarded to the metadata leader (broker 2)
        meta = stubs[2].FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
        leader = server.broker_ids.index(meta.streamMetadata[0].partitions[0].leader)
        # The metadata leader and the partition leader know it at once, any other broker not yet.
        assert publish(stubs[leader], stream_name, b"a", ackPolicy=pb.LEADER).ack.offset == 0
        lagging = next(i for i in range(3) if i not in (2, leader))
        err = rpc_error(stubs[lagging].Publish, pb.PublishRequest(stream=stream_name, value=b"b"), timeout=TIMEOUT)
        assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, f"no such stream: {stream_name}")
        meta = stubs[lagging].FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
        assert meta.streamMetadata[0].error == pb.StreamMetadata.UNKNOWN_STREAM
        known_everywhere(stubs, stream_name, timeout=10.0)
        assert publish(stubs[lagging], stream_name, b"b", ackPolicy=pb.LEADER).ack.offset == 1


def test_a_metadata_leader_frozen_before_telling_the_others_holds_a_new_stream_back(stream_name: str) -> None:
    # Raft followers apply a committed entry themselves, but learn of the commit from the leader:
    # frozen at once, it has told no one, and they learn it only when it (or a successor) runs.
    delay = 2.0
    with DevServer(brokers=3, timings=replace(STILL, stream_propagation=delay)) as server:
        stubs = _stubs(server.addresses)
        server.move_metadata_leader(2)
        started = time.monotonic()
        create(stubs[2], stream_name)
        server.stall_broker(2)
        assert time.monotonic() - started < delay  # frozen before the others learned of the commit
        time.sleep(max(0.0, started + delay + 0.2 - time.monotonic()))  # the delay is over: still unknown
        answers = {}
        for i in (0, 1):
            try:
                answers[i] = publish(stubs[i], stream_name, b"x", ackPolicy=pb.LEADER).ack.offset >= 0
            except grpc.RpcError as err:
                assert (err.code(), err.details()) == (grpc.StatusCode.NOT_FOUND, f"no such stream: {stream_name}")
                answers[i] = False
        server.resume_broker(2)
        meta = stubs[2].FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
        leader = server.broker_ids.index(meta.streamMetadata[0].partitions[0].leader)
        # Only the partition leader (started by the metadata leader before it answered) knew it.
        assert answers == {i: i == leader for i in (0, 1)}
        known_everywhere(stubs, stream_name, timeout=10.0)  # the thawed leader tells them
        server.stall_broker(2)  # frozen after they applied it: nothing is taken back
        assert all(publish(stubs[i], stream_name, b"y", ackPolicy=pb.LEADER).ack.offset >= 0 for i in (0, 1))
        server.resume_broker(2)


def test_the_metadata_leader_hook_of_the_server_process(stream_name: str) -> None:
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data, brokers=3, timings=STILL) as proc:
        stubs = _stubs(proc.addresses)
        assert proc.metadata_leader == 0
        proc.move_metadata_leader(1)
        assert proc.metadata_leader == 1  # asked of the child: the question changes nothing
        listed = stubs[2].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT).brokers
        assert {(b.id, f"{b.host}:{b.port}") for b in listed} == set(zip(proc.broker_ids, proc.addresses, strict=True))
        proc.stall_broker(1)
        req = pb.CreateStreamRequest(name=stream_name, subject=stream_name)
        assert rpc_error(stubs[0].CreateStream, req, timeout=0.3).code() == grpc.StatusCode.DEADLINE_EXCEEDED
        proc.resume_broker(1)
        create(stubs[0], f"{stream_name}-b")
