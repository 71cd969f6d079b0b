"""How an event watcher reads: the one-partition reader, the cursor ids it keeps its place in, and
the committer that writes them (see :mod:`.event` for the trigger and what is guaranteed).

Shared by :class:`~.event.LiftbridgeEventTrigger` (its run() path and its ack-mode producer) and
:class:`~.event_group.GroupReader`, which builds its client through a :class:`PartitionReader`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any, NamedTuple, Protocol

from airflow_provider_liftbridge.client import (
    AsyncLiftbridgeClient,
    LiftbridgeError,
    Message,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    StartPosition,
    UnavailableError,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import TRIGGERER_CLIENT_OPTIONS, LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import parse_start_at

from .base import closing_subscription

log = logging.getLogger(__name__)


#: Conditions a long-lived watcher waits out (polling) instead of failing.
WAITABLE = (NoSuchStreamError, NoSuchPartitionError, PartitionPausedError, NotLeaderError, UnavailableError)


def incarnation_cursor_id(cursor_id: str, creation_timestamp: int) -> str:
    """The Liftbridge cursor id a watcher uses for one incarnation of its stream.

    :param cursor_id: the watcher's cursor id.
    :param creation_timestamp: the stream's creation timestamp (``StreamInfo.creation_timestamp``).
    """
    return f"{cursor_id}@{creation_timestamp}"


def started_cursor_id(cursor_key: str) -> str:
    """The mark a watcher sets when it begins reading an incarnation from its first offset."""
    return f"{cursor_key}#started"


def parse_watch_start(value: Any) -> StartPosition | int | dt.datetime:
    """Where a watcher without a place starts, from its ``start_at``.

    :raises LiftbridgeArgumentError: not a start position, or ``"latest"``.
    """
    position = parse_start_at(value)
    if position is StartPosition.LATEST:
        raise LiftbridgeArgumentError(
            f"start_at {value!r} cannot start a watcher: use 'earliest', 'new_only', an offset or an ISO 8601 "
            "timestamp ('latest' would re-read the newest message after every restart before the first event)"
        )
    return position


class Delivery(NamedTuple):
    """A message read by a watcher, with the cursor id of the stream incarnation it belongs to."""

    cursor_key: str
    message: Message


class WatchTarget(Protocol):
    """What a reader needs to know of its watcher (:class:`~.event.LiftbridgeEventTrigger` has it all)."""

    stream: str
    partition: int
    cursor_id: str
    start_at: int | str
    brokers: str | None
    poll_interval: float
    liftbridge_conn_id: str
    consumer_group: str | None
    consumer_id: str | None


class Reader(Protocol):
    """A watcher's reader: one partition (:class:`PartitionReader`) or a consumer-group member
    (:class:`~.event_group.GroupReader`)."""

    async def open(self) -> AsyncLiftbridgeClient: ...

    def deliveries(self) -> AsyncIterator[Delivery]: ...

    async def commit(self, cursor_key: str, offset: int) -> None: ...

    async def close(self) -> None: ...


class PartitionReader:
    """Reads one partition from the watcher's place on, waits out a missing, paused or read-only
    partition, and writes the watcher's cursor. Shared by the run() path and the ack-mode producer;
    only who calls :meth:`commit`, and when, differs."""

    def __init__(self, trigger: WatchTarget) -> None:
        self._trigger = trigger
        self._hook: LiftbridgeAsyncHook | None = None
        self._client: AsyncLiftbridgeClient | None = None
        self._incarnation: int | None = None

    async def open(self) -> AsyncLiftbridgeClient:
        """Build the client: from ``brokers`` when given, else from the connection."""
        if self._client is None:
            if self._trigger.brokers:
                self._client = AsyncLiftbridgeClient(self._trigger.brokers, **TRIGGERER_CLIENT_OPTIONS)
            else:
                self._hook = LiftbridgeAsyncHook(liftbridge_conn_id=self._trigger.liftbridge_conn_id)
                self._client = await self._hook.get_async_client()
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        hook, self._hook = self._hook, None
        if hook is not None:
            await hook.aclose()
        elif client is not None:
            await client.close()

    async def _locate(self, client: AsyncLiftbridgeClient) -> tuple[str, StartPosition | int | dt.datetime]:
        """The cursor id of the stream's current incarnation and where to subscribe from.

        :raises NoSuchStreamError: / :raises NoSuchPartitionError: not there (yet).
        """
        t = self._trigger
        metadata = await client.fetch_metadata([t.stream])
        info = metadata.streams.get(t.stream)
        if info is None:
            raise NoSuchStreamError(f"stream {t.stream!r} does not exist (yet)")
        if t.partition not in info.partitions:
            raise NoSuchPartitionError(f"stream {t.stream!r} has no partition {t.partition}")
        key = incarnation_cursor_id(t.cursor_id, info.creation_timestamp)
        seen_before, self._incarnation = self._incarnation, info.creation_timestamp
        cursor = await client.fetch_cursor(key, t.stream, t.partition)
        if cursor >= 0:
            return key, cursor + 1
        # No message done yet in this incarnation. A "started" mark (a second cursor) tells a restart
        # that the watcher already began here, i.e. at the partition's start: a cursor of -1 cannot.
        started = started_cursor_id(key)
        if await client.fetch_cursor(started, t.stream, t.partition) >= 0 or (
            seen_before is not None and seen_before != info.creation_timestamp  # re-created while watched
        ):
            start: StartPosition | int | dt.datetime = StartPosition.EARLIEST
        else:
            start = parse_watch_start(t.start_at)
            if start is StartPosition.NEW_ONLY:
                # Pin "new" now, so a restart before the first event does not skip what came meanwhile.
                newest = (await client.fetch_partition_metadata(t.stream, t.partition)).newest_offset
                if newest >= 0:
                    await client.set_cursor(key, t.stream, t.partition, newest)
                    return key, newest + 1
                start = StartPosition.EARLIEST
        if start is StartPosition.EARLIEST:
            await client.set_cursor(started, t.stream, t.partition, 0)
        return key, start

    async def deliveries(self) -> AsyncIterator[Delivery]:
        """Every message from the watcher's place on, forever (a missing, paused or read-only
        partition is polled every ``poll_interval`` seconds)."""
        t = self._trigger
        client = await self.open()
        last_why = ""
        while True:
            try:
                key, start = await self._locate(client)
                subscription = client.subscribe(t.stream, partition=t.partition, start_at=start)
                async with closing_subscription(subscription) as messages:
                    async for message in messages:
                        yield Delivery(key, message)
                why = "the partition is read-only"
            except WAITABLE as exc:
                why = str(exc)
            # Said once per condition, not once per poll.
            level = logging.DEBUG if why == last_why else logging.INFO
            log.log(level, "watcher of %s/%d waits (every %gs): %s", t.stream, t.partition, t.poll_interval, why)
            last_why = why
            await asyncio.sleep(t.poll_interval)

    async def commit(self, cursor_key: str, offset: int) -> None:
        """Record ``offset`` as the last message the watcher is done with."""
        client = await self.open()
        await client.set_cursor(cursor_key, self._trigger.stream, self._trigger.partition, offset)


class CursorCommitter:
    """Writes the watcher's cursor ``interval`` seconds after the first confirmed message it does
    not cover yet, or as soon as ``every`` confirmed messages are not covered, whichever comes
    first. Writes are serialized and never move the cursor back."""

    def __init__(self, reader: Reader, every: int, interval: float) -> None:
        self._reader = reader
        self._every = every
        self._interval = interval
        self._pending: tuple[str, int] | None = None
        self._count = 0
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task[None] | None = None

    async def done(self, cursor_key: str, offset: int) -> None:
        """Note that the watcher is done with ``offset`` (its event is stored, or it fired none)."""
        if self._pending is not None and self._pending[0] != cursor_key:
            await self.flush()  # the stream was re-created: close the old incarnation first
        self._pending = (cursor_key, offset)
        self._count += 1
        if self._count >= self._every:
            await self.flush()
        elif self._timer is None or self._timer.done():
            self._timer = asyncio.create_task(self._flush_later(), name="liftbridge-watcher-cursor")

    async def flush(self) -> None:
        """Write the newest noted offset now (nothing when none is pending).

        :raises LiftbridgeError: the write failed (the offset stays pending).
        """
        async with self._lock:
            pending, count = self._pending, self._count
            if pending is None:
                return
            self._pending, self._count = None, 0
            try:
                await self._reader.commit(*pending)
            except BaseException:
                if self._pending is None:  # nothing newer was noted meanwhile: keep this one
                    self._pending, self._count = pending, self._count + count
                raise

    async def _flush_later(self) -> None:
        while self._pending is not None:
            await asyncio.sleep(self._interval)
            try:
                await self.flush()
            except LiftbridgeError as exc:
                log.warning("watcher cursor write failed (retrying in %gs): %s", self._interval, exc)

    async def aclose(self) -> None:
        """Stop the timer and write what is pending (best effort: a failure is logged)."""
        timer, self._timer = self._timer, None
        if timer is not None and not timer.done():
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await timer
        try:
            await self.flush()
        except LiftbridgeError as exc:
            log.warning("watcher cursor write on close failed; its last messages will be read again: %s", exc)
