"""A minority leader (issue 59, item 3): the partition leader is cut off from its peers, or from
NATS and so from its peers, while the client still reaches it and publishes to it with ack policy
ALL. It can never commit (min ISR 2; its followers fetch nothing from it and it cannot shrink its
ISR), and the majority elects a new leader after the leader timeout.

What must hold: the publish ends in a typed error naming every record, or in a success whose every
ack points at a stored record; nothing acknowledged is lost when the cut heals; and the client
recovers through the new leader while the cut still lasts, although the cut-off broker keeps
answering with the metadata it last knew (itself as the leader). Before the client asked another
broker for metadata after an ack time-out (``ClientCore.suspect``), the gRPC publish after the
election went back to the cut-off broker and timed out again for as long as the cut lasted.

The cut is the dev server's fault hook (devserver/isolation.py; the brokers replicate in one
process, so no packet between them could be dropped): no network namespace is needed, and the
test runs wherever the dev cluster does.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, PublishError, Record
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServerProcess

from .campaign import DevRig, Outcome, Schedule, check, read_back, replica_of, run
from .cut_leader import replicated_stream, three_brokers, wait_for_new_leader

pytestmark = [pytest.mark.timeout(300)]

#: The campaign's timings with a minimum ISR of 2, but leadership moves only 5 s after the cut:
#: the publish reaches the cut-off leader while it still leads, however slow the machine.
TIMINGS = ClusterTimings.fast(
    replica_max_leader_timeout=5.0, replica_max_lag_time=3.0, replica_max_idle_wait=1.0, min_insync_replicas=2
)
#: Each record's ack wait: shorter than the leader timeout, so the first call ends in the minority.
ACK_WAIT = 1.5
RECORDS = 300


@pytest.fixture
def cluster() -> Iterator[DevServerProcess]:
    with three_brokers("minority-", TIMINGS) as server:
        yield server


#: How soon a publish to a leader cut off (any kind) must end, from the cut, in success or a typed
#: error: its acks time out after ``ACK_WAIT``, the client asks another broker for the leader
#: (``ClientCore.suspect``), the majority elects one after the leader timeout (for a cut one way
#: or both), and the publish recovers within the client's budget of an outage (``timeout``), its
#: re-sends waiting ``ACK_WAIT`` again; plus a margin for a busy machine.
CALL_TIMEOUT = 5.0
BOUND = TIMINGS.replica_max_leader_timeout + CALL_TIMEOUT + 2 * ACK_WAIT
SLACK = 8.0


def _schedule(path: str, how: str, kind: str = "cut") -> Schedule:
    return Schedule(
        seed=0,
        path="grpc" if path == "grpc" else "bulk-nats",
        target=f"broker-{how}",
        action=kind,
        moment="before",
        fraction=0.0,
        down=0.0,
        second_after=0.0,
        records=RECORDS,
        partitions=1,
    )


@pytest.mark.parametrize(("how", "kind"), [("peers", "cut"), ("nats", "cut"), ("nats", "cut-in"), ("nats", "cut-out")])
@pytest.mark.parametrize("path", ["grpc", "nats"])
def test_a_minority_leader_never_acknowledges_what_it_cannot_commit(
    cluster: DevServerProcess, stream_name: str, path: str, how: str, kind: str
) -> None:
    addresses = cluster.addresses
    leader, majority = replicated_stream(cluster, stream_name)
    # The cut-off broker first: the client's metadata comes from it until it gives reason not to.
    seeds = [addresses[leader], *majority]
    nats = [cluster.nats_url] if path == "nats" else []
    with LiftbridgeClient(seeds, nats_servers=nats, timeout=5.0, max_retries=8) as client:
        client.publish_many(stream_name, [Record(b"before the cut")], path=path, ack_policy=AckPolicy.ALL)
        (cluster.cut_broker_from_peers if how == "peers" else cluster.cut_broker_from_nats)(leader, kind)
        cut_at = time.monotonic()
        records = [Record(f"r{i:04d}".encode()) for i in range(RECORDS)]
        outcome = Outcome(records)
        try:
            outcome.acks = client.publish_many(
                stream_name, records, path=path, ack_policy=AckPolicy.ALL, timeout=ACK_WAIT
            )
        except PublishError as exc:
            outcome.errors.append(exc)
        took = time.monotonic() - cut_at
        assert took < BOUND + SLACK, f"the publish ended {took:.1f} s after the cut; bound {BOUND:g} s"
        if how == "peers" and path == "grpc":
            # It took what it was sent, and committed none of it.
            # (A raw call: the client would ask the broker's FetchMetadata first, whose survey of
            # its peers runs into the call's deadline when they cannot answer, as on Liftbridge.)
            with grpc.insecure_channel(addresses[leader]) as channel:
                request = pb.FetchPartitionMetadataRequest(stream=stream_name, partition=0)
                stale = api_pb2_grpc.APIStub(channel).FetchPartitionMetadata(request, timeout=5.0).metadata
            assert (stale.leader, stale.highWatermark) == (cluster.broker_ids[leader], 0)
            assert stale.newestOffset > 0
        wait_for_new_leader(cluster, majority, stream_name, leader)
        # While the cut lasts, the client publishes through the new leader.
        later = client.publish_many(stream_name, [Record(b"later")], path=path, ack_policy=AckPolicy.ALL)
        assert len(later) == 1
    cluster.heal_broker(leader)
    stored = read_back(addresses, stream_name, 1)
    assert check(_schedule(path, how, kind), outcome, stored) == []
    values = [m.value for m in stored]
    assert b"before the cut" in values and b"later" in values
    if outcome.acks is None:
        # No success: a typed error named every record it had no ack for.
        (error,) = outcome.errors
        assert error.acked + len(error.errors) == RECORDS


@pytest.mark.parametrize("kind", ["slow", "lossy"])
@pytest.mark.parametrize("path", ["grpc", "nats"])
def test_a_slow_or_lossy_leader_keeps_its_partitions_and_every_ack_is_true(
    cluster: DevServerProcess, stream_name: str, path: str, kind: str
) -> None:
    # Its peers keep it: no election. Acks come late (slow: past the ack wait) or not at all
    # (lossy: a burst past the link's queue, and a share of the rest), and the client re-sends.
    addresses = cluster.addresses
    leader, _ = replicated_stream(cluster, stream_name)
    leader_id = cluster.broker_ids[leader]
    nats = [cluster.nats_url] if path == "nats" else []
    records = [Record(f"r{i:04d}".encode()) for i in range(RECORDS)]
    outcome = Outcome(records)
    with LiftbridgeClient(addresses, nats_servers=nats, timeout=CALL_TIMEOUT, max_retries=8) as client:
        client.publish_many(stream_name, [Record(b"before the cut")], path=path, ack_policy=AckPolicy.ALL)
        cluster.cut_broker_from_nats(leader, kind)
        cut_at = time.monotonic()
        try:
            outcome.acks = client.publish_many(
                stream_name, records, path=path, ack_policy=AckPolicy.ALL, timeout=ACK_WAIT
            )
        except PublishError as exc:
            outcome.errors.append(exc)
        took = time.monotonic() - cut_at
    assert took < BOUND + SLACK, f"the publish ended {took:.1f} s after the cut; bound {BOUND:g} s"
    assert replica_of(addresses, stream_name, 0, "leader") == leader_id
    cluster.heal_broker(leader)
    stored = read_back(addresses, stream_name, 1)
    assert check(_schedule(path, "nats", kind), outcome, stored) == []
    if outcome.acks is None:
        (error,) = outcome.errors
        assert error.acked + len(error.errors) == RECORDS


def _cut_schedule(path: str, how: str, records: int, kind: str = "cut") -> Schedule:
    # seed 1 on 1 partition: the struck leader is partition 0's.
    return Schedule(
        seed=1,
        path=path,
        target=f"broker-{how}",
        action=kind,
        moment="during",
        fraction=0.3,
        down=6.0,
        second_after=0.0,
        records=records,
        partitions=1,
    )


#: The campaign's paths whose recovery reads what is stored (exactly-once) or re-sends (grpc).
MID_PUBLISH = [("exactly-once", 30000), ("exactly-once-occ", 30000), ("grpc", 1500)]


@pytest.mark.parametrize("how", ["peers", "nats"])
@pytest.mark.parametrize(("path", "records"), MID_PUBLISH)
def test_a_leader_cut_off_mid_publish_breaks_no_invariant(path: str, records: int, how: str) -> None:
    # The campaign's runs with the leader cut off for 6 s (three of its 2 s leader timeouts, two
    # of its 3 s ack waits: the client's recovery meets the cut-off leader after the election) at 30 %:
    # exactly-once reads the partition to decide what to send again, and the cut-off leader still
    # names itself leader of what it holds.
    _run_mid_publish(_cut_schedule(path, how, records))


@pytest.mark.parametrize("kind", ["cut-in", "cut-out", "slow", "lossy"])
@pytest.mark.parametrize(("path", "records"), MID_PUBLISH[::2])
def test_a_leader_cut_one_way_slow_or_lossy_mid_publish_breaks_no_invariant(path: str, records: int, kind: str) -> None:
    # The same runs with the leader's NATS link cut one way (a new leader after 2 s; cut out, it
    # learns of it and still takes what reaches it), slow (every message late: acks past the ack
    # wait, exactly-once's re-sends racing what is still on the way) or lossy.
    _run_mid_publish(_cut_schedule(path, "nats", records, kind))


def _run_mid_publish(schedule: Schedule) -> None:
    with DevRig(show_log=True) as rig:
        verdict = run(schedule, rig)
    assert verdict.violations == [], f"{schedule} ({verdict.struck}): {verdict.outcome}: {verdict.violations}"
    assert verdict.struck.startswith("with "), verdict  # it struck during the call
