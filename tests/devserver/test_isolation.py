"""A broker cut off from its peers while its clients still reach it (devserver/isolation.py): the
minority leader of issue 59. As on Liftbridge, whose brokers talk to each other only through NATS:
it commits nothing (no ALL ack ever), the majority elects a new leader (a new metadata leader
first, if it was that), it answers from what it last knew, and when the cut heals it cuts back the
tail the new leader never had and follows.

Raw generated stubs, a fresh 3-broker server per test. Waits poll an observable state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from airflow_provider_liftbridge.devserver.errors import ServerStateError
from tests import margins

from .helpers import TIMEOUT, create, known_everywhere, rpc_error, subscribe

Stub = api_pb2_grpc.APIStub
#: Leadership moves 3 s after the cut (a publish right after it still finds the old leader,
#: however slow the machine); the stream needs 2 replicas in sync to commit.
TIMINGS = ClusterTimings.fast(min_insync_replicas=2, replica_max_leader_timeout=3.0)


@pytest.fixture
def cluster3() -> Iterator[DevServer]:
    with DevServer(brokers=3, timings=TIMINGS) as server:
        yield server


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    margins.wait_until(check, timeout, what, interval=0.02)


def _partition(stub: Stub, stream: str) -> pb.PartitionMetadata:
    meta = stub.FetchMetadata(pb.FetchMetadataRequest(streams=[stream]), timeout=TIMEOUT)
    return meta.streamMetadata[0].partitions[0]


def _publish(stub: Stub, stream: str, value: bytes, policy: int, timeout: float = TIMEOUT) -> pb.Ack:
    req = pb.PublishRequest(stream=stream, value=value, ackPolicy=policy)  # type: ignore[arg-type]
    return stub.Publish(req, timeout=timeout).ack


def _setup(server: DevServer, stream: str) -> tuple[list[Stub], int, list[int]]:
    stubs = [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in server.addresses]
    create(stubs[0], stream, replicationFactor=3)
    known_everywhere(stubs, stream)
    leader = server.broker_ids.index(_partition(stubs[0], stream).leader)
    assert _publish(stubs[leader], stream, b"committed", pb.ALL).offset == 0
    return stubs, leader, [i for i in range(3) if i != leader]


def _values(stub: Stub, stream: str, count: int) -> list[bytes]:
    req = pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST)
    return [m.value for m in subscribe(stub, req, count=count).data]


def test_a_leader_cut_from_its_peers_acks_as_leader_never_all_and_loses_that_tail(
    cluster3: DevServer, stream_name: str
) -> None:
    stubs, leader, (f1, f2) = _setup(cluster3, stream_name)
    cluster3.move_metadata_leader(leader)  # the majority must elect a metadata leader first
    cluster3.cut_broker_from_peers(leader)
    # It still takes what it leads: a LEADER ack, and an ALL ack that never comes.
    assert _publish(stubs[leader], stream_name, b"leader-acked", pb.LEADER).offset == 1
    err = rpc_error(
        stubs[leader].Publish, pb.PublishRequest(stream=stream_name, value=b"never", ackPolicy=pb.ALL), timeout=0.5
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The majority elects a new leader; the cut-off broker still names itself, with its own marks.
    _wait_for(
        "a new leader",
        lambda: _partition(stubs[f1], stream_name).leader in (cluster3.broker_ids[f1], cluster3.broker_ids[f2]),
    )
    assert cluster3.metadata_leader != leader
    new = cluster3.broker_ids.index(_partition(stubs[f1], stream_name).leader)
    assert cluster3.broker_ids[leader] not in _partition(stubs[new], stream_name).isr
    stale = _partition(stubs[leader], stream_name)
    assert stale.leader == cluster3.broker_ids[leader]
    own = stubs[leader].FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream_name), timeout=TIMEOUT)
    assert (own.metadata.highWatermark, own.metadata.newestOffset) == (0, 2)
    # A publish it takes now is lost: the partition's new leader has it, not the cut-off broker.
    err = rpc_error(
        stubs[leader].Publish, pb.PublishRequest(stream=stream_name, value=b"lost", ackPolicy=pb.LEADER), timeout=0.5
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _publish(stubs[new], stream_name, b"after", pb.ALL).offset == 1
    cluster3.heal_broker(leader)
    # It learns the new leader, cuts back what it alone had, follows and rejoins the ISR.
    _wait_for("the healed broker back in the ISR", lambda: len(_partition(stubs[new], stream_name).isr) == 3)
    assert _partition(stubs[leader], stream_name).leader == cluster3.broker_ids[new]
    assert _values(stubs[new], stream_name, 2) == [b"committed", b"after"]
    req = pb.SubscribeRequest(stream=stream_name, startPosition=pb.EARLIEST, readISRReplica=True)
    assert [m.value for m in subscribe(stubs[leader], req, count=2).data] == [b"committed", b"after"]


def test_a_broker_cut_from_nats_takes_nothing_and_its_leadership_moves(cluster3: DevServer, stream_name: str) -> None:
    stubs, leader, (f1, _) = _setup(cluster3, stream_name)
    cluster3.cut_broker_from_nats(leader)
    err = rpc_error(
        stubs[leader].Publish, pb.PublishRequest(stream=stream_name, value=b"x", ackPolicy=pb.LEADER), timeout=0.5
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    _wait_for(
        "a new leader", lambda: _partition(stubs[f1], stream_name).leader not in ("", cluster3.broker_ids[leader])
    )
    new = cluster3.broker_ids.index(_partition(stubs[f1], stream_name).leader)
    own = stubs[leader].FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream_name), timeout=TIMEOUT)
    assert (own.metadata.leader, own.metadata.newestOffset) == (cluster3.broker_ids[leader], 0)
    # Subscribers on it read what it had committed, no more.
    assert _values(stubs[leader], stream_name, 1) == [b"committed"]
    assert _publish(stubs[new], stream_name, b"after", pb.ALL).offset == 1
    cluster3.heal_broker(leader)
    _wait_for("the healed broker back in the ISR", lambda: len(_partition(stubs[new], stream_name).isr) == 3)


def test_a_follower_cut_off_leaves_the_isr_and_a_new_stream_is_unknown_to_it(
    cluster3: DevServer, stream_name: str
) -> None:
    stubs, leader, (f1, f2) = _setup(cluster3, stream_name)
    cluster3.cut_broker_from_nats(f1)
    _wait_for("the cut-off follower out of the ISR", lambda: len(_partition(stubs[leader], stream_name).isr) == 2)
    assert _publish(stubs[leader], stream_name, b"two in sync", pb.ALL).offset == 1
    later = f"{stream_name}-later"
    create(stubs[leader], later, replicationFactor=1)
    known_everywhere([stubs[leader], stubs[f2]], later)
    missing = stubs[f1].FetchMetadata(pb.FetchMetadataRequest(streams=[later]), timeout=TIMEOUT)
    assert missing.streamMetadata[0].error == pb.StreamMetadata.UNKNOWN_STREAM
    cluster3.heal_broker(f1)
    _wait_for("the follower back in the ISR", lambda: len(_partition(stubs[leader], stream_name).isr) == 3)


def test_cutting_needs_a_cluster() -> None:
    with DevServer(brokers=1) as single, pytest.raises(ServerStateError, match="has one broker"):
        single.cut_broker_from_peers(0)


# -- one way, slow, lossy (the kinds of a cut, isolation.KINDS) ---------------------------------

#: Leadership would move only a minute after the cut: what a cut-off leader takes before the
#: election, and what becomes of it when the cut heals first.
LATE_ELECTION = ClusterTimings.fast(min_insync_replicas=2, replica_max_leader_timeout=60.0)


@pytest.fixture
def late_election() -> Iterator[DevServer]:
    with DevServer(brokers=3, timings=LATE_ELECTION) as server:
        yield server


def _lost(stub: Stub, stream: str, value: bytes, policy: int = pb.ALL) -> None:
    """A publish whose ack never comes: it ends at its (short) deadline."""
    err = rpc_error(stub.Publish, pb.PublishRequest(stream=stream, value=value, ackPolicy=policy), timeout=0.5)  # type: ignore[arg-type]
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def _own(stub: Stub, stream: str) -> pb.PartitionMetadata:
    return stub.FetchPartitionMetadata(pb.FetchPartitionMetadataRequest(stream=stream), timeout=TIMEOUT).metadata


def test_a_leader_cut_out_takes_what_reaches_it_acks_none_of_it_and_commits_it_if_healed_first(
    late_election: DevServer, stream_name: str
) -> None:
    stubs, leader, (f1, _) = _setup(late_election, stream_name)
    late_election.cut_broker_from_nats(leader, kind="cut-out")
    # Sent to it: lost on its way out to NATS. Sent to another broker: it reaches the leader,
    # which appends it and cannot commit it (no follower fetches) nor ack it (its acks are lost).
    _lost(stubs[leader], stream_name, b"lost on the way out", pb.LEADER)
    _lost(stubs[f1], stream_name, b"taken, never acked")
    _wait_for("the cut-off leader appended it", lambda: _own(stubs[leader], stream_name).newestOffset == 1)
    assert _own(stubs[leader], stream_name).highWatermark == 0
    # Healed before the majority elected another leader: it commits what it took.
    late_election.heal_broker(leader)
    assert _values(stubs[leader], stream_name, 2) == [b"committed", b"taken, never acked"]


def test_a_leader_cut_out_learns_the_new_leader(cluster3: DevServer, stream_name: str) -> None:
    stubs, leader, (f1, _) = _setup(cluster3, stream_name)
    cluster3.cut_broker_from_nats(leader, kind="cut-out")
    _wait_for("a new leader", lambda: _partition(stubs[f1], stream_name).leader != cluster3.broker_ids[leader])
    new = _partition(stubs[f1], stream_name).leader
    # The Raft log still reaches it: it names the new leader and no longer serves as leader
    # (cut both ways, it would name itself: test_a_broker_cut_from_nats_takes_nothing...).
    assert _partition(stubs[leader], stream_name).leader == new
    err = rpc_error(
        stubs[leader].FetchPartitionMetadata, pb.FetchPartitionMetadataRequest(stream=stream_name), timeout=TIMEOUT
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    cluster3.heal_broker(leader)
    _wait_for("the healed broker back in the ISR", lambda: len(_partition(stubs[f1], stream_name).isr) == 3)


def test_a_leader_cut_in_takes_nothing_and_what_it_forwards_later_is_stored_unacked(
    cluster3: DevServer, stream_name: str
) -> None:
    stubs, leader, (f1, f2) = _setup(cluster3, stream_name)
    cluster3.cut_broker_from_nats(leader, kind="cut-in")
    _lost(stubs[f1], stream_name, b"never reaches it")
    _wait_for("a new leader", lambda: _partition(stubs[f1], stream_name).leader != cluster3.broker_ids[leader])
    new = cluster3.broker_ids.index(_partition(stubs[f1], stream_name).leader)
    # It learns nothing: it still names itself. What it forwards reaches the new leader, which
    # stores it; the ack never comes back to it.
    assert _partition(stubs[leader], stream_name).leader == cluster3.broker_ids[leader]
    _lost(stubs[leader], stream_name, b"stored, never acked")
    assert _values(stubs[new], stream_name, 2) == [b"committed", b"stored, never acked"]
    cluster3.heal_broker(leader)
    _wait_for("the healed broker back in the ISR", lambda: len(_partition(stubs[new], stream_name).isr) == 3)


def test_a_follower_cut_in_is_counted_by_its_leader_until_it_falls_behind(stream_name: str) -> None:
    # A lag time well past the followers' check-in interval (a third of it): a follower whose
    # requests reach the leader is seen many times within it.
    timings = ClusterTimings.fast(replica_max_lag_time=3.0, replica_max_leader_timeout=3.0)
    with DevServer(brokers=3, timings=timings) as server:
        stubs, leader, (f1, f2) = _setup(server, stream_name)
        server.cut_broker_from_nats(f1, kind="cut-in")
        server.cut_broker_from_nats(f2)
        ids = server.broker_ids
        _wait_for(
            "the follower cut both ways out of the ISR",
            lambda: ids[f2] not in _partition(stubs[leader], stream_name).isr,
        )
        # Its fetch requests reach the leader (its answers do not): caught up, it stays in the ISR.
        assert ids[f1] in _partition(stubs[leader], stream_name).isr
        # Once there is something it cannot fetch, it falls behind and leaves; then ALL commits.
        assert _publish(stubs[leader], stream_name, b"after", pb.ALL).offset == 1
        assert _partition(stubs[leader], stream_name).isr == [ids[leader]]


def test_a_slow_leader_keeps_its_partitions_and_takes_what_came_late(cluster3: DevServer, stream_name: str) -> None:
    stubs, leader, (f1, _) = _setup(cluster3, stream_name)
    cluster3.cut_broker_from_nats(leader, kind="slow")
    # The deadline ends before the message can reach the leader (it waits on the way out and on
    # the way in): it is appended all the same.
    err = rpc_error(
        stubs[leader].Publish, pb.PublishRequest(stream=stream_name, value=b"late", ackPolicy=pb.ALL), timeout=0.05
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert _values(stubs[leader], stream_name, 2) == [b"committed", b"late"]
    # Its peers keep it: it still leads, and commits (late).
    assert _publish(stubs[f1], stream_name, b"acked", pb.ALL, timeout=3 * TIMEOUT).offset == 2
    assert _partition(stubs[f1], stream_name).leader == cluster3.broker_ids[leader]
    cluster3.heal_broker(leader)


def test_a_lossy_leader_loses_some_publishes_and_every_ack_points_at_what_is_stored(
    cluster3: DevServer, stream_name: str
) -> None:
    stubs, leader, _ = _setup(cluster3, stream_name)
    cluster3.cut_broker_from_nats(leader, kind="lossy")
    acked: dict[int, bytes] = {}
    lost = 0
    for i in range(60):
        value = f"r{i}".encode()
        try:
            acked[_publish(stubs[leader], stream_name, value, pb.LEADER, timeout=0.5).offset] = value
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            lost += 1
    assert lost > 0 and acked  # each publish crosses the lossy link four times: out, in, out, in
    cluster3.heal_broker(leader)
    end = _partition(stubs[leader], stream_name).newestOffset
    stored = _values(stubs[leader], stream_name, end + 1)
    assert all(stored[offset] == value for offset, value in acked.items())
    assert cluster3.broker_ids[leader] == _partition(stubs[leader], stream_name).leader


def test_an_unknown_kind_of_cut_is_refused(cluster3: DevServer) -> None:
    with pytest.raises(ValueError, match="unknown kind of cut 'sideways'"):
        cluster3.cut_broker_from_nats(0, kind="sideways")
