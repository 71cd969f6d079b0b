"""Cluster mode: several brokers in one process, leaders spread, failover when a leader stops."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer

from .helpers import TIMEOUT, create, known_everywhere, partition_meta, publish, rpc_error, subscribe, user_streams


def _stubs(cluster: DevServer) -> list[api_pb2_grpc.APIStub]:
    return [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in cluster.addresses]


def test_metadata_lists_every_broker_and_spreads_leaders(cluster: DevServer) -> None:
    stubs = _stubs(cluster)
    # Five partitions and the __cursors partition (led by broker 0): two leaderships each.
    create(stubs[1], "spread", partitions=5, replicationFactor=3)  # admin calls work on any broker
    known_everywhere(stubs, "spread")
    meta = stubs[2].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT)
    assert [(b.id, f"{b.host}:{b.port}") for b in meta.brokers] == list(
        zip(cluster.broker_ids, cluster.addresses, strict=True)
    )
    assert [b.leaderCount for b in meta.brokers] == [2, 2, 2]
    assert [b.partitionCount for b in meta.brokers] == [6, 6, 6]
    parts = user_streams(meta)[0].partitions
    assert {parts[p].leader for p in parts} == set(cluster.broker_ids)
    assert all(len(parts[p].replicas) == 3 and list(parts[p].isr) == list(parts[p].replicas) for p in parts)


#: ``replica_max_lag_time`` of ``isr_cluster``. A caught-up follower asks its leader again a third
#: of it after its last fetch (``IDLE``; Liftbridge's ``replica.max.idle.wait`` plays that part),
#: and a new high watermark does not wake it: it learns of a commit up to ``IDLE`` after the ack.
ISR_LAG = 6.0
IDLE = ISR_LAG / 3
#: A read from an ISR replica waits for that, twice over, beside the usual call deadline.
ISR_READ_TIMEOUT = TIMEOUT + 2 * IDLE


@pytest.fixture
def isr_cluster() -> Iterator[DevServer]:
    """Three brokers whose followers check in every ``IDLE`` (2 s) rather than the default 5 s."""
    with DevServer(brokers=3, timings=ClusterTimings(replica_max_lag_time=ISR_LAG)) as server:
        yield server


def _hold_for_a_second(cluster: DevServer, index: int, after: float) -> threading.Thread:
    """From ``after`` seconds on, hold broker ``index`` still for a second (as a SIGSTOP would)."""

    def hold() -> None:
        time.sleep(max(0.0, after))
        cluster.stall_broker(index)
        time.sleep(1.0)
        cluster.resume_broker(index)

    thread = threading.Thread(target=hold, name="hold-broker")
    thread.start()
    return thread


@pytest.mark.parametrize("held", [False, True], ids=["quiet", "follower-held-1s"])
def test_non_leader_refuses_subscribe_and_partition_metadata(isr_cluster: DevServer, held: bool) -> None:
    """An ISR replica serves a read once it has learnt the high watermark, which takes up to one
    of its idle waits after the ack; ``follower-held-1s`` holds that follower still for a second
    around the moment it checks in (as a busy machine does), which the read's deadline covers."""
    cluster = isr_cluster
    stubs = _stubs(cluster)
    create(stubs[0], "lead", replicationFactor=3)
    known_everywhere(stubs, "lead")
    publish(stubs[2], "lead", b"v")  # publish works on any broker
    acked = time.monotonic()
    leader = user_streams(stubs[0].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT))[0].partitions[0].leader
    li = cluster.broker_ids.index(leader)
    follower = stubs[(li + 1) % 3]
    holding = _hold_for_a_second(cluster, (li + 1) % 3, IDLE - 0.5 - (time.monotonic() - acked)) if held else None
    try:
        sub = subscribe(follower, pb.SubscribeRequest(stream="lead", startPosition=pb.EARLIEST))
        assert (sub.code, sub.details, sub.messages) == (
            grpc.StatusCode.FAILED_PRECONDITION,
            "Server not partition leader",
            [],
        )
        assert rpc_error(partition_meta, follower, "lead").code() == grpc.StatusCode.FAILED_PRECONDITION
        # An ISR replica may serve reads when asked to.
        req = pb.SubscribeRequest(stream="lead", startPosition=pb.EARLIEST, readISRReplica=True)
        assert subscribe(follower, req, count=1, timeout=ISR_READ_TIMEOUT).offsets == [0]
    finally:
        if holding is not None:
            holding.join()
    assert subscribe(stubs[li], pb.SubscribeRequest(stream="lead", startPosition=pb.EARLIEST), count=1).offsets == [0]


def test_leader_failover_and_restart(cluster: DevServer) -> None:
    stubs = _stubs(cluster)
    create(stubs[0], "fail", replicationFactor=2)
    known_everywhere(stubs, "fail")
    for i in range(3):
        publish(stubs[0], "fail", b"%d" % i)
    old = user_streams(stubs[0].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT))[0].partitions[0]
    li = cluster.broker_ids.index(old.leader)
    cluster.stop_broker(li)
    dead = stubs[li]
    assert rpc_error(dead.FetchMetadata, pb.FetchMetadataRequest(), timeout=1).code() == grpc.StatusCode.UNAVAILABLE
    alive = stubs[(li + 1) % 3]
    meta = alive.FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT)
    assert old.leader not in {b.id for b in meta.brokers}
    new = user_streams(meta)[0].partitions[0]
    assert new.leader != old.leader and new.leader in old.replicas  # moved to the live replica
    assert old.leader not in new.isr
    ni = cluster.broker_ids.index(new.leader)
    assert subscribe(stubs[ni], pb.SubscribeRequest(stream="fail", startPosition=pb.EARLIEST), count=3).offsets == [
        0,
        1,
        2,
    ]
    assert publish(stubs[ni], "fail", b"more").ack.offset == 3
    cluster.start_broker(li)
    back = stubs[li].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT, wait_for_ready=True)
    assert len(back.brokers) == 3
    part = user_streams(back)[0].partitions[0]
    assert part.leader == new.leader and old.leader in part.isr  # rejoins the ISR, leadership stays


def test_subscription_on_stopped_leader_ends_unavailable(cluster: DevServer) -> None:
    stubs = _stubs(cluster)
    create(stubs[0], "cut")
    leader = user_streams(stubs[0].FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT))[0].partitions[0].leader
    li = cluster.broker_ids.index(leader)
    call = stubs[li].Subscribe(pb.SubscribeRequest(stream="cut"), timeout=10)
    assert next(call).ByteSize() == 0  # handshake
    cluster.stop_broker(li)
    try:
        next(call)
        raise AssertionError("the subscription should have ended")
    except grpc.RpcError as err:
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
