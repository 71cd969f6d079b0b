"""Reading a consumer-group member's partitions: :func:`poll` (the group's bookkeeping when due,
then what is committed now on the assigned partitions) and :func:`consume` (polls in a loop). The
member's state and the group protocol are in :mod:`.consumer`; its keeper in :mod:`.liveness`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from . import operations
from .consumer import GroupMember, check, commit, take_over
from .effects import Emit, Op, Pump, Sleep
from .routing import ClientCore
from .subscription import subscribe
from .types import Message

__all__ = ["consume", "poll"]


class _TrackingSink:
    """A subscription's sink that records each message it hands out, and is done once
    ``ended()`` says so (asked after each message)."""

    def __init__(self, inner: Any, record: Callable[[Message], None], ended: Callable[[], bool]) -> None:
        self._inner, self._record, self._ended = inner, record, ended

    @property
    def done(self) -> bool:
        return bool(self._inner.done) or self._ended()

    @done.setter
    def done(self, value: bool) -> None:
        self._inner.done = value

    def take(self, response: Any) -> Any:
        item = self._inner.take(response)
        if item is not None:
            self._record(item)
        return item


def _tracked(op: Op[None], record: Callable[[Message], None], ended: Callable[[], bool]) -> Op[None]:
    """Run ``op`` (a subscription), recording every message it hands out just before it goes,
    and ending it after the first message handed out once ``ended()``."""
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            effect = op.throw(error) if error is not None else op.send(send)
        except StopIteration:
            return
        error = None
        if isinstance(effect, Emit):
            record(effect.item)
        elif isinstance(effect, Pump):
            effect = Pump(effect.handle, _TrackingSink(effect.sink, record, ended))
        try:
            send = yield effect
        except GeneratorExit:
            op.close()
            raise
        except BaseException as exc:  # handed back to the subscription, which knows what to do
            send, error = None, exc


def poll(core: ClientCore, member: GroupMember, limit: int | None = None) -> Op[int]:
    """Do the group's bookkeeping when due, then emit what is committed now on the assigned
    partitions (at most ``max_batch`` per partition, ``limit`` in all); returns how many were emitted.

    :raises ConsumerGroupError: see :func:`heartbeat`; a partition without position and
        ``auto_offset="none"``.
    """
    now = time.monotonic()
    yield from check(core, member)
    if member.auto_commit_interval and now >= member.next_commit:
        yield from commit(core, member)
    emitted = 0

    def check_due() -> bool:  # the assignments are to be fetched, or were fetched and changed
        return time.monotonic() >= member.next_heartbeat or member.pending is not None

    def record(message: Message) -> None:
        nonlocal emitted
        member.handed_out(message)
        emitted += 1

    for stream, partition in member.assigned():
        room = member.max_batch if limit is None else min(member.max_batch, limit - emitted)
        if room <= 0 or check_due():
            break  # the next poll checks the assignments first
        due = member.handover_due.get((stream, partition))
        if due is not None:
            if time.monotonic() < due:
                continue
            yield from take_over(core, member, stream, partition)
        start = member.positions.get((stream, partition), 0)
        hw = (yield from operations.fetch_partition_metadata(core, stream, partition)).high_watermark
        if start > hw:
            continue
        stop = min(hw, start + room - 1)
        reading = subscribe(core, stream, partition=partition, start_at=start, stop_at=stop)
        yield from _tracked(reading, record, check_due)
    return emitted


def consume(
    core: ClientCore,
    member: GroupMember,
    *,
    max_messages: int | None = None,
    timeout: float | None = None,
    idle_wait: float = 0.2,
) -> Op[None]:
    """Emit the group's messages for this member until ``max_messages`` were emitted or ``timeout``
    seconds passed (``None``: until the caller stops), polling every ``idle_wait`` seconds when idle.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    total = 0
    while max_messages is None or total < max_messages:
        got = yield from poll(core, member, None if max_messages is None else max_messages - total)
        total += got
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return
        if got:
            continue
        wait = idle_wait if deadline is None else min(idle_wait, deadline - now)
        yield Sleep(max(wait, 0.0))
