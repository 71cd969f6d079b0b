"""Consumer groups of the dev server: membership, coordinators, partition assignments and coordinator failover.

Liftbridge (v1.8+, beta) keeps consumer groups in its Raft metadata; every broker knows every group,
and one broker per group, the *coordinator*, hands out partition assignments and watches its
members' liveness. This module is that metadata for the dev server's single-process cluster: one
:class:`ConsumerGroups` object shared by every broker, and one :class:`GroupsApi` per broker that
answers the four group RPCs as that broker. What follows upstream and what is simplified is written
down in ``docs/consumer-groups.md``; in short:

- ``JoinConsumerGroup`` creates a missing group with the least-loaded live broker as coordinator and
  epoch 0; joining an existing group bumps its epoch. All requested streams must exist.
- The epoch is the group's generation: it grows on every membership change, every coordinator change
  and every change of the computed assignments (a stream deleted under the group).
- Assignments: for each stream the group consumes (in name order), each partition goes to the
  subscribed member with the fewest assignments so far (ties: the smaller consumer id), as upstream
  balances. They are recomputed from scratch on every change.
- ``FetchConsumerGroupAssignments`` is the members' heartbeat. It is answered by the coordinator only,
  for the group's current epoch only (a member learns a new one from FetchMetadata, as on v1.9); a
  member that has not fetched for ``consumer_timeout`` is removed (a rebalance), unless the
  coordinator broker itself is down (its liveness timers stopped with it, as upstream).
- ``ReportConsumerGroupCoordinator``: when more than half of the members reported the coordinator
  within ``coordinator_timeout`` of each other, another live broker becomes coordinator and the epoch grows.
- Groups live in memory: a restarted dev server has none (consumers join again; their positions are
  cursors, which are durable).
- A test hook with no upstream counterpart: the groups' clock (member deadlines, the window of
  coordinator reports) can be held still and stepped (:meth:`ConsumerGroups.hold_clock`,
  :meth:`~ConsumerGroups.step_clock`, :meth:`~ConsumerGroups.release_clock`), so a test makes a
  member time out exactly when it says, and nothing else times out meanwhile however slowly its
  process runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .errors import ApiError
from .model import BrokerSlot
from .state import Store

log = logging.getLogger(__name__)

#: Upstream's default for ``groups.consumer.timeout`` and ``groups.coordinator.timeout`` (seconds).
DEFAULT_GROUP_TIMEOUT = 15.0
_NS = 1_000_000_000

#: A member's assignments: stream name -> partition ids (ascending).
Assignments = dict[str, list[int]]


def _precondition(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.FAILED_PRECONDITION, message)


@dataclass
class _Member:
    id: str
    streams: tuple[str, ...]
    deadline: float = 0.0
    assignments: Assignments = field(default_factory=dict)


@dataclass
class _Group:
    id: str
    coordinator: str
    epoch: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    #: Members that reported the coordinator, and when the window of reports closes (loop time).
    witnesses: set[str] = field(default_factory=set)
    witness_deadline: float = 0.0


class ConsumerGroups:
    """Every consumer group of one dev server (all brokers share this object).

    :param store: the server's state (streams and their partition counts, live brokers).
    :param consumer_timeout: seconds without an assignment fetch after which a member is removed.
    :param coordinator_timeout: seconds within which a majority of members must report the coordinator.
    """

    def __init__(
        self,
        store: Store,
        consumer_timeout: float = DEFAULT_GROUP_TIMEOUT,
        coordinator_timeout: float = DEFAULT_GROUP_TIMEOUT,
    ) -> None:
        if consumer_timeout <= 0 or coordinator_timeout <= 0:
            raise ValueError("consumer-group timeouts must be positive numbers of seconds")
        self.store = store
        self.consumer_timeout = consumer_timeout
        self.coordinator_timeout = coordinator_timeout
        self.groups: dict[str, _Group] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        #: The groups' clock while a test holds it (``None``: it runs with the event loop's).
        self._held: float | None = None
        #: Seconds added to the loop's time (what a held clock was stepped by, once released).
        self._offset = 0.0

    # -- queries ----------------------------------------------------------------
    def fill_metadata(self, resp: api_pb2.FetchMetadataResponse, group_ids: Iterable[str]) -> None:
        """Add a ``ConsumerGroupMetadata`` per requested group to a FetchMetadata response."""
        for group_id in group_ids:
            group = self.groups.get(group_id)
            if group is None:
                resp.groupMetadata.add(groupId=group_id, error=api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP)
            else:
                self._refresh(group)
                resp.groupMetadata.add(groupId=group_id, coordinator=group.coordinator, epoch=group.epoch)

    # -- membership -------------------------------------------------------------
    def join(self, group_id: str, consumer_id: str, streams: Iterable[str]) -> tuple[str, int]:
        """Add a member (creating the group); returns ``(coordinator, epoch)``.

        :raises ApiError: FAILED_PRECONDITION for a stream that does not exist or a consumer that
            is already a member, or when no broker is live.
        """
        wanted = tuple(dict.fromkeys(streams))
        for name in wanted:
            if name not in self.store.streams:
                raise _precondition(f"stream {name} does not exist")
        group = self.groups.get(group_id)
        if group is None:
            group = _Group(group_id, self._pick_coordinator(exclude=""))
            self.groups[group_id] = group
            group.epoch = -1  # the new group's first change below makes it 0, as upstream's new groups
        elif consumer_id in group.members:
            raise _precondition("consumer is already a member of the consumer group")
        group.members[consumer_id] = _Member(consumer_id, wanted, self._now() + self.consumer_timeout)
        self._rebalance(group)
        self._ensure_sweeper()
        log.info("consumer %s joined group %s (epoch %d)", consumer_id, group_id, group.epoch)
        return group.coordinator, group.epoch

    def leave(self, group_id: str, consumer_id: str, *, expired: bool = False) -> None:
        """Remove a member; the last one to leave deletes the group.

        :raises ApiError: NOT_FOUND for an unknown group, FAILED_PRECONDITION for a non-member.
        """
        group = self.groups.get(group_id)
        if group is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, "consumer group does not exist")
        if group.members.pop(consumer_id, None) is None:
            raise _precondition("consumer is not a member of the consumer group")
        group.witnesses.discard(consumer_id)
        log.info("consumer %s %s group %s", consumer_id, "timed out of" if expired else "left", group_id)
        if not group.members:
            del self.groups[group_id]
            return
        self._rebalance(group)

    def assignments(self, broker_id: str, group_id: str, consumer_id: str, epoch: int) -> tuple[Assignments, int]:
        """The member's assignments and the group epoch; counts as the member's heartbeat.

        :raises ApiError: NOT_FOUND for an unknown group; FAILED_PRECONDITION when ``broker_id``
            is not the coordinator, the epoch is not the group's (Liftbridge v1.9: a member learns a
            new epoch from FetchMetadata), or the consumer is no member.
        """
        group = self.groups.get(group_id)
        if group is None:
            raise ApiError(grpc.StatusCode.NOT_FOUND, "consumer group does not exist")
        if group.coordinator != broker_id:
            raise _precondition("broker is not the consumer group coordinator")
        self._refresh(group)
        if epoch != group.epoch:
            raise _precondition("client-provided group epoch differs from broker group epoch")
        member = group.members.get(consumer_id)
        if member is None:
            raise _precondition("consumer is not a member of the consumer group")
        member.deadline = self._now() + self.consumer_timeout
        return {s: list(p) for s, p in member.assignments.items()}, group.epoch

    def report_coordinator(self, group_id: str, consumer_id: str, coordinator: str, epoch: int) -> None:
        """Record a member's report that the coordinator is unresponsive; fail over on a majority.

        :raises ApiError: FAILED_PRECONDITION for an unknown group, a stale coordinator or epoch,
            a non-member, or when no other live broker can take over.
        """
        group = self.groups.get(group_id)
        if group is None:
            raise _precondition(f"No such consumer group {group_id}")
        if coordinator != group.coordinator or epoch != group.epoch:
            raise _precondition(
                f"Coordinator generation mismatch, current coordinator: {group.coordinator} epoch: {group.epoch}, "
                f"got coordinator: {coordinator} epoch: {epoch}"
            )
        if consumer_id not in group.members:
            raise _precondition(f"Consumer {consumer_id} is not a member of consumer group {group_id}")
        now = self._now()
        if now > group.witness_deadline:
            group.witnesses.clear()
        group.witnesses.add(consumer_id)
        group.witness_deadline = now + self.coordinator_timeout
        if len(group.witnesses) > len(group.members) // 2:
            new = self._pick_coordinator(exclude=group.coordinator)
            log.warning("group %s: coordinator %s reported failed, %s takes over", group_id, group.coordinator, new)
            group.coordinator = new
            group.witnesses.clear()
            group.epoch += 1
            # The new coordinator starts its members' liveness timers afresh, as upstream does.
            deadline = now + self.consumer_timeout
            for member in group.members.values():
                member.deadline = deadline

    # -- the test clock ---------------------------------------------------------
    def hold_clock(self) -> None:
        """Stop the groups' clock (a test hook): no member deadline and no report window passes
        until :meth:`step_clock` moves it; heartbeats still reset deadlines, from the held time."""
        if self._held is None:
            self._held = self._now()

    def step_clock(self, seconds: float) -> list[tuple[str, str]]:
        """Move the held clock on by ``seconds`` and time out, at once, every member whose deadline
        it passed (as the sweep would, so not under a coordinator that is down).

        :returns: ``(group id, consumer id)`` of the members timed out by this step.
        :raises RuntimeError: the clock is not held.
        :raises ValueError: a negative step.
        """
        if self._held is None:
            raise RuntimeError("the groups' clock is not held; call hold_clock() first")
        if seconds < 0:
            raise ValueError(f"the groups' clock does not go back (step of {seconds} s)")
        self._held += seconds
        return self._expire()

    def release_clock(self) -> None:
        """Let the groups' clock run again, on from where it was held (no jump back)."""
        if self._held is not None:
            self._offset = self._held - asyncio.get_running_loop().time()
            self._held = None

    def close(self) -> None:
        """Stop the liveness sweeps (the server is stopping)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    # -- internals --------------------------------------------------------------
    def _now(self) -> float:
        if self._held is not None:
            return self._held
        return asyncio.get_running_loop().time() + self._offset

    def _pick_coordinator(self, *, exclude: str) -> str:
        """The live broker (other than ``exclude``) coordinating the fewest groups; ties: broker order."""
        candidates: list[BrokerSlot] = [b for b in self.store.live_brokers() if b.id != exclude]
        if not candidates:
            raise _precondition("No group coordinator candidates")
        load = {b.id: 0 for b in candidates}
        for group in self.groups.values():
            if group.coordinator in load:
                load[group.coordinator] += 1
        return min(candidates, key=lambda b: (load[b.id], b.index)).id

    def _compute(self, group: _Group) -> dict[str, Assignments]:
        """Assignments per member, balanced as upstream balances them (see the module docstring)."""
        result: dict[str, Assignments] = {m: {} for m in group.members}
        counts = dict.fromkeys(group.members, 0)
        for name in sorted({s for m in group.members.values() for s in m.streams}):
            stream = self.store.streams.get(name)
            subscribers = [m for m in group.members.values() if name in m.streams]
            if stream is None or not subscribers:
                continue
            for pid in range(len(stream.partitions)):
                chosen = min(subscribers, key=lambda m: (counts[m.id], m.id))
                result[chosen.id].setdefault(name, []).append(pid)
                counts[chosen.id] += 1
        return result

    def _rebalance(self, group: _Group) -> None:
        """Recompute assignments after a change and move to the next epoch."""
        for member_id, assigned in self._compute(group).items():
            group.members[member_id].assignments = assigned
        group.epoch += 1

    def _refresh(self, group: _Group) -> None:
        """Notice assignments that changed without a membership change (a stream was deleted)."""
        computed = self._compute(group)
        if any(group.members[m].assignments != a for m, a in computed.items()):
            self._rebalance(group)

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None:
            interval = min(self.consumer_timeout / 5, 1.0)
            self._sweeper = asyncio.get_running_loop().call_later(interval, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        self._expire()
        if self.groups:
            self._ensure_sweeper()

    def _expire(self) -> list[tuple[str, str]]:
        """Remove members whose coordinator is live and whose liveness deadline passed."""
        now = self._now()
        live = {b.id for b in self.store.live_brokers()}
        expired: list[tuple[str, str]] = []
        for group in list(self.groups.values()):
            if group.coordinator not in live:
                continue  # the coordinator's timers are down with it; members wait for failover
            for member in [m for m in group.members.values() if m.deadline < now]:
                self.leave(group.id, member.id, expired=True)
                expired.append((group.id, member.id))
        return expired


async def _abort(context: Any, err: ApiError) -> NoReturn:
    await context.abort(err.code, err.message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


async def _require(context: Any, **fields: str) -> None:
    """INVALID_ARGUMENT for the first empty field, worded as upstream (``No groupId provided``)."""
    for name, value in fields.items():
        if not value:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"No {name} provided")


class GroupsApi:
    """The four consumer-group RPCs as answered by one broker.

    :param groups: the server's groups (shared by all brokers).
    :param broker: the broker answering (only the coordinator serves assignments).
    """

    def __init__(self, groups: ConsumerGroups, broker: BrokerSlot) -> None:
        self.groups = groups
        self.broker = broker

    async def JoinConsumerGroup(self, req: api_pb2.JoinConsumerGroupRequest, context: Any) -> Any:
        await _require(context, groupId=req.groupId, consumerId=req.consumerId)
        if not req.streams:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "No streams provided")
        try:
            coordinator, epoch = self.groups.join(req.groupId, req.consumerId, req.streams)
        except ApiError as err:
            await _abort(context, err)
        return api_pb2.JoinConsumerGroupResponse(
            coordinator=coordinator,
            epoch=epoch,
            consumerTimeout=int(self.groups.consumer_timeout * _NS),
            coordinatorTimeout=int(self.groups.coordinator_timeout * _NS),
        )

    async def LeaveConsumerGroup(self, req: api_pb2.LeaveConsumerGroupRequest, context: Any) -> Any:
        await _require(context, groupId=req.groupId, consumerId=req.consumerId)
        try:
            self.groups.leave(req.groupId, req.consumerId)
        except ApiError as err:
            await _abort(context, err)
        return api_pb2.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(
        self, req: api_pb2.FetchConsumerGroupAssignmentsRequest, context: Any
    ) -> Any:
        await _require(context, groupId=req.groupId, consumerId=req.consumerId)
        try:
            assigned, epoch = self.groups.assignments(self.broker.id, req.groupId, req.consumerId, req.epoch)
        except ApiError as err:
            await _abort(context, err)
        resp = api_pb2.FetchConsumerGroupAssignmentsResponse(epoch=epoch)
        for stream, partitions in sorted(assigned.items()):
            resp.assignments.add(stream=stream, partitions=partitions)
        return resp

    async def ReportConsumerGroupCoordinator(
        self, req: api_pb2.ReportConsumerGroupCoordinatorRequest, context: Any
    ) -> Any:
        await _require(context, groupId=req.groupId, consumerId=req.consumerId, coordinator=req.coordinator)
        try:
            self.groups.report_coordinator(req.groupId, req.consumerId, req.coordinator, req.epoch)
        except ApiError as err:
            await _abort(context, err)
        return api_pb2.ReportConsumerGroupCoordinatorResponse()
