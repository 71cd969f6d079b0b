"""The two front ends of a consumer-group member: :class:`GroupConsumer` on the blocking client,
:class:`AsyncGroupConsumer` on the asyncio one. Both run the same operations of :mod:`.consumer`
and :mod:`.group_reading` (where the member's state and the group protocol live) and the same
keeper step of :mod:`.liveness`; they only say how an operation is run, and how the keeper runs
beside the caller: a thread, or a task.

One call at a time per member: a caller's call holds the member (a lock) from the moment it
enters the client until it hands something back (a message, a result); the keeper takes the
member only while the caller is away, and leaves it alone while the caller is in a call (which
heartbeats itself). So the member's state never has two writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from .consumer import GroupMember, check, commit, heartbeat, join, leave
from .effects import Op
from .errors import ClientClosedError
from .group_reading import consume
from .liveness import caller_back, retry_after_failure, still_owner, tend, wait_for_caller
from .routing import ClientCore
from .types import Message

__all__ = ["AsyncGroupConsumer", "GroupConsumer"]

log = logging.getLogger(__name__)

_END: Any = object()
_T = TypeVar("_T")


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
        yield from check(self._core, self.member)
        return self.assignments

    def _leave_op(self) -> Op[None]:
        return leave(self._core, self.member)

    def _still_owner_op(self) -> Op[None]:
        return still_owner(self.member)

    # The caller's presence (read by the keeper, see .liveness); its return is .liveness.caller_back.
    def _back_op(self) -> Op[None]:
        return caller_back(self._core, self.member)

    def _away(self) -> None:
        self.member.away_since = time.monotonic()

    def _step_failed(self, exc: Exception) -> float | None:
        """After a keeper step failed: stop on a closed client, else log it and try again later
        (the caller's next call meets the failure itself if it lasts)."""
        if isinstance(exc, ClientClosedError):
            return None
        log.warning(
            "consumer %s of group %s: keeping the member alive failed (%s); trying again",
            self.member.consumer_id,
            self.member.group_id,
            exc,
        )
        return retry_after_failure(self.member)


class GroupConsumer(_Consumer):
    """A consumer-group member on a blocking :class:`~.sync_client.LiftbridgeClient`.

    ``with client.group_consumer("billing", ["orders"]) as consumer:`` joins, and leaves on exit;
    ``for msg in consumer.messages(): ...`` reads the partitions the group assigns to it. Made by
    :meth:`~.sync_client.LiftbridgeClient.group_consumer` (the options are described there).

    While the caller handles what it was given, a keeper thread fetches the member's assignments
    (see :mod:`.liveness`), so the member stays in the group however long that takes, up to
    ``max_poll_interval``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Re-entrant: a messages() iterator collected while its own thread is in a call closes
        # inside that call.
        self._held = threading.RLock()
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    def _holding(self, fn: Callable[[], _T]) -> _T:
        """``fn()`` while holding the member (the caller is in a call); then the keeper runs."""
        try:
            with self._held:
                try:
                    self._run(self._back_op())
                    return fn()
                finally:
                    self._away()
        finally:
            self._keep()

    def _call(self, op: Op[_T]) -> _T:
        return self._holding(lambda: self._run(op))  # type: ignore[no-any-return]

    def _keep(self) -> None:
        """Start the keeper thread if the member is in the group and none runs."""
        if not self.member.joined or (self._keeper is not None and self._keeper.is_alive()):
            return
        self._stop = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep_alive,
            args=(self._stop,),
            name=f"liftbridge-group-keeper-{self.member.consumer_id}",
            daemon=True,
        )
        self._keeper.start()

    def _keep_alive(self, stop: threading.Event) -> None:
        delay: float | None = 0.0
        while delay is not None and not stop.wait(delay):
            if not self._held.acquire(blocking=False):
                delay = wait_for_caller(self.member)  # the caller is in a call: it heartbeats
                continue
            try:
                delay = self._run(tend(self._core, self.member))
            except Exception as exc:
                delay = self._step_failed(exc)
            finally:
                self._held.release()

    def _stop_keeper(self) -> None:
        self._stop.set()
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join()

    def join(self) -> None:
        """Join the group and fetch this member's first assignments.

        :raises ConsumerGroupError: / :raises UnavailableError: see :func:`join`.
        """
        self._call(self._join_op())

    def messages(self, *, max_messages: int | None = None, timeout: float | None = None) -> Iterator[Message]:
        """The messages of this member's partitions, as they come, until ``max_messages`` or
        ``timeout`` seconds (``None``: until the caller stops iterating). Joins first if needed.

        :raises ConsumerGroupError: / :raises UnavailableError: see :func:`poll`.
        """
        return self._handed_out(self._drive(self._consume_op(max_messages, timeout)))

    def _handed_out(self, items: Iterator[Message]) -> Iterator[Message]:
        """``items``, each taken while holding the member; the caller is away while it has one."""
        try:
            while True:
                item = self._holding(lambda: next(items, _END))
                if item is _END:
                    return
                yield item
        finally:
            with self._held:
                close = getattr(items, "close", None)
                if close is not None:
                    close()

    def commit(self) -> int:
        """Store the group's positions (after the last message handed out); returns how many partitions moved.

        :raises MaxPollIntervalExceededError: the member left the group meanwhile (its caller was
            away for longer than ``max_poll_interval``): nothing is stored.
        """
        return self._call(self._commit_op())

    def confirm_membership(self) -> None:
        """For a caller that stores the group's positions itself (planned ranges): call it before
        each such commit. Returns if the member is still the owner of what it was given.

        :raises MaxPollIntervalExceededError: the member left the group since the caller's last
            call (it was away for longer than ``max_poll_interval``): do not commit.
        """
        self._call(self._still_owner_op())

    def check_assignments(self) -> dict[str, list[int]]:
        """Fetch this member's assignments if the assignment check is due (as a poll does) and
        return them: for a caller that reads its partitions itself between polls (planned
        ranges), so it stops reading a partition the group moved away within one check.

        :raises ConsumerGroupError: / :raises UnavailableError: see :func:`~.consumer.heartbeat`.
        """
        return self._call(self._check_op())

    def leave(self) -> None:
        """Stop the keeper, commit (with auto-commit on) and leave the group."""
        self._stop_keeper()
        self._call(self._leave_op())

    def __enter__(self) -> GroupConsumer:
        self.join()
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()


class AsyncGroupConsumer(_Consumer):
    """:class:`GroupConsumer` on an :class:`~.async_client.AsyncLiftbridgeClient`: the same
    parameters; ``join``, ``commit`` and ``leave`` are coroutines, ``messages`` an async iterator,
    and it is an async context manager. Made by
    :meth:`~.async_client.AsyncLiftbridgeClient.group_consumer`.

    The keeper is a task on the caller's event loop: a handler that blocks the loop (rather than
    awaiting) stops it too, so run blocking work in a thread (``asyncio.to_thread``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def _holding(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """``await fn()`` while holding the member (the caller is in a call); then the keeper runs."""
        try:
            async with self._held:
                try:
                    await self._run(self._back_op())
                    return await fn()
                finally:
                    self._away()
        finally:
            self._keep()

    async def _call(self, op: Op[_T]) -> _T:
        return await self._holding(lambda: self._run(op))

    def _keep(self) -> None:
        """Start the keeper task if the member is in the group and none runs."""
        if not self.member.joined or (self._keeper is not None and not self._keeper.done()):
            return
        self._stop = asyncio.Event()
        self._keeper = asyncio.get_running_loop().create_task(
            self._keep_alive(self._stop), name=f"liftbridge-group-keeper-{self.member.consumer_id}"
        )

    async def _keep_alive(self, stop: asyncio.Event) -> None:
        delay: float | None = 0.0
        while delay is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
                return
            if self._held.locked():
                delay = wait_for_caller(self.member)  # the caller is in a call: it heartbeats
                continue
            async with self._held:
                try:
                    delay = await self._run(tend(self._core, self.member))
                except Exception as exc:
                    delay = self._step_failed(exc)

    async def _stop_keeper(self) -> None:
        self._stop.set()
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not asyncio.current_task():
            await keeper

    async def join(self) -> None:
        """Join the group and fetch this member's first assignments (see :meth:`GroupConsumer.join`)."""
        await self._call(self._join_op())

    def messages(self, *, max_messages: int | None = None, timeout: float | None = None) -> AsyncIterator[Message]:
        """See :meth:`GroupConsumer.messages`."""
        return self._handed_out(self._drive(self._consume_op(max_messages, timeout)))

    async def _handed_out(self, items: AsyncIterator[Message]) -> AsyncIterator[Message]:
        """``items``, each taken while holding the member; the caller is away while it has one."""
        try:
            while True:
                item = await self._holding(lambda: anext(items, _END))
                if item is _END:
                    return
                yield item
        finally:
            async with self._held:
                aclose = getattr(items, "aclose", None)
                if aclose is not None:
                    await aclose()

    async def commit(self) -> int:
        """See :meth:`GroupConsumer.commit`."""
        return await self._call(self._commit_op())

    async def confirm_membership(self) -> None:
        """See :meth:`GroupConsumer.confirm_membership`."""
        await self._call(self._still_owner_op())

    async def check_assignments(self) -> dict[str, list[int]]:
        """See :meth:`GroupConsumer.check_assignments`."""
        return await self._call(self._check_op())

    async def leave(self) -> None:
        """See :meth:`GroupConsumer.leave`."""
        await self._stop_keeper()
        await self._call(self._leave_op())

    async def __aenter__(self) -> AsyncGroupConsumer:
        await self.join()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.leave()
