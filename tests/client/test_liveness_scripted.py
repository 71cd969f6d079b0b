"""The keeper's step (client/liveness.py) as I/O effects, without servers or sleeps."""

from __future__ import annotations

import time
from typing import Any

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import liveness
from airflow_provider_liftbridge.client.consumer import GroupMember, check
from airflow_provider_liftbridge.client.effects import Unary

from .scripted import drive
from .test_ops_scripted import core, metadata


def _member(**kw: Any) -> GroupMember:
    kw.setdefault("roster", False)  # the roster's records: test_group_roster.py
    member = GroupMember("g", ["s"], consumer_id="m", **kw)
    member.joined, member.coordinator, member.assignments = True, "b1", {"s": [0, 1]}
    member.positions = {("s", 0): 5, ("s", 1): 7}
    return member


def _answers(assigned: list[int]) -> Any:
    def answer(e: Any) -> Any:
        if isinstance(e, Unary) and e.method == "FetchMetadata":
            return metadata()
        if isinstance(e, Unary) and e.method == "FetchConsumerGroupAssignments":
            return api_pb2.FetchConsumerGroupAssignmentsResponse(
                epoch=0, assignments=[api_pb2.PartitionAssignment(stream="s", partitions=assigned)]
            )
        if isinstance(e, Unary) and e.method == "LeaveConsumerGroup":
            return api_pb2.LeaveConsumerGroupResponse()
        raise AssertionError(f"unexpected {e!r}")

    return answer


def _methods(run: Any) -> list[str]:
    return [e.method for e in run.effects if isinstance(e, Unary)]


def test_the_keeper_fetches_and_leaves_the_change_to_the_caller() -> None:
    member = _member()
    member.away_since = time.monotonic()
    run = drive(liveness.tend(core(), member), _answers([0]))
    assert _methods(run)[-1] == "FetchConsumerGroupAssignments"
    assert 0 < run.result <= member.assignment_check  # the next step: when the next heartbeat is due
    # Nothing adopted, nothing committed while the caller is away: partition 1 is still its own.
    assert member.assignments == {"s": [0, 1]} and member.pending == {"s": [0]}
    assert member.positions == {("s", 0): 5, ("s", 1): 7}
    member.auto_commit_interval = None
    drive(check(core(), member), _answers([0]))  # the caller's next call adopts it
    assert member.assignments == {"s": [0]} and member.pending is None and ("s", 1) not in member.positions


def test_the_keeper_leaves_without_committing_after_max_poll_interval() -> None:
    member = _member(max_poll_interval=10.0)
    member.away_since = time.monotonic() - 10.0
    run = drive(liveness.tend(core(), member), _answers([0, 1]))
    assert _methods(run) == ["LeaveConsumerGroup"]  # no SetCursor: what the caller holds is not done
    assert run.result is None and member.left_idle and not member.joined


def test_the_keeper_never_leaves_for_a_caller_in_a_call_or_without_a_bound() -> None:
    for member in (_member(max_poll_interval=10.0), _member(max_poll_interval=None)):
        member.away_since = None if member.max_poll_interval else time.monotonic() - 1e6
        member.next_heartbeat = time.monotonic() + 60
        run = drive(liveness.tend(core(), member), _answers([0, 1]))
        assert _methods(run) == [] and run.result is not None and member.joined


def test_the_keeper_stops_for_a_member_out_of_the_group() -> None:
    member = _member()
    member.joined = False
    run = drive(liveness.tend(core(), member), _answers([0]))
    assert run.effects == [] and run.result is None
