"""A reading task as a member of a consumer group: the partitions the group assigns to it, read
only after the hand-over, the check before each batch that a partition is still its own, and the
check before each commit that the member is still in the group. The member's keeper heartbeats
while the task works, up to ``max_poll_interval`` per batch; a batch that comes back later commits
nothing and fails the task with :class:`~airflow_provider_liftbridge.client.MaxPollIntervalExceededError`
(``docs/consume.md``, "Consumer groups"; ``docs/consumer-groups.md``, "What keeps a member alive")."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import PartitionPlan

__all__ = ["ConfirmOwner", "KeepReading", "group_partitions"]

#: Asked before each batch in a consumer group: is the plan's partition still this task's?
KeepReading = Callable[[PartitionPlan], bool]
#: Called before each commit in a consumer group: raises once the member left the group.
ConfirmOwner = Callable[[], None]


@contextmanager
def group_partitions(
    client: LiftbridgeClient, group_id: str, stream: str, max_poll_interval: float | None, log: logging.Logger
) -> Iterator[tuple[list[int], KeepReading, ConfirmOwner]]:
    """Join ``group_id`` for ``stream``; yield the partitions it assigns (after their hand-over
    wait, so their previous owner has stopped and committed before the plan reads the group's
    positions), the per-batch check and the per-commit check (``member.confirm_membership``:
    :class:`~airflow_provider_liftbridge.client.MaxPollIntervalExceededError` once the member left
    for ``max_poll_interval``); leave the group when the block ends."""
    with client.group_consumer(
        group_id, [stream], auto_commit_interval=None, max_poll_interval=max_poll_interval
    ) as member:
        wait = member.handover_wait
        if wait > 0:
            log.info("Waiting %.1f s for the partitions' previous owners to hand them over", wait)
            time.sleep(wait)
        assigned = member.check_assignments().get(stream, [])
        log.info(
            "Consumer group %r assigned partition(s) %s of stream %r to member %s",
            group_id,
            assigned,
            stream,
            member.consumer_id,
        )

        def keep_reading(plan: PartitionPlan) -> bool:
            return plan.partition in member.check_assignments().get(stream, [])

        yield assigned, keep_reading, member.confirm_membership
