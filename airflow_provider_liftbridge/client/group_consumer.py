"""The two front ends of a consumer-group member: :class:`GroupConsumer` on the blocking client,
:class:`AsyncGroupConsumer` on the asyncio one. Both run the same operations of :mod:`.consumer`
(where the member's state and the group protocol live); they only say how an operation is run.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from .consumer import GroupMember, commit, consume, heartbeat, join, leave
from .effects import Op
from .routing import ClientCore
from .types import Message

__all__ = ["AsyncGroupConsumer", "GroupConsumer"]


class _Consumer:
    """What the two front ends share: the member, the client's transport and core, and the
    operations they run. Made by ``LiftbridgeClient.group_consumer`` /
    ``AsyncLiftbridgeClient.group_consumer`` (whose docstrings describe the options).

    :param run: executes an operation on the client's transport.
    :param drive: executes a streaming operation, yielding what it emits.
    :param core: the client's shared state.
    :param member: the member's state (its group, streams and options).
    :param idle_wait: seconds between polls that found nothing.
    """

    def __init__(
        self,
        run: Callable[[Op[Any]], Any],
        drive: Callable[[Op[Any]], Any],
        core: ClientCore,
        member: GroupMember,
        idle_wait: float = 0.2,
    ) -> None:
        self._run = run
        self._drive = drive
        self._core = core
        self.member = member
        self.idle_wait = idle_wait

    @property
    def consumer_id(self) -> str:
        """This member's id in the group."""
        return self.member.consumer_id

    @property
    def assignments(self) -> dict[str, list[int]]:
        """The partitions assigned to this member, per stream (as last heard from the coordinator)."""
        return {s: list(p) for s, p in self.member.assignments.items()}

    # The operations, bound to this member; the front ends only say how they are run.
    def _join_op(self) -> Op[None]:
        yield from join(self._core, self.member)
        yield from heartbeat(self._core, self.member)

    def _consume_op(self, max_messages: int | None, timeout: float | None) -> Op[None]:
        return consume(self._core, self.member, max_messages=max_messages, timeout=timeout, idle_wait=self.idle_wait)

    @property
    def handover_wait(self) -> float:
        """Seconds until every assigned partition may be read (0: now): a partition taken over
        from another member waits for the hand-over (see ``docs/consumer-groups.md``), so its
        previous owner has stopped and committed. For a caller that reads its partitions itself
        (planned ranges), which should read the group's positions only after this wait."""
        now = time.monotonic()
        return (
            max((due - now for due in self.member.handover_due.values()), default=0.0) if self.member.handover else 0.0
        )

    def _commit_op(self) -> Op[int]:
        return commit(self._core, self.member)

    def _check_op(self) -> Op[dict[str, list[int]]]:
        if not self.member.joined or time.monotonic() >= self.member.next_heartbeat:
            yield from heartbeat(self._core, self.member)
        return self.assignments

    def _leave_op(self) -> Op[None]:
        return leave(self._core, self.member)


class GroupConsumer(_Consumer):
    """A consumer-group member on a blocking :class:`~.sync_client.LiftbridgeClient`.

    ``with client.group_consumer("billing", ["orders"]) as consumer:`` joins, and leaves on exit;
    ``for msg in consumer.messages(): ...`` reads the partitions the group assigns to it. Made by
    :meth:`~.sync_client.LiftbridgeClient.group_consumer` (the options are described there).
    """

    def join(self) -> None:
        """Join the group and fetch this member's first assignments.

        :raises ConsumerGroupError: / :raises UnavailableError: see :func:`join`.
        """
        self._run(self._join_op())

    def messages(self, *, max_messages: int | None = None, timeout: float | None = None) -> Iterator[Message]:
        """The messages of this member's partitions, as they come, until ``max_messages`` or
        ``timeout`` seconds (``None``: until the caller stops iterating). Joins first if needed.

        :raises ConsumerGroupError: / :raises UnavailableError: see :func:`poll`.
        """
        messages: Iterator[Message] = self._drive(self._consume_op(max_messages, timeout))
        return messages

    def commit(self) -> int:
        """Store the group's positions (after the last message handed out); returns how many partitions moved."""
        return int(self._run(self._commit_op()))

    def check_assignments(self) -> dict[str, list[int]]:
        """Fetch this member's assignments if the assignment check is due (as a poll does) and
        return them: for a caller that reads its partitions itself between polls (planned
        ranges), so it stops reading a partition the group moved away within one check.

        :raises ConsumerGroupError: / :raises UnavailableError: see :func:`~.consumer.heartbeat`.
        """
        return self._run(self._check_op())  # type: ignore[no-any-return]

    def leave(self) -> None:
        """Commit (with auto-commit on) and leave the group."""
        self._run(self._leave_op())

    def __enter__(self) -> GroupConsumer:
        self.join()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()


class AsyncGroupConsumer(_Consumer):
    """:class:`GroupConsumer` on an :class:`~.async_client.AsyncLiftbridgeClient`: the same
    parameters; ``join``, ``commit`` and ``leave`` are coroutines, ``messages`` an async iterator,
    and it is an async context manager. Made by
    :meth:`~.async_client.AsyncLiftbridgeClient.group_consumer`."""

    async def join(self) -> None:
        """Join the group and fetch this member's first assignments (see :meth:`GroupConsumer.join`)."""
        await self._run(self._join_op())

    def messages(self, *, max_messages: int | None = None, timeout: float | None = None) -> AsyncIterator[Message]:
        """See :meth:`GroupConsumer.messages`."""
        messages: AsyncIterator[Message] = self._drive(self._consume_op(max_messages, timeout))
        return messages

    async def commit(self) -> int:
        """See :meth:`GroupConsumer.commit`."""
        return int(await self._run(self._commit_op()))

    async def check_assignments(self) -> dict[str, list[int]]:
        """See :meth:`GroupConsumer.check_assignments`."""
        return await self._run(self._check_op())  # type: ignore[no-any-return]

    async def leave(self) -> None:
        """See :meth:`GroupConsumer.leave`."""
        await self._run(self._leave_op())

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.join()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.leave()
