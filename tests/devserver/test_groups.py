"""Consumer groups of the dev server over raw gRPC stubs (docs/consumer-groups.md).

Checked against upstream Liftbridge's behaviour (server/groups.go, api.go, failover.go): status codes and
messages, epoch 0 for a new group, balanced assignments, the assignment fetch as heartbeat, member
timeout, and coordinator failover after a majority of members report the coordinator.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import DevServer
from tests import margins
from tests.margins import bounded

from .helpers import TIMEOUT, create, rpc_error

Stub = api_pb2_grpc.APIStub


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def join(stub: Stub, group: str, consumer: str, *streams: str) -> pb.JoinConsumerGroupResponse:
    req = pb.JoinConsumerGroupRequest(groupId=group, consumerId=consumer, streams=list(streams))
    return stub.JoinConsumerGroup(req, timeout=TIMEOUT)


def fetch(stub: Stub, group: str, consumer: str, epoch: int = 0) -> tuple[dict[str, list[int]], int]:
    req = pb.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId=consumer, epoch=epoch)
    resp = stub.FetchConsumerGroupAssignments(req, timeout=TIMEOUT)
    return {a.stream: list(a.partitions) for a in resp.assignments}, resp.epoch


def leave(stub: Stub, group: str, consumer: str) -> None:
    stub.LeaveConsumerGroup(pb.LeaveConsumerGroupRequest(groupId=group, consumerId=consumer), timeout=TIMEOUT)


def group_meta(stub: Stub, group: str) -> pb.ConsumerGroupMetadata:
    return stub.FetchMetadata(pb.FetchMetadataRequest(groups=[group]), timeout=TIMEOUT).groupMetadata[0]


def test_join_creates_group_with_epoch_zero_and_all_partitions(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name, partitions=3)
    group = _group()
    resp = join(stub, group, "c1", stream_name)
    assert (resp.coordinator, resp.epoch) == ("broker-0", 0)
    assert resp.consumerTimeout == 15 * 10**9 and resp.coordinatorTimeout == 15 * 10**9  # nanoseconds, as upstream
    assert fetch(stub, group, "c1") == ({stream_name: [0, 1, 2]}, 0)
    meta = group_meta(stub, group)
    assert (meta.groupId, meta.error, meta.coordinator, meta.epoch) == (
        group,
        pb.ConsumerGroupMetadata.OK,
        "broker-0",
        0,
    )


def test_join_and_leave_rebalance_and_bump_the_epoch(stub: Stub, stream_name: str) -> None:
    other = stream_name + "-b"
    create(stub, stream_name, partitions=3)
    create(stub, other, partitions=1)
    group = _group()
    join(stub, group, "c1", stream_name, other)
    second = join(stub, group, "c2", stream_name)
    assert second.epoch == 1
    a1, e1 = fetch(stub, group, "c1", second.epoch)
    a2, e2 = fetch(stub, group, "c2", second.epoch)
    assert e1 == e2 == 1
    # Upstream's greedy balance, stream by stream in name order: each partition to the subscriber with
    # the fewest assignments so far (ties: the smaller id); only c1 consumes the second stream.
    assert a1 == {stream_name: [0, 2], other: [0]}
    assert a2 == {stream_name: [1]}
    leave(stub, group, "c2")
    # The leave moved the epoch: a fetch with the old one is refused (v1.9), the metadata has the new one.
    err = rpc_error(fetch, stub, group, "c1", 1)
    assert (err.code(), err.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "client-provided group epoch differs from broker group epoch",
    )
    assert group_meta(stub, group).epoch == 2
    assert fetch(stub, group, "c1", 2) == ({stream_name: [0, 1, 2], other: [0]}, 2)
    leave(stub, group, "c1")
    assert group_meta(stub, group).error == pb.ConsumerGroupMetadata.UNKNOWN_GROUP  # the last member deletes it


def test_more_members_than_partitions_leaves_one_on_standby(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    group = _group()
    join(stub, group, "a", stream_name)
    join(stub, group, "b", stream_name)
    assignments = [fetch(stub, group, c, 1)[0] for c in ("a", "b")]
    assert sorted(assignments, key=len) == [{}, {stream_name: [0]}]


def test_refusals_use_upstream_codes_and_messages(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    group = _group()
    join_req, leave_req = pb.JoinConsumerGroupRequest, pb.LeaveConsumerGroupRequest
    fetch_req, report_req = pb.FetchConsumerGroupAssignmentsRequest, pb.ReportConsumerGroupCoordinatorRequest
    missing = "nope-" + stream_name
    cases = [
        (stub.JoinConsumerGroup, join_req(consumerId="c", streams=["s"]), "INVALID_ARGUMENT", "No groupId provided"),
        (stub.JoinConsumerGroup, join_req(groupId=group, streams=["s"]), "INVALID_ARGUMENT", "No consumerId provided"),
        (stub.JoinConsumerGroup, join_req(groupId=group, consumerId="c"), "INVALID_ARGUMENT", "No streams provided"),
        (
            stub.JoinConsumerGroup,
            join_req(groupId=group, consumerId="c", streams=[missing]),
            "FAILED_PRECONDITION",
            f"stream {missing} does not exist",
        ),
        (stub.LeaveConsumerGroup, leave_req(groupId=group, consumerId="c"), "NOT_FOUND", "group does not exist"),
        (stub.FetchConsumerGroupAssignments, fetch_req(groupId=group, consumerId="c"), "NOT_FOUND", "does not exist"),
        (
            stub.ReportConsumerGroupCoordinator,
            report_req(groupId=group, consumerId="c"),
            "INVALID_ARGUMENT",
            "No coordinator provided",
        ),
    ]
    for fn, req, code, text in cases:
        err = rpc_error(fn, req, timeout=TIMEOUT)
        assert (err.code().name, text in (err.details() or "")) == (code, True), (req, err.details())
    join(stub, group, "c", stream_name)
    err = rpc_error(join, stub, group, "c", stream_name)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "already a member" in (err.details() or "")
    err = rpc_error(fetch, stub, group, "stranger")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "not a member" in (err.details() or "")
    err = rpc_error(fetch, stub, group, "c", 7)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "epoch" in (err.details() or "")
    err = rpc_error(leave, stub, group, "stranger")
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    report = pb.ReportConsumerGroupCoordinatorRequest(groupId=group, consumerId="c", coordinator="broker-9", epoch=0)
    err = rpc_error(stub.ReportConsumerGroupCoordinator, report, timeout=TIMEOUT)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "generation mismatch" in (err.details() or "")
    leave(stub, group, "c")


def test_deleting_a_stream_takes_its_partitions_out_of_the_assignments(stub: Stub, stream_name: str) -> None:
    other = stream_name + "-b"
    create(stub, stream_name)
    create(stub, other)
    group = _group()
    join(stub, group, "c", stream_name, other)
    stub.DeleteStream(pb.DeleteStreamRequest(name=other), timeout=TIMEOUT)
    assert rpc_error(fetch, stub, group, "c", 0).code() == grpc.StatusCode.FAILED_PRECONDITION  # a new epoch
    assert group_meta(stub, group).epoch == 1
    assert fetch(stub, group, "c", 1) == ({stream_name: [0]}, 1)
    leave(stub, group, "c")


def test_a_stale_epoch_is_refused_before_membership_and_is_no_heartbeat(
    groups_server: DevServer, stream_name: str
) -> None:
    """As Liftbridge's ``GetAssignments``: coordinator, then epoch (``ErrGroupEpoch``), then membership;
    a refused fetch does not reset the member's timer (groups_server: 1 s consumer timeout)."""
    stub = api_pb2_grpc.APIStub(grpc.insecure_channel(groups_server.address))
    create(stub, stream_name, partitions=2)
    group = _group()
    join(stub, group, "a", stream_name)
    epoch = join(stub, group, "b", stream_name).epoch
    stale_text = "client-provided group epoch differs from broker group epoch"
    for consumer_id in ("a", "stranger"):  # the epoch is checked before the membership
        err = rpc_error(fetch, stub, group, consumer_id, epoch - 1)
        assert (err.code(), err.details()) == (grpc.StatusCode.FAILED_PRECONDITION, stale_text)
    err = rpc_error(fetch, stub, group, "stranger", epoch)
    assert (err.code(), err.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "consumer is not a member of the consumer group",
    )
    # a goes on fetching with its old epoch, b with the current one: only b's fetches are
    # heartbeats, so a times out and b gets both partitions.
    with bounded("the stale member timed out", 15):
        deadline = time.monotonic() + 15
        while True:
            assert time.monotonic() < deadline, "a member sending only stale-epoch fetches was not timed out"
            err = rpc_error(fetch, stub, group, "a", 0)
            assert (err.code(), err.details()) == (grpc.StatusCode.FAILED_PRECONDITION, stale_text)
            try:
                assigned, epoch = fetch(stub, group, "b", epoch)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and "epoch" in (exc.details() or ""):
                    epoch = group_meta(stub, group).epoch  # a's removal moved the epoch, as a rebalance does
                    continue
                if exc.code() == grpc.StatusCode.NOT_FOUND or "not a member" in (exc.details() or ""):
                    epoch = join(stub, group, "b", stream_name).epoch  # b starved past its own timeout
                    continue
                raise
            if assigned == {stream_name: [0, 1]}:
                break
            time.sleep(0.05)
    leave(stub, group, "b")


@pytest.fixture
def quick_cluster() -> Iterator[DevServer]:
    """Three brokers with short group timeouts, and the groups' clock held still from the start:
    a member times out when the test steps the clock past its deadline, never because the test
    process did not run for a while (``DevServer.hold_group_clock``)."""
    server = DevServer(brokers=3, groups_consumer_timeout=0.6, groups_coordinator_timeout=2.0)
    server.start()
    try:
        server.hold_group_clock()
        yield server
    finally:
        server.stop()


def test_silent_member_times_out_and_its_partitions_move(quick_cluster: DevServer, stream_name: str) -> None:
    stubs = [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in quick_cluster.addresses]
    create(stubs[0], stream_name, partitions=2)
    group = _group()
    first = join(stubs[1], group, "busy", stream_name)  # any broker takes the join
    join(stubs[0], group, "silent", stream_name)  # both joined at held time T: deadlines T + 0.6
    coord = stubs[quick_cluster.broker_ids.index(first.coordinator)]
    assert fetch(coord, group, "busy", 1) == ({stream_name: [0]}, 1)  # a heartbeat: busy's deadline T + 0.6
    # Only the coordinator serves assignments.
    others = [s for s in stubs if s is not coord]
    assert rpc_error(fetch, others[0], group, "busy").code() == grpc.StatusCode.FAILED_PRECONDITION
    assert quick_cluster.step_group_clock(0.4) == []  # T + 0.4: within everyone's timeout
    assert fetch(coord, group, "busy", 1) == ({stream_name: [0]}, 1)  # busy's deadline T + 1.0
    # T + 0.7: past the silent member's deadline only; the step times it out before it returns.
    assert quick_cluster.step_group_clock(0.3) == [(group, "silent")]
    assert group_meta(coord, group).epoch == 2  # the removal is a rebalance
    assert fetch(coord, group, "busy", 2) == ({stream_name: [0, 1]}, 2)
    err = rpc_error(fetch, coord, group, "busy", 1)  # as Liftbridge v1.9: the epoch must be the group's
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "epoch" in (err.details() or "")
    err = rpc_error(fetch, coord, group, "silent", 2)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "not a member" in (err.details() or "")


def test_coordinator_failover_after_a_majority_reports(quick_cluster: DevServer, stream_name: str) -> None:
    stubs = [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in quick_cluster.addresses]
    create(stubs[0], stream_name, partitions=2)
    group = _group()
    resp = join(stubs[0], group, "a", stream_name)
    join(stubs[0], group, "b", stream_name)
    join(stubs[0], group, "c", stream_name)
    old = resp.coordinator
    oi = quick_cluster.broker_ids.index(old)
    quick_cluster.stop_broker(oi)
    live = stubs[(oi + 1) % 3]
    report = pb.ReportConsumerGroupCoordinatorRequest(groupId=group, consumerId="a", coordinator=old, epoch=2)
    live.ReportConsumerGroupCoordinator(report, timeout=TIMEOUT)
    assert group_meta(live, group).coordinator == old  # one of three is no majority
    # Past every member's deadline (0.6 s), within the report window (2 s): a dead coordinator
    # expires nobody (a live one would time all three out in this step).
    assert quick_cluster.step_group_clock(1.0) == []
    assert group_meta(live, group).epoch == 2
    report.consumerId = "b"
    live.ReportConsumerGroupCoordinator(report, timeout=TIMEOUT)
    meta = group_meta(live, group)
    assert meta.coordinator not in ("", old) and meta.epoch == 3
    new = stubs[quick_cluster.broker_ids.index(meta.coordinator)]
    owned = [p for c in "abc" for p in fetch(new, group, c, 3)[0].get(stream_name, [])]
    assert sorted(owned) == [0, 1]  # all three are still members, nothing lost
    report.consumerId, report.epoch = "c", 2
    err = rpc_error(live.ReportConsumerGroupCoordinator, report, timeout=TIMEOUT)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # a report on the old generation
    # The new coordinator started the members' timers afresh (from the held time), and runs them.
    assert sorted(m for _, m in quick_cluster.step_group_clock(0.7)) == ["a", "b", "c"]


def test_the_held_group_clock_runs_on_from_where_it_was_released(quick_cluster: DevServer, stream_name: str) -> None:
    """Released, the clock runs on from the held time: a member times out on the real clock again."""
    stub = api_pb2_grpc.APIStub(grpc.insecure_channel(quick_cluster.address))
    create(stub, stream_name)
    group = _group()
    join(stub, group, "a", stream_name)
    assert quick_cluster.step_group_clock(0.5) == []
    with pytest.raises(ValueError):
        quick_cluster.step_group_clock(-0.1)
    quick_cluster.release_group_clock()
    with pytest.raises(RuntimeError):
        quick_cluster.step_group_clock(0.1)
    margins.wait_until(  # its last member timed out
        lambda: group_meta(stub, group).error == pb.ConsumerGroupMetadata.UNKNOWN_GROUP,
        30,
        "a member that never heartbeats timed out on the real clock",
        interval=0.05,
    )
