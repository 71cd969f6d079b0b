"""The event trigger's reader for ``consumer_group`` watchers: a consumer-group member over the whole stream.

Several watchers (in other DAGs, or on other triggerers) that name the same group share the stream's
partitions: the group's coordinator assigns each partition to one member, so a message fires in one
of them only. The member reads what the group assigns it from the group's cursors
(``__group:<group>``); a message's position is committed through the watcher's usual committer (in
ack mode once its event is stored), per partition. See ``docs/event-driven.md``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from airflow_provider_liftbridge.client import AsyncGroupConsumer, ConsumerGroupError
from airflow_provider_liftbridge.client.consumer import group_cursor_id

from .event_reader import WAITABLE, Delivery, PartitionReader, WatchTarget
from .message import group_auto_offset

if TYPE_CHECKING:
    from airflow_provider_liftbridge.client import AsyncLiftbridgeClient

log = logging.getLogger(__name__)

_PARTITION_MARK = "#partition="


def group_delivery_key(group: str, partition: int) -> str:
    """The cursor key of a group watcher's delivery: the group's cursor id and the partition
    (the committer writes per key, so each partition's position is written on its own)."""
    return f"{group_cursor_id(group)}{_PARTITION_MARK}{partition}"


def split_delivery_key(key: str) -> tuple[str, int]:
    """``(cursor id, partition)`` of a :func:`group_delivery_key`."""
    cursor_id, _, partition = key.rpartition(_PARTITION_MARK)
    return cursor_id, int(partition)


class GroupReader:
    """Reads the partitions the group assigns to this watcher and writes the group's cursors; the
    same interface as the event trigger's one-partition reader (``open``, ``deliveries``, ``commit``,
    ``close``)."""

    def __init__(self, trigger: WatchTarget) -> None:
        assert trigger.consumer_group
        self._trigger = trigger
        self._group = trigger.consumer_group
        self._connection = PartitionReader(trigger)  # owns building and closing the client
        self._consumer: AsyncGroupConsumer | None = None

    async def open(self) -> AsyncLiftbridgeClient:
        return await self._connection.open()

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Every message of this member's partitions, from the group's positions on, forever (a
        missing stream is polled every ``poll_interval`` seconds)."""
        t = self._trigger
        self._consumer = consumer = (await self.open()).group_consumer(
            self._group,
            t.stream,
            consumer_id=t.consumer_id,
            auto_offset=group_auto_offset(t.start_at),
            auto_commit_interval=None,  # the watcher's committer writes positions, once events are stored
        )
        while True:
            try:
                async for message in consumer.messages():
                    yield Delivery(group_delivery_key(self._group, message.partition), message)
            except (ConsumerGroupError, *WAITABLE) as exc:
                log.info("group watcher of %s waits (every %gs): %s", t.stream, t.poll_interval, exc)
                await asyncio.sleep(t.poll_interval)

    async def commit(self, cursor_key: str, offset: int) -> None:
        """Record ``offset`` as the group's position in the key's partition."""
        cursor_id, partition = split_delivery_key(cursor_key)
        await (await self.open()).set_cursor(cursor_id, self._trigger.stream, partition, offset)

    async def close(self) -> None:
        """Leave the group (its partitions go to the other members at once), then close the client."""
        consumer, self._consumer = self._consumer, None
        try:
            if consumer is not None and consumer.member.joined:
                await consumer.leave()  # no commit: unconfirmed messages stay for the next owner
        except Exception as exc:  # leaving is a courtesy: the coordinator times the member out anyway
            log.warning("group watcher of %s could not leave group %s: %s", self._trigger.stream, self._group, exc)
        finally:
            await self._connection.close()
