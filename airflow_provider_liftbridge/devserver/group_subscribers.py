"""One subscriber per consumer group per partition, as Liftbridge fences group members on Subscribe.

Liftbridge (``server/partition.go``, ``partition.Subscribe``) keeps, per partition, the group's
current subscriber: its consumer id and the group epoch its Subscribe carried (``consumer``). A
Subscribe of the same group with an epoch at least that one's closes the current subscription on the
server (its call ends with status OK, no error: ``server/api.go`` returns nil when the subscription
is closed) and takes its place; one with an older epoch is refused with FAILED_PRECONDITION
"Consumer is not currently assigned this partition". Nothing else is checked: the server does not
ask whether the group exists, whether the consumer is a member, or whether the partition is
assigned to it. When a subscription ends, it is taken out of its partition only if the group's
current subscriber has its consumer id (upstream's ``removeGroupSubscriber``), so a consumer that
replaced its own subscription leaves the partition with no group subscriber once the old one ends.

:class:`GroupSubscribers` is that per-partition record (no I/O); the dev server's Subscribe
(``service.py``) consults it, and wakes the partition's waiting readers when it closed one.
"""

from __future__ import annotations

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .errors import ApiError

#: How Liftbridge refuses a group Subscribe whose epoch is older than the current subscriber's.
NOT_ASSIGNED = "Consumer is not currently assigned this partition"


class GroupSubscriber:
    """One group member's subscription to a partition; ``closed`` once another replaced it."""

    __slots__ = ("closed", "consumer_id", "epoch", "group_id")

    def __init__(self, group_id: str, consumer_id: str, epoch: int) -> None:
        self.group_id = group_id
        self.consumer_id = consumer_id
        self.epoch = epoch
        self.closed = False


class GroupSubscribers:
    """The consumer-group subscribers of one partition: at most one per group."""

    __slots__ = ("_by_group",)

    def __init__(self) -> None:
        self._by_group: dict[str, GroupSubscriber] = {}

    def current(self, group_id: str) -> GroupSubscriber | None:
        """The group's subscriber on this partition, or ``None``."""
        return self._by_group.get(group_id)

    def check(self, consumer: api_pb2.Consumer) -> GroupSubscriber | None:
        """The subscriber a Subscribe carrying ``consumer`` would become; ``None`` without a group.

        :raises ApiError: FAILED_PRECONDITION :data:`NOT_ASSIGNED` when the group's current
            subscriber holds a newer epoch.
        """
        if not consumer.groupId:
            return None
        existing = self._by_group.get(consumer.groupId)
        if existing is not None and existing.epoch > consumer.groupEpoch:
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, NOT_ASSIGNED)
        return GroupSubscriber(consumer.groupId, consumer.consumerId, consumer.groupEpoch)

    def replace(self, sub: GroupSubscriber) -> bool:
        """Make ``sub`` its group's subscriber, closing the one it replaces; ``True`` if it did."""
        previous = self._by_group.get(sub.group_id)
        self._by_group[sub.group_id] = sub
        if previous is None or previous is sub:
            return False
        previous.closed = True
        return True

    def release(self, sub: GroupSubscriber) -> None:
        """``sub``'s subscription ended: forget the group's subscriber if it has ``sub``'s consumer id."""
        current = self._by_group.get(sub.group_id)
        if current is not None and current.consumer_id == sub.consumer_id:
            del self._by_group[sub.group_id]
