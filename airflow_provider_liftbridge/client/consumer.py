"""Consumer-group members, sync and asyncio, written once as operations (generators of I/O effects).

A member joins a group naming the streams it reads; the group's coordinator (a broker) assigns it
partitions of those streams; the member reads its partitions from the group's committed positions
(cursors ``__group:<group id>``, as the Go client names them), commits its progress, follows
rebalances and coordinator changes, and leaves. See ``docs/consumer-groups.md``.

How reading works (:mod:`.group_reading`): a *poll* first does the group's bookkeeping when due
(heartbeat = fetching the assignments, at least every ``assignment_check`` seconds; adopting
assignments fetched meanwhile; committing, rejoining, reporting a dead coordinator), then reads,
per assigned partition, what is committed there now (up to ``max_batch`` messages, bounded by the
high watermark it just fetched), and ends, early if the next check is due. A partition taken over
from another member is read only after a hand-over wait, from the group's position as its
previous owner left it (see :func:`_reassign`). :meth:`~.group_consumer.GroupConsumer.messages`
polls in a loop, waiting ``idle_wait`` between empty polls. Messages handed to the caller count as
consumed: ``commit()`` stores the position after the last one of each partition; with
``auto_commit_interval`` the next poll does it, which is at-least-once as long as a message is
processed before the caller asks for the next poll.

While the caller is away (handling a message or a batch), the member's *keeper*
(:mod:`.liveness`, a thread or a task of the front end) fetches the assignments instead, so the
member stays alive; what it fetched waits in :attr:`GroupMember.pending` for the caller's next
poll, which adopts it (a revoked partition is committed only then, once its messages are done).

The state lives in :class:`GroupMember` (no I/O); the operations take the client's core and the
member; :class:`~.group_consumer.GroupConsumer` and :class:`~.group_consumer.AsyncGroupConsumer` run them on a
client's transport, one at a time per member.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from . import cursors, group_roster, operations
from .effects import Op, RpcFailure, Sleep, Unary
from .errors import InvalidArgumentError, LiftbridgeError, UnavailableError
from .retry import is_transient
from .routing import ClientCore
from .types import Message

__all__ = ["AutoOffset", "ConsumerGroupError", "GroupMember", "MaxPollIntervalExceededError"]

log = logging.getLogger(__name__)

#: Where a member starts a partition the group has no position for: only messages published after
#: the assignment (``"new_only"``, the Go client's default), the oldest (``"earliest"``), the newest
#: one (``"latest"``), or refuse (``"none"``: :class:`ConsumerGroupError`).
AutoOffset = Literal["new_only", "earliest", "latest", "none"]
_AUTO_OFFSETS = ("new_only", "earliest", "latest", "none")
_NS = 1e9
#: Fraction of the server's consumer timeout between two heartbeats, at most: a third (Kafka's
#: guidance for ``heartbeat.interval.ms``), so a member survives two late or lost heartbeats. It
#: matters only for consumer timeouts under 3 s: :data:`ASSIGNMENT_CHECK` is shorter otherwise.
#: (The Go client's 0.7 leaves room for one heartbeat late by at most 30 % of the timeout.)
HEARTBEAT_FRACTION = 1 / 3
#: Seconds between two assignment checks of a consuming member: how long a member may go on
#: reading a partition the group gave to another (docs/consumer-groups.md, "Rebalance").
ASSIGNMENT_CHECK = 1.0
#: A newly assigned partition is read this many assignment checks after the assignment, from the
#: group's position then: by that time its previous owner has noticed and committed where it stopped.
HANDOVER_CHECKS = 1.5
#: Seconds the caller may stay away (handling what it was given) before its member leaves the
#: group (Kafka's ``max.poll.interval.ms``, 5 minutes): see :mod:`.liveness`.
MAX_POLL_INTERVAL = 300.0


class ConsumerGroupError(LiftbridgeError):
    """A consumer-group call failed in a way the member cannot repair by itself (the message says
    what the server answered and what to do)."""


class MaxPollIntervalExceededError(ConsumerGroupError):
    """The member left its group because its caller was away (handling a message or a batch) for
    longer than ``max_poll_interval``: what the caller was given is not committed by it; the
    other members read those partitions from the group's positions. Raise ``max_poll_interval``
    or make batches faster; a new call (a poll, a retry of the task) joins again."""


def group_cursor_id(group_id: str) -> str:
    """The cursor id under which a group's positions are stored (``__group:<group id>``)."""
    return f"__group:{group_id}"


@dataclass
class GroupMember:
    """What a member knows about its group; changed only by the operations of this module.

    :param group_id: the group to join.
    :param streams: the streams to consume.
    :param consumer_id: this member's id (unique in the group; default: a random one).
    :param auto_offset: where to start a partition without a committed position.
    :param auto_commit_interval: seconds between automatic commits (``None`` or 0: commit only
        when :func:`commit` is called, and not when a partition is taken away).
    :param max_batch: messages read per partition per poll, at most.
    :param handover: read a partition taken over only after the hand-over wait (see
        :func:`_reassign`); ``False`` reads it at once from the group's position (a one-shot
        reader, such as a sensor's poke, that would otherwise read nothing).
    :param max_poll_interval: seconds the caller may stay away between two calls (handling a
        message or a batch) before the keeper leaves the group for it (``None``: never); see
        :mod:`.liveness`.
    :param roster: record this member in the group roster when its epoch or assignments change
        and when it leaves (:mod:`.group_roster`: the only way others can see a group's members).
    :raises InvalidArgumentError: an empty group id or stream list, an unknown ``auto_offset``,
        a ``max_batch`` below 1, a ``max_poll_interval`` that is not positive.
    """

    group_id: str
    streams: Sequence[str]
    consumer_id: str = ""
    auto_offset: AutoOffset = "new_only"
    auto_commit_interval: float | None = 5.0
    max_batch: int = 512
    handover: bool = True
    max_poll_interval: float | None = MAX_POLL_INTERVAL
    roster: bool = True
    coordinator: str = ""
    epoch: int = 0
    consumer_timeout: float = 15.0
    coordinator_timeout: float = 15.0
    joined: bool = False
    #: Assigned partitions per stream, as the coordinator last said.
    assignments: dict[str, list[int]] = field(default_factory=dict)
    #: Next offset to read per (stream, partition): one past the last message handed out.
    positions: dict[tuple[str, int], int] = field(default_factory=dict)
    #: Offset stored in the group's cursor per (stream, partition) (-1: none).
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    next_heartbeat: float = 0.0
    next_commit: float = 0.0
    #: Seconds between two assignment checks while consuming (see :data:`ASSIGNMENT_CHECK`).
    assignment_check: float = ASSIGNMENT_CHECK
    #: Newly assigned partitions not read yet, with when reading them may start (see ``_reassign``).
    handover_due: dict[tuple[str, int], float] = field(default_factory=dict)
    #: Since when the coordinator has not answered (monotonic seconds), or ``None``.
    coordinator_silent_since: float | None = None
    #: Assignments fetched by the keeper while the caller was away, not adopted yet (``None``: no change).
    pending: dict[str, list[int]] | None = None
    #: Since when the caller has been away (monotonic seconds; ``None``: in a call now, or never joined).
    away_since: float | None = None
    #: The keeper left the group because the caller stayed away longer than ``max_poll_interval``.
    left_idle: bool = False
    #: What this member last recorded in the roster (epoch, coordinator, assignments, left), or None.
    recorded: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if not self.group_id:
            raise InvalidArgumentError("group_id must be a non-empty consumer group name")
        if isinstance(self.streams, str):
            self.streams = [self.streams]
        if not self.streams or not all(self.streams):
            raise InvalidArgumentError("streams must name at least one stream to consume")
        if self.auto_offset not in _AUTO_OFFSETS:
            raise InvalidArgumentError(
                f"auto_offset must be one of {', '.join(_AUTO_OFFSETS)}; got {self.auto_offset!r}"
            )
        if self.max_batch < 1:
            raise InvalidArgumentError(f"max_batch must be at least 1, got {self.max_batch!r}")
        if self.max_poll_interval is not None and not self.max_poll_interval > 0:
            raise InvalidArgumentError(
                f"max_poll_interval must be a positive number of seconds (or None), got {self.max_poll_interval!r}"
            )
        self.consumer_id = self.consumer_id or uuid.uuid4().hex
        self.streams = list(self.streams)

    @property
    def cursor_id(self) -> str:
        return group_cursor_id(self.group_id)

    def assigned(self) -> list[tuple[str, int]]:
        """Every assigned (stream, partition), in order."""
        return [(s, p) for s in sorted(self.assignments) for p in self.assignments[s]]

    def handed_out(self, message: Message) -> None:
        """Record that ``message`` was given to the caller."""
        self.positions[(message.stream, message.partition)] = message.offset + 1

    def uncommitted(self, keys: Sequence[tuple[str, int]] | None = None) -> dict[tuple[str, int], int]:
        """Cursor offsets to store: the last handed-out offset of each partition that moved."""
        out = {}
        for key in self.positions if keys is None else keys:
            last = self.positions.get(key, 0) - 1
            if last >= 0 and last > self.committed.get(key, -1):
                out[key] = last
        return out


# ---------------------------------------------------------------------------------------------
# Calls
# ---------------------------------------------------------------------------------------------


def _call_any(core: ClientCore, method: str, request: object) -> Op[Any]:
    """A group call any broker may answer, retried on other brokers after a lost connection,
    within the client's timeout as :func:`..operations.unary` (at least ``max_retries`` times).

    :raises RpcFailure: the server refused the call (the callers classify the refusal).
    :raises UnavailableError: no broker answered.
    """
    attempt = 0
    until = core.clock() + core.timeout
    while True:
        address = core.address_for_attempt(attempt)
        try:
            response = yield Unary(address, method, request, core.timeout)
        except RpcFailure as failure:
            if not is_transient(failure):
                raise
            attempt += 1
            backoff = core.retry_wait(attempt, until if core.reached else None)
            if backoff is None:
                raise UnavailableError(
                    f"{method} failed: no broker reachable after {attempt} attempt(s) in"
                    f" {core.clock() - until + core.timeout:.1f} s; check that the brokers are running,"
                    " or raise timeout or max_retries."
                ) from failure.__cause__
            yield Sleep(backoff)
            continue
        core.mark_good(address)
        return response


def _refused(method: str, member: GroupMember, failure: RpcFailure) -> ConsumerGroupError:
    return ConsumerGroupError(
        f"{method} for consumer {member.consumer_id!r} of group {member.group_id!r} was refused"
        f' ({failure.code.name}: "{failure.details}")'
    )


def join(core: ClientCore, member: GroupMember) -> Op[None]:
    """Join the group (creating it if needed) and learn its coordinator, epoch and timeouts.

    A member id the group already has is taken as this member coming back (a restart within the
    consumer timeout): it goes on as that member.

    :raises ConsumerGroupError: the server refused (e.g. a stream does not exist).
    :raises UnavailableError: no broker answered.
    """
    request = api_pb2.JoinConsumerGroupRequest(
        groupId=member.group_id, consumerId=member.consumer_id, streams=member.streams
    )
    try:
        response = yield from _call_any(core, "JoinConsumerGroup", request)
    except RpcFailure as failure:
        if failure.code == grpc.StatusCode.FAILED_PRECONDITION and "already a member" in failure.details:
            yield from _refresh_coordinator(core, member)
            member.joined, member.next_heartbeat = True, 0.0
            return
        raise _refused("JoinConsumerGroup", member, failure) from failure.__cause__
    member.coordinator, member.epoch = response.coordinator, int(response.epoch)
    member.consumer_timeout = (response.consumerTimeout / _NS) or member.consumer_timeout
    member.coordinator_timeout = (response.coordinatorTimeout / _NS) or member.coordinator_timeout
    member.joined, member.next_heartbeat, member.coordinator_silent_since = True, 0.0, None


def _refresh_coordinator(core: ClientCore, member: GroupMember) -> Op[bool]:
    """Read the group's coordinator and epoch from the cluster metadata; ``False`` if the group is gone."""
    request = api_pb2.FetchMetadataRequest(streams=member.streams[:1], groups=[member.group_id])
    response = yield from _call_any(core, "FetchMetadata", request)
    group = next((g for g in response.groupMetadata if g.groupId == member.group_id), None)
    if group is None or group.error != api_pb2.ConsumerGroupMetadata.OK:
        return False
    if group.coordinator != member.coordinator:
        member.coordinator_silent_since = None
    member.coordinator, member.epoch = group.coordinator, max(member.epoch, int(group.epoch))
    return True


def _coordinator_address(core: ClientCore, member: GroupMember) -> Op[str]:
    address = core.cache.broker_address(member.coordinator)
    if address is None:
        yield from operations.fetch_metadata(core, member.streams)
        address = core.cache.broker_address(member.coordinator)
    if address is None:  # not in the metadata: as good as unreachable (the failover path)
        raise RpcFailure(grpc.StatusCode.UNAVAILABLE, f"coordinator {member.coordinator} is not in the metadata")
    return address


def heartbeat(core: ClientCore, member: GroupMember) -> Op[None]:
    """Fetch this member's assignments from the coordinator (the member's heartbeat) and follow
    what changed: a new assignment, a rebalance, a lost membership (joins again), a new coordinator
    (asks the metadata), a coordinator silent for ``coordinator_timeout`` (reports it, which moves
    the group to another broker once most members did).

    :raises ConsumerGroupError: the group refused this member in a way a rejoin does not repair.
    :raises UnavailableError: no broker answered.
    """
    yield from fetch_assignments(core, member)
    yield from adopt(core, member)


def fetch_assignments(core: ClientCore, member: GroupMember) -> Op[None]:
    """The heartbeat without adopting what it learnt: new assignments wait in
    :attr:`GroupMember.pending` (what the keeper does while the caller is away: the caller's
    next poll adopts them, see :func:`adopt`). Failures are followed as in :func:`heartbeat`.

    :raises ConsumerGroupError: / :raises UnavailableError: see :func:`heartbeat`.
    """
    if not member.joined:
        yield from join(core, member)
    now = time.monotonic()
    request = api_pb2.FetchConsumerGroupAssignmentsRequest(
        groupId=member.group_id, consumerId=member.consumer_id, epoch=member.epoch
    )
    try:
        address = yield from _coordinator_address(core, member)
        response = yield Unary(address, "FetchConsumerGroupAssignments", request, core.timeout)
    except RpcFailure as failure:
        member.next_heartbeat = now + retry_wait(member)
        yield from _heartbeat_failed(core, member, failure, now)
        return
    member.coordinator_silent_since = None
    member.epoch = max(member.epoch, int(response.epoch))
    member.next_heartbeat = now + min(HEARTBEAT_FRACTION * member.consumer_timeout, member.assignment_check)
    assignments = {a.stream: sorted(a.partitions) for a in response.assignments if a.partitions}
    member.pending = assignments if assignments != member.assignments else None
    yield from _record(core, member, assignments)


def _record(
    core: ClientCore, member: GroupMember, assignments: dict[str, list[int]], *, left: bool = False
) -> Op[None]:
    """Record the member in the group roster when what it knows changed (once per change: a
    failed record is not retried until the next change)."""
    seen = (member.epoch, member.coordinator, sorted(assignments.items()), left)
    if not member.roster or seen == member.recorded:
        return
    member.recorded = seen
    record = group_roster.MemberRecord(
        group_id=member.group_id,
        consumer_id=member.consumer_id,
        streams=member.streams,
        epoch=member.epoch,
        coordinator=member.coordinator,
        assignments=assignments,
        left=left,
    )
    yield from group_roster.record_member(core, record)


def adopt(core: ClientCore, member: GroupMember) -> Op[None]:
    """Adopt the assignments fetched last, if they changed (see :func:`_reassign`)."""
    pending, member.pending = member.pending, None
    if pending is not None:
        yield from _reassign(core, member, pending)


def forget_if_left(member: GroupMember) -> bool:
    """After the keeper left the group for an idle caller (:attr:`GroupMember.left_idle`), forget
    the partitions and positions it had (others read them now, from the group's positions);
    returns whether it had left. The next poll joins again."""
    if not member.left_idle:
        return False
    member.left_idle = False
    member.assignments, member.positions, member.committed, member.handover_due = {}, {}, {}, {}
    member.pending = None
    return True


def left_for_max_poll_interval(member: GroupMember) -> MaxPollIntervalExceededError:
    """The error a caller gets once its member left for ``max_poll_interval`` (see :func:`require_membership`)."""
    return MaxPollIntervalExceededError(
        f"consumer {member.consumer_id!r} of group {member.group_id!r} left the group after its caller was away"
        f" for more than max_poll_interval={member.max_poll_interval} s; nothing was committed for what the"
        " caller was given: its partitions went to the other members, which read them from the group's"
        " positions. Handle messages faster (smaller batches) or raise max_poll_interval"
    )


def require_membership(member: GroupMember) -> None:
    """Refuse to go on as the owner of the member's partitions once it left the group for an idle
    caller: forget them (:func:`forget_if_left`) and raise.

    :raises MaxPollIntervalExceededError: the member left for ``max_poll_interval`` meanwhile.
    """
    if forget_if_left(member):
        raise left_for_max_poll_interval(member)


def check(core: ClientCore, member: GroupMember) -> Op[None]:
    """The bookkeeping at the start of a caller's call: join (again) if needed, fetch the
    assignments when the check is due, adopt what changed.

    :raises ConsumerGroupError: / :raises UnavailableError: see :func:`heartbeat`.
    """
    forget_if_left(member)
    if not member.joined or time.monotonic() >= member.next_heartbeat:
        yield from fetch_assignments(core, member)
    yield from adopt(core, member)


def retry_wait(member: GroupMember) -> float:
    return min(1.0, member.consumer_timeout / 10)


def _heartbeat_failed(core: ClientCore, member: GroupMember, failure: RpcFailure, now: float) -> Op[None]:
    C, details = grpc.StatusCode, failure.details
    if failure.code == C.NOT_FOUND or (failure.code == C.FAILED_PRECONDITION and "not a member" in details):
        # The group forgot us (we were silent too long, or the group was deleted): join again.
        member.joined = False
        yield from join(core, member)
        member.next_heartbeat = 0.0
        return
    if failure.code == C.FAILED_PRECONDITION and ("coordinator" in details or "epoch" in details):
        before = (member.coordinator, member.epoch)
        if not (yield from _refresh_coordinator(core, member)):
            member.joined = False
        elif (member.coordinator, member.epoch) != before:
            member.next_heartbeat = 0.0  # a rebalance (new epoch) or a new coordinator: ask at once
        return
    if not is_transient(failure) and failure.code != C.DEADLINE_EXCEEDED:
        raise _refused("FetchConsumerGroupAssignments", member, failure) from failure.__cause__
    # The coordinator does not answer: after coordinator_timeout, report it (upstream's failover).
    if member.coordinator_silent_since is None:
        member.coordinator_silent_since = now
        return
    if now - member.coordinator_silent_since < member.coordinator_timeout:
        return
    report = api_pb2.ReportConsumerGroupCoordinatorRequest(
        groupId=member.group_id, consumerId=member.consumer_id, coordinator=member.coordinator, epoch=member.epoch
    )
    try:
        yield from _call_any(core, "ReportConsumerGroupCoordinator", report)
    except RpcFailure:
        pass  # a stale generation: someone already moved the group; the metadata says where
    yield from _refresh_coordinator(core, member)


def _reassign(core: ClientCore, member: GroupMember, assignments: dict[str, list[int]]) -> Op[None]:
    """Adopt new assignments: commit and forget revoked partitions, find where new ones start.

    A new partition may still be read by its previous owner until that member's next assignment
    check; it then commits where it stopped (with auto-commit). So the new owner reads it only
    after :data:`HANDOVER_CHECKS` checks, and first moves its position to the group's cursor if
    that went past it (see :func:`take_over`); its position is fixed now all the same, so that
    ``auto_offset="new_only"`` misses nothing published meanwhile.
    """
    old = set(member.assigned())
    member.assignments = assignments
    new = set(member.assigned())
    revoked = sorted(old - new)
    log.info(
        "consumer %s of group %s (epoch %d) now reads %s; taken over: %s; given up: %s",
        member.consumer_id,
        member.group_id,
        member.epoch,
        assignments,
        sorted(new - old),
        revoked,
    )
    if revoked and member.auto_commit_interval:
        yield from _commit(core, member, revoked)
    for key in revoked:
        member.positions.pop(key, None)
        member.committed.pop(key, None)
        member.handover_due.pop(key, None)
    start_at = time.monotonic() + HANDOVER_CHECKS * member.assignment_check
    for stream, partition in sorted(new - old):
        if member.handover:
            member.handover_due[(stream, partition)] = start_at
        cursor = yield from cursors.fetch_cursor(core, member.cursor_id, stream, partition)
        member.committed[(stream, partition)] = cursor
        if cursor >= 0:
            member.positions[(stream, partition)] = cursor + 1
        else:
            member.positions[(stream, partition)] = yield from _auto_position(core, member, stream, partition)


def take_over(core: ClientCore, member: GroupMember, stream: str, partition: int) -> Op[None]:
    """Start reading a partition after its hand-over wait: past the group's position if the
    previous owner committed beyond where this member would start."""
    key = (stream, partition)
    cursor = yield from cursors.fetch_cursor(core, member.cursor_id, stream, partition)
    if cursor + 1 > member.positions.get(key, 0):
        member.positions[key], member.committed[key] = cursor + 1, cursor
    member.handover_due.pop(key, None)


def _auto_position(core: ClientCore, member: GroupMember, stream: str, partition: int) -> Op[int]:
    if member.auto_offset == "earliest":
        return 0  # the first offset at or after 0 is the oldest retained message
    if member.auto_offset == "none":
        raise ConsumerGroupError(
            f"group {member.group_id!r} has no committed position for stream {stream!r} partition {partition};"
            " pass auto_offset='earliest', 'latest' or 'new_only' to start without one"
        )
    hw = (yield from operations.fetch_partition_metadata(core, stream, partition)).high_watermark
    return hw + 1 if member.auto_offset == "new_only" else max(hw, 0)


def _commit(core: ClientCore, member: GroupMember, keys: Sequence[tuple[str, int]] | None = None) -> Op[int]:
    pending = member.uncommitted(keys)
    for (stream, partition), offset in pending.items():
        yield from cursors.set_cursor(core, member.cursor_id, stream, partition, offset)
        member.committed[(stream, partition)] = offset
    return len(pending)


def commit(core: ClientCore, member: GroupMember) -> Op[int]:
    """Store the group's position after the last message handed out, per partition that moved;
    returns how many partitions' positions were stored.

    :raises MaxPollIntervalExceededError: the member left the group meanwhile (the caller was away
        longer than ``max_poll_interval``): nothing was stored, the partitions are other members' now.
    :raises UnavailableError: / :raises NotLeaderError: the cursor could not be stored.
    """
    require_membership(member)
    count = yield from _commit(core, member)
    if member.auto_commit_interval:
        member.next_commit = time.monotonic() + member.auto_commit_interval
    return count


def leave(core: ClientCore, member: GroupMember) -> Op[None]:
    """Commit (with auto-commit on) and leave the group; its partitions go to the other members.

    Leaving a group that already forgot this member is not an error.

    :raises UnavailableError: no broker answered.
    """
    if forget_if_left(member) or not member.joined:
        return
    if member.auto_commit_interval:
        yield from _commit(core, member)
    yield from send_leave(core, member)
    yield from _record(core, member, {}, left=True)
    member.assignments, member.positions, member.committed = {}, {}, {}


def send_leave(core: ClientCore, member: GroupMember) -> Op[None]:
    """``LeaveConsumerGroup`` for this member, nothing else (no commit); a group that already
    forgot the member is fine.

    :raises ConsumerGroupError: the server refused otherwise. :raises UnavailableError: no broker answered.
    """
    request = api_pb2.LeaveConsumerGroupRequest(groupId=member.group_id, consumerId=member.consumer_id)
    try:
        yield from _call_any(core, "LeaveConsumerGroup", request)
    except RpcFailure as failure:
        if failure.code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION):
            raise _refused("LeaveConsumerGroup", member, failure) from failure.__cause__
    member.joined = False
