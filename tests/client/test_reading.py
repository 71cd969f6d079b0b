"""client/reading against the dev server: plans kept across tries of a run and made afresh by a
new run, start positions, commit cadences, bad input, cursors off."""

from __future__ import annotations

import datetime as dt
import gc
import threading
import time
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import (
    AckPolicy,
    CursorsDisabledError,
    InvalidArgumentError,
    LiftbridgeClient,
    Message,
    NoSuchPartitionError,
    NoSuchStreamError,
    StartPosition,
)
from airflow_provider_liftbridge.client.reading import (
    BatchFailed,
    NotJsonError,
    PartitionPlan,
    RangePlanner,
    json_value,
    plan_cursor_ids,
    read_plan,
)
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from tests import margins


@pytest.fixture
def lb(lb_address: str) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(lb_address) as client:
        yield client


def planner(client: LiftbridgeClient, stream: str, run: str = "run-1", **kwargs: object) -> RangePlanner:
    return RangePlanner(client, stream, position_cursor="pos", plan_key="dag/task", run_id=run, **kwargs)  # type: ignore[arg-type]


def fill(client: LiftbridgeClient, stream: str, n: int, partition: int = 0) -> None:
    client.publish_many(stream, [b"m%d" % i for i in range(n)], partition=partition)


def test_a_retry_keeps_the_plan_and_a_new_run_plans_afresh(lb: LiftbridgeClient, stream_name: str) -> None:
    lb.create_stream(stream_name, stream_name, partitions=2)
    fill(lb, stream_name, 10)
    first = planner(lb, stream_name, max_messages=6).plan([0, 1])
    assert [(p.next_offset, p.end, p.resumed) for p in first] == [(0, 6, False), (0, 0, False)]
    lb.set_cursor("pos", stream_name, 0, 2)  # the first try finished offsets 0..2
    fill(lb, stream_name, 5)  # arrives after the plan
    retry = planner(lb, stream_name, max_messages=6).plan([0, 1])
    assert [(p.next_offset, p.end, p.resumed, p.remaining) for p in retry] == [(3, 6, True, 3), (0, 0, True, 0)]
    assert planner(lb, stream_name).has_plan([1]) and not planner(lb, stream_name, run="run-2").has_plan([0, 1])
    new_run = planner(lb, stream_name, run="run-2", max_messages=6).plan([0])
    assert [(p.next_offset, p.end, p.resumed) for p in new_run] == [(3, 9, False)]
    end_id, _ = plan_cursor_ids("pos", "dag/task")
    assert lb.fetch_cursor(end_id, stream_name, 0) == 9  # one key per task, overwritten by each run


def test_a_half_stored_plan_is_made_again(lb: LiftbridgeClient, stream_name: str) -> None:
    """A try that died after storing the end but before the run tag: the retry plans afresh."""
    lb.create_stream(stream_name, stream_name)
    fill(lb, stream_name, 3)
    end_id, _ = plan_cursor_ids("pos", "dag/task")
    lb.set_cursor(end_id, stream_name, 0, 1)  # an end without this run's tag
    (plan,) = planner(lb, stream_name).plan([0])
    assert (plan.next_offset, plan.end, plan.resumed) == (0, 3, False)


def test_start_positions_of_a_partition_without_a_position(lb: LiftbridgeClient, stream_name: str) -> None:
    lb.create_stream(stream_name, stream_name, partitions=4)
    for p in range(4):
        fill(lb, stream_name, 4, partition=p)
    stamps = [m.timestamp for m in lb.subscribe(stream_name, partition=3, stop_at=3)]
    at = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=stamps[2] // 1000)
    first_at = next(i for i, ns in enumerate(stamps) if ns >= stamps[2] // 1000 * 1000)  # 2, or 1 in the same µs
    starts = [StartPosition.EARLIEST, StartPosition.LATEST, 1, at]
    plans = [planner(lb, stream_name, start_at=s, run=f"r{i}").plan([i])[0] for i, s in enumerate(starts)]
    assert [(p.next_offset, p.end) for p in plans] == [(0, 4), (4, 4), (1, 4), (first_at, 4)]
    # The start is stored as the position, so the next run goes on from it.
    assert [lb.fetch_cursor("pos", stream_name, p) for p in range(4)] == [-1, 3, 0, first_at - 1]
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    lb.create_stream(stream_name + "-t", stream_name + "-t")
    fill(lb, stream_name + "-t", 2)
    (plan,) = planner(lb, stream_name + "-t", start_at=later).plan([0])
    assert (plan.next_offset, plan.end) == (2, 2)  # nothing at or after that time yet


def test_latest_on_an_empty_partition_reads_what_arrives_before_the_next_run(
    lb: LiftbridgeClient, stream_name: str
) -> None:
    lb.create_stream(stream_name, stream_name)
    (plan,) = planner(lb, stream_name, start_at=StartPosition.LATEST).plan([0])
    assert (plan.next_offset, plan.end) == (0, 0)
    fill(lb, stream_name, 3)
    (plan,) = planner(lb, stream_name, run="run-2", start_at=StartPosition.LATEST).plan([0])
    assert (plan.next_offset, plan.end) == (0, 3)


def commits_of(lb: LiftbridgeClient, stream: str, cadence: str, fail_at: int | None) -> tuple[int, list[int]]:
    """Read 10 messages in batches of 4 with ``cadence``; the handler fails at ``fail_at``."""
    seen: list[int] = []

    def handler(batch: list[Message]) -> int:
        for i, m in enumerate(batch):
            if m.offset == fail_at:
                raise BatchFailed(i, m, "boom")
            seen.append(m.offset)
        return 0

    plans = planner(lb, stream, run=cadence + str(fail_at)).plan([0])
    try:
        read_plan(lb, plans, handler, position_cursor="pos", batch_size=4, commit_cadence=cadence)  # type: ignore[arg-type]
    except BatchFailed as failed:
        assert failed.message.offset == fail_at and failed.reports[0].processed == len(seen)
    position = lb.fetch_cursor("pos", stream, 0)
    lb.set_cursor("pos", stream, 0, -1)
    return position, seen


def test_commit_cadences(lb: LiftbridgeClient, stream_name: str) -> None:
    lb.create_stream(stream_name, stream_name)
    fill(lb, stream_name, 10)
    assert commits_of(lb, stream_name, "end_of_batch", None) == (9, list(range(10)))
    assert commits_of(lb, stream_name, "end_of_batch", 6) == (5, list(range(6)))  # never past offset 6
    assert commits_of(lb, stream_name, "end_of_operator", None) == (9, list(range(10)))
    assert commits_of(lb, stream_name, "end_of_operator", 6) == (-1, list(range(6)))  # nothing on failure
    assert commits_of(lb, stream_name, "never", None) == (-1, list(range(10)))


def test_an_exception_other_than_batch_failed_fails_at_the_batch_start(lb: LiftbridgeClient, stream_name: str) -> None:
    lb.create_stream(stream_name, stream_name)
    fill(lb, stream_name, 6)

    def handler(batch: list[Message]) -> int:
        if batch[0].offset == 4:
            raise OSError("disk full")
        return 0

    with pytest.raises(BatchFailed, match="OSError: disk full") as info:
        read_plan(lb, planner(lb, stream_name).plan([0]), handler, position_cursor="pos", batch_size=2)
    assert (info.value.done, info.value.message.offset) == (0, 4)
    assert isinstance(info.value.__cause__, OSError)
    assert lb.fetch_cursor("pos", stream_name, 0) == 3


def test_unknown_stream_or_partition_and_bad_arguments(lb: LiftbridgeClient, stream_name: str) -> None:
    with pytest.raises(NoSuchStreamError, match=f"stream '{stream_name}' does not exist: create it first"):
        planner(lb, stream_name).check_partitions(None)
    lb.create_stream(stream_name, stream_name, partitions=2)
    assert planner(lb, stream_name).check_partitions(None) == [0, 1]
    with pytest.raises(NoSuchPartitionError, match=r"has no partition 2, 5 \(it has partitions 0..1\): fix partitions"):
        planner(lb, stream_name).check_partitions([0, 2, 5])
    with pytest.raises(InvalidArgumentError, match="max_messages must be at least 1"):
        planner(lb, stream_name, max_messages=0)
    with pytest.raises(InvalidArgumentError, match="batch_size must be a whole number of at least 1"):
        read_plan(lb, [], lambda b: 0, position_cursor="pos", batch_size=0)
    with pytest.raises(InvalidArgumentError, match="commit_cadence must be one of"):
        read_plan(lb, [], lambda b: 0, position_cursor="pos", commit_cadence="sometimes")  # type: ignore[arg-type]


def test_json_value_names_the_offset() -> None:
    message = Message("s", 1, 7, None, b"{not json", 0, "s", "")
    with pytest.raises(NotJsonError, match="stream 's' partition 1 offset 7 is not JSON"):
        json_value(message)
    assert json_value(Message("s", 0, 0, None, b'{"a": 1}', 0, "s", "")) == {"a": 1}


def test_cursors_off_is_the_typed_error_naming_the_setting(stream_name: str) -> None:
    with DevServer(brokers=1, cursors=False) as server, LiftbridgeClient(server.address) as client:
        client.create_stream(stream_name, stream_name)
        started = time.monotonic()
        with pytest.raises(CursorsDisabledError, match="cursors.stream.partitions"):
            planner(client, stream_name).plan([0])
        assert time.monotonic() - started < 5  # not retried


def test_reading_stops_where_keep_reading_says_the_partition_moved(lb: LiftbridgeClient, stream_name: str) -> None:
    lb.create_stream(stream_name, stream_name, partitions=2)
    fill(lb, stream_name, 6, partition=0)
    fill(lb, stream_name, 6, partition=1)
    seen: list[tuple[int, int]] = []

    def handler(batch: list[Message]) -> int:
        seen.extend((m.partition, m.offset) for m in batch)
        return 0

    asked: list[int] = []

    def keep_reading(plan: object) -> bool:  # partition 1 moves away after its first batch
        asked.append(plan.partition)  # type: ignore[attr-defined]
        return not (plan.partition == 1 and asked.count(1) > 1)  # type: ignore[attr-defined]

    plans = planner(lb, stream_name).plan([0, 1])
    reports = read_plan(lb, plans, handler, position_cursor="pos", batch_size=4, keep_reading=keep_reading)
    assert seen == [(0, o) for o in range(6)] + [(1, o) for o in range(4)]
    assert reports[1].to_dict()["moved_away"] is True and reports[1].committed == 3
    assert "moved_away" not in reports[0].to_dict() and reports[0].committed == 5


def test_a_member_learns_a_rebalance_and_waits_for_the_hand_over(lb: LiftbridgeClient, stream_name: str) -> None:
    """check_assignments() follows a join within about one assignment check; the member that
    took partitions over reports a hand-over wait before it may read them."""
    lb.create_stream(stream_name, stream_name, partitions=2)
    group = f"g-{stream_name}"
    with lb.group_consumer(group, stream_name, auto_commit_interval=None) as first:
        assert first.check_assignments() == {stream_name: [0, 1]}
        with lb.group_consumer(group, stream_name, auto_commit_interval=None) as second:
            taken = second.check_assignments()[stream_name]
            assert len(taken) == 1 and 0 < second.handover_wait <= 2.0
            margins.wait_until(
                lambda: first.check_assignments()[stream_name] == [1 - taken[0]],
                10,
                "the first member learnt of the rebalance",
                interval=0.05,
            )


def test_a_paused_partition_is_planned_and_read(lb: LiftbridgeClient, stream_name: str) -> None:
    """A paused partition (idle auto-pause, or paused by hand) still holds committed messages:
    the plan takes its high watermark from the metadata, and reading resumes it."""
    lb.create_stream(stream_name, stream_name)
    fill(lb, stream_name, 3)
    lb.pause_stream(stream_name)
    assert planner(lb, stream_name).pending([0]) == {0: 3}
    plans = planner(lb, stream_name).plan([0])
    assert [(p.next_offset, p.end) for p in plans] == [(0, 3)]
    seen: list[int] = []
    read_plan(lb, plans, lambda b: seen.extend(m.offset for m in b) or 0, position_cursor="pos")
    assert seen == [0, 1, 2]


def test_a_plan_made_while_a_restarted_cluster_reads_its_high_watermarks_as_unknown_waits_for_them() -> None:
    """Right after a full restart a partition's high watermark reads -1 though its log holds
    messages (liftbridge-semantics.md: about 9 s on v1.9; 3 s here). A plan made then used to
    take the -1 at its word and read nothing of the partition in that run (found by the fault
    campaign, seed 2233); it waits until the high watermark is known."""
    timings = ClusterTimings.fast(restart_hw_unknown=3.0)
    with DevServer(brokers=3, timings=timings) as cluster, LiftbridgeClient(cluster.addresses, timeout=10.0) as lb:
        lb.create_stream("restarted", "restarted", replication_factor=3)
        fill(lb, "restarted", 100)
        cluster.restart_cluster()
        (plan,) = planner(lb, "restarted").plan([0])
    assert (plan.next_offset, plan.end) == (0, 100)


def test_a_plan_waits_for_what_the_leader_held_to_commit(cluster: DevServer) -> None:
    """A leader whose high watermark reads below messages it holds (a restarted leader reads its
    checkpoint, a new one knows the watermark a fetch late, an in-sync follower lags: issue 47)
    must not end the run's plan there: the plan waits until what the leader held is committed.
    Here a follower is stalled (it stays in the ISR for 15 s), so five LEADER-acked messages wait
    above the high watermark until it runs again."""
    with LiftbridgeClient(cluster.addresses, timeout=10.0) as lb:
        lb.create_stream("held", "held", replication_factor=3)
        fill(lb, "held", 10)
        listed = lb.fetch_metadata(["held", "__cursors"]).streams
        part, cursors_leader = listed["held"].partitions[0], listed["__cursors"].partitions[0].leader
        # Not the cursors leader: the plan's own cursor calls must not be what holds it up.
        stalled = next(r for r in part.replicas if r not in (part.leader, cursors_leader))
        follower = cluster.broker_ids.index(stalled)
        cluster.stall_broker(follower)
        try:
            lb.publish_many("held", [b"late%d" % i for i in range(5)], ack_policy=AckPolicy.LEADER)
            info = lb.fetch_partition_metadata("held", 0)
            assert (info.high_watermark, info.newest_offset) == (9, 14)
            plans: list[object] = []
            planning = threading.Thread(target=lambda: plans.extend(planner(lb, "held").plan([0])))
            planning.start()
            planning.join(1.0)
            assert planning.is_alive()  # still waiting: the five are not committed
        finally:
            cluster.resume_broker(follower)
        planning.join(30)
    assert [(p.next_offset, p.end) for p in plans] == [(0, 15)]  # type: ignore[attr-defined]


def _leader_index(server: DevServer, lb: LiftbridgeClient, stream: str) -> int:
    return server.broker_ids.index(lb.fetch_metadata([stream]).streams[stream].partitions[0].leader)


def test_a_plan_made_after_a_leader_change_reaches_what_the_old_leader_committed(stream_name: str) -> None:
    """Seed 61018's class (issue 47), as the dev server models Liftbridge: a new leader starts from
    the high watermark it knew as a follower, one fetch behind what the old leader committed
    (here, with a minimum ISR of 3, it stays there until the old leader is back). A plan made then
    used to end at that high watermark, so the run read less than was committed before it began;
    it waits until what the leader holds is committed."""
    timings = ClusterTimings.fast(replica_max_lag_time=60.0)
    with DevServer(brokers=3, timings=timings) as server, LiftbridgeClient(server.addresses, timeout=10.0) as lb:
        lb.create_stream(stream_name, stream_name, replication_factor=3, min_isr=3)
        lb.publish_many(stream_name, [b"m%d" % i for i in range(10)], ack_policy=AckPolicy.ALL)
        old = _leader_index(server, lb, stream_name)
        server.kill_broker(old)
        margins.wait_until(lambda: _leader_index(server, lb, stream_name) != old, 30, "a new leader", interval=0.05)
        info = lb.fetch_partition_metadata(stream_name, 0)
        assert info.high_watermark < info.newest_offset == 9
        plans: list[PartitionPlan] = []
        planning = threading.Thread(target=lambda: plans.extend(planner(lb, stream_name).plan([0])))
        planning.start()
        planning.join(1.0)
        assert planning.is_alive()  # waiting: offset 9 is held, not yet committed
        server.start_broker(old)
        planning.join(30)
    assert [(p.next_offset, p.end) for p in plans] == [(0, 10)]


def test_a_retry_after_the_cursors_leader_restarted_resumes_its_plan(stream_name: str) -> None:
    """The plan cursors' case of issue 47: the ``__cursors`` leader is killed and back before the
    leader timeout between two tries of a run. It comes back from its high-watermark checkpoint
    (none here: -1) with its cursor cache empty, and Liftbridge caches what a FetchCursor reads
    then: the retry used to find no plan and no position, plan afresh and read past its plan. It
    waits for the partition to settle and resumes the plan."""
    timings = ClusterTimings.fast(
        replica_max_leader_timeout=30.0,
        replica_max_lag_time=30.0,
        hw_checkpoint_interval=600.0,
        replica_max_idle_wait=2.0,
        min_insync_replicas=2,
    )
    with DevServer(brokers=3, timings=timings) as server, LiftbridgeClient(server.addresses, timeout=10.0) as lb:
        lb.create_stream(stream_name, stream_name, replication_factor=3)
        lb.publish_many(stream_name, [b"m%d" % i for i in range(10)], ack_policy=AckPolicy.ALL)
        assert [(p.next_offset, p.end, p.resumed) for p in planner(lb, stream_name).plan([0])] == [(0, 10, False)]
        lb.set_cursor("pos", stream_name, 0, 4)  # the first try finished offsets 0..4, then died
        lb.publish_many(stream_name, [b"late%d" % i for i in range(5)], ack_policy=AckPolicy.ALL)
        owner = _leader_index(server, lb, "__cursors")
        server.kill_broker(owner)
        server.start_broker(owner)
        retry = planner(lb, stream_name).plan([0])
    assert [(p.next_offset, p.end, p.resumed) for p in retry] == [(5, 10, True)]


def test_a_batch_reaches_the_handler_after_the_commit_of_the_batch_before(
    lb: LiftbridgeClient, stream_name: str
) -> None:
    """The commit runs while the next batch is read: the handler still sees every earlier batch
    committed on the server, and the report's position is the last one."""
    lb.create_stream(stream_name, stream_name)
    fill(lb, stream_name, 10)
    positions: list[int] = []

    def handler(batch: list[Message]) -> int:
        positions.append(lb.fetch_cursor("pos", stream_name, 0))
        return 0

    reports = read_plan(lb, planner(lb, stream_name).plan([0]), handler, position_cursor="pos", batch_size=3)
    assert positions == [-1, 2, 5, 8]
    assert reports[0].committed == 9 and lb.fetch_cursor("pos", stream_name, 0) == 9


def test_the_gc_threshold_is_raised_while_reading_and_put_back(lb: LiftbridgeClient, stream_name: str) -> None:
    """A batch's worth of young objects (4 per message) sets off no collection while reading; the
    threshold is put back however the read ends, and a disabled collector stays disabled."""
    lb.create_stream(stream_name, stream_name)
    fill(lb, stream_name, 4)
    before = gc.get_threshold()
    seen: list[int] = []

    def handler(batch: list[Message]) -> int:
        seen.append(gc.get_threshold()[0])
        raise OSError("disk full")

    try:
        gc.set_threshold(700, *before[1:])
        with pytest.raises(BatchFailed):
            read_plan(lb, planner(lb, stream_name).plan([0]), handler, position_cursor="pos", batch_size=1000)
        assert seen == [4000] and gc.get_threshold() == (700, *before[1:])
        gc.set_threshold(0)
        with pytest.raises(BatchFailed):
            read_plan(lb, planner(lb, stream_name).plan([0]), handler, position_cursor="pos", batch_size=1000)
        assert seen == [4000, 0] and gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
