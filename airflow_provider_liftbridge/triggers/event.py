"""``LiftbridgeEventTrigger``: a stream partition as an Airflow 3 event source (``AssetWatcher``).

The watcher keeps its place in a Liftbridge cursor and fires one event per matching message, in
offset order. The cursor moves past a message only after the event made from it was handed over:

* On Airflow 3.3+ the triggerer runs the trigger in *ack mode* (``create_shared_stream_producer``):
  the cursor is written only once the triggerer has confirmed the event **stored in the metadata
  database**. The watcher hands over at most ``max_in_flight`` messages whose events are not
  confirmed yet (back-pressure: Airflow's fan-out queue fails a watcher that overfills it), and
  writes its cursor every ``commit_interval`` seconds or ``commit_every`` messages, whichever
  comes first.
* Where the triggerer drives :meth:`LiftbridgeEventTrigger.run` (older triggerers, or a caller of
  its own), the cursor for message N is written when the generator is resumed after yielding N,
  i.e. once the consumer has taken the event, before N+1 is looked for.

A cursor belongs to one incarnation of the stream (its creation timestamp is part of the cursor id),
so a stream deleted and re-created under the same name is read from its start, not from the old
incarnation's offset. See ``docs/event-driven.md`` for what is and is not guaranteed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

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
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import TRIGGERER_CLIENT_OPTIONS, LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import check_partition, check_stream, parse_start_at

from .base import LiftbridgeBaseTrigger, closing_subscription
from .message import apply_to_message, group_auto_offset, match_event, resolve_apply_function

try:  # Airflow 3.3+: persistence-gated cursor advance (ack mode of shared streams)
    from airflow.triggers.shared_stream import AdvanceItem, SharedStreamProducer, reject_shared_stream_event

    HAS_ACK_MODE = True
except ImportError:  # pragma: no cover - older Airflow 3: run() is the only path
    HAS_ACK_MODE = False
    SharedStreamProducer = object  # type: ignore[assignment,misc]
    AdvanceItem = Any  # type: ignore[assignment,misc]

    def reject_shared_stream_event() -> None:
        pass


__all__ = [
    "Delivery",
    "LiftbridgeEventTrigger",
    "LiftbridgeWatcherError",
    "default_cursor_id",
    "incarnation_cursor_id",
    "started_cursor_id",
]

log = logging.getLogger(__name__)

DEFAULT_POLL_INTERVAL = 5.0
#: Ack mode: messages handed to the triggerer whose events are not confirmed stored yet, at most.
#: Airflow's shared-stream fan-out puts every message the producer yields into a bounded queue per
#: subscriber ([triggerer] shared_stream_subscriber_queue_size, 1,024 by default) and fails the
#: watcher when it is full; the window keeps it from filling (it is also capped at that size).
#: It also bounds how many messages can fire again after the triggerer is killed.
DEFAULT_MAX_IN_FLIGHT = 256
#: Ack mode: the cursor is written this many seconds after the first confirmed message not yet
#: covered by it, at the latest...
DEFAULT_COMMIT_INTERVAL = 0.5
#: ...or as soon as this many confirmed messages are not covered by it. On the run() path,
#: filtered-out messages are committed in batches of this many (re-reading a few non-matching
#: messages after a restart is harmless; one SetCursor per message is not free).
DEFAULT_COMMIT_EVERY = 100
#: Conditions a long-lived watcher waits out (polling) instead of failing.
_WAITABLE = (NoSuchStreamError, NoSuchPartitionError, PartitionPausedError, NotLeaderError, UnavailableError)


class LiftbridgeWatcherError(LiftbridgeAirflowError):
    """The watcher cannot go on without skipping or repeating messages (the message says why)."""


def incarnation_cursor_id(cursor_id: str, creation_timestamp: int) -> str:
    """The Liftbridge cursor id a watcher uses for one incarnation of its stream.

    :param cursor_id: the watcher's cursor id.
    :param creation_timestamp: the stream's creation timestamp (``StreamInfo.creation_timestamp``).
    """
    return f"{cursor_id}@{creation_timestamp}"


def started_cursor_id(cursor_key: str) -> str:
    """The mark a watcher sets when it begins reading an incarnation from its first offset."""
    return f"{cursor_key}#started"


def default_cursor_id(
    stream: str,
    partition: int,
    apply_function: str | None,
    apply_function_args: Sequence[Any],
    apply_function_kwargs: Mapping[str, Any],
) -> str:
    """The cursor id of a watcher that was given none: derived from what it watches and how it
    filters, so identical watchers (which Airflow runs as one trigger) share it, and it is the
    same in every process."""
    identity = [stream, partition, apply_function, list(apply_function_args), dict(apply_function_kwargs)]
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=repr).encode()).hexdigest()
    return f"airflow-watcher-{digest[:16]}"


def _parse_watch_start(value: Any) -> StartPosition | int | dt.datetime:
    position = parse_start_at(value)
    if position is StartPosition.LATEST:
        raise LiftbridgeArgumentError(
            f"start_at {value!r} cannot start a watcher: use 'earliest', 'new_only', an offset or an ISO 8601 "
            "timestamp ('latest' would re-read the newest message after every restart before the first event)"
        )
    return position


def _positive(name: str, value: Any, what: str, kind: type[int] | type[float]) -> Any:
    """``value`` as ``kind`` if it is a positive number (a whole one for ``int``).

    :raises LiftbridgeArgumentError: it is not.
    """
    number_types: tuple[type, ...] = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_types) or value <= 0:
        raise LiftbridgeArgumentError(f"{name} must be {what}, got {value!r}")
    return kind(value)


class Delivery(NamedTuple):
    """A message read by a watcher, with the cursor id of the stream incarnation it belongs to."""

    cursor_key: str
    message: Message


class _PartitionReader:
    """Reads one partition from the watcher's place on, waits out a missing, paused or read-only
    partition, and writes the watcher's cursor. Shared by the run() path and the ack-mode producer;
    only who calls :meth:`commit`, and when, differs."""

    def __init__(self, trigger: LiftbridgeEventTrigger) -> None:
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
            start = _parse_watch_start(t.start_at)
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
            except _WAITABLE as exc:
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


def subscriber_queue_size() -> int:
    """``[triggerer] shared_stream_subscriber_queue_size`` of this process (0 or less: unbounded)."""
    from airflow.configuration import conf

    return conf.getint("triggerer", "shared_stream_subscriber_queue_size", fallback=1024)


def effective_window(max_in_flight: int, queue_size: int) -> int:
    """How many unconfirmed messages the producer may hand over: ``max_in_flight``, capped at the
    fan-out queue's size (a subscriber's queue never holds more than the producer has handed over
    and not seen advanced, so it can then never overflow)."""
    return max_in_flight if queue_size <= 0 else min(max_in_flight, queue_size)


def make_reader(trigger: LiftbridgeEventTrigger) -> _PartitionReader:
    """The reader of a watcher: its one partition, or (``consumer_group``) what its group assigns it."""
    if trigger.consumer_group:
        from .event_group import GroupReader

        return GroupReader(trigger)  # type: ignore[return-value]  # the same interface
    return _PartitionReader(trigger)


def _open_window() -> Any:
    """The binding window Airflow has open for the message the filter is on (``None`` when it
    cannot be seen: no ack mode, or another Airflow version)."""
    try:
        from airflow.triggers.shared_stream import _reject_context
    except ImportError:  # pragma: no cover - older Airflow
        return None
    return _reject_context.get()


def _event_was_gated(window: Any) -> bool:
    """Whether the event the filter just yielded is tracked until it is stored.

    The trigger runner binds each event to the message's window right after taking it; the
    message then counts as done only once the event is confirmed stored. Airflow 3.3.2's
    ``SharedStreamManager.stop_all`` (a triggerer's graceful stop) forgets the groups *before*
    stopping them, and the watcher's task goes on taking queued messages meanwhile: binding then
    finds no group and gates nothing, the window closes, Airflow counts the message acked, and its
    event, still in the exiting runner's outbox, is never stored. Then the binding holds no
    sequence number to wait for and its group is no longer the manager's: that is what this
    detects (the runner binds with no ``await`` between binding and asking for the next message,
    so the manager's state then is the state the binding saw). Reads Airflow internals; when they
    are not as expected it trusts Airflow (returns ``True``)."""
    try:
        group = window.group
        entry = group._outstanding.get(window.event_id)
        binding = None if entry is None else entry.bindings.get(window.trigger_id)
        if binding is None or binding.unconfirmed_seqs:
            return True
        manager = getattr(group._on_poll_terminate, "__self__", None)
        return manager is None or manager._groups.get(group.key) is group
    except AttributeError:  # pragma: no cover - another Airflow
        return True


class _CursorCommitter:
    """Writes the watcher's cursor ``interval`` seconds after the first confirmed message it does
    not cover yet, or as soon as ``every`` confirmed messages are not covered, whichever comes
    first. Writes are serialized and never move the cursor back."""

    def __init__(self, reader: _PartitionReader, every: int, interval: float) -> None:
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


class _CursorProducer(SharedStreamProducer):  # type: ignore[misc,valid-type]
    """Ack mode: the triggerer hands back, in order, the messages whose events are stored (or that
    the filter passed over); the cursor moves to the last one. Anything else stops the watcher,
    which then restarts from the cursor: nothing is skipped.

    Back-pressure: Airflow's fan-out does not wait for anything before pulling the next message
    from :meth:`open_stream`; it puts each one in every subscriber's bounded queue and fails a
    subscriber whose queue is full, which fails every event it has not resolved, stored ones
    included (they would fire again after the restart). So :meth:`open_stream` hands over at most
    ``window`` messages that :meth:`advance` has not seen back yet."""

    def __init__(self, trigger: LiftbridgeEventTrigger, window: int) -> None:
        self._reader = make_reader(trigger)
        self._committer = _CursorCommitter(self._reader, trigger.commit_every, trigger.commit_interval)
        self.window = window
        self.in_flight = 0
        self._room = asyncio.Event()

    async def open_stream(self) -> AsyncIterator[tuple[Delivery, tuple[str, int]]]:
        async for delivery in self._reader.deliveries():
            while self.in_flight >= self.window:
                self._room.clear()
                await self._room.wait()
            self.in_flight += 1
            yield delivery, (delivery.cursor_key, delivery.message.offset)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        self.in_flight -= len(batch)
        self._room.set()
        for item in batch:
            if not item.outcome.is_clean:
                await self._committer.flush()
                key, offset = item.broker_payload
                raise LiftbridgeWatcherError(
                    f"the event of offset {offset} was not confirmed stored ({item.outcome}); the watcher stops "
                    "and restarts from its cursor, so that message is read again"
                )
            await self._committer.done(*item.broker_payload)

    async def aclose(self) -> None:
        try:
            await self._committer.aclose()
        finally:
            await self._reader.close()


class LiftbridgeEventTrigger(LiftbridgeBaseTrigger, BaseEventTrigger):
    """Watch a stream partition and fire one event per message that ``apply_function`` accepts
    (every message when there is none), in offset order, for as long as it runs. Made for
    ``AssetWatcher``: each event is an asset event, so a DAG scheduled on the asset runs once per
    matching message. Needs cursors enabled on the cluster (a stock Liftbridge has them off): the
    watcher otherwise stops at once with ``CursorsDisabledError`` naming the server setting.

    Event payload: ``{"status": "success", "message": {...}, "match": ..., "cursor_id": ...}``;
    ``message`` is JSON-safe (bytes as base64, ``value_text`` when UTF-8), ``match`` is what the
    function returned unless ``True``, ``cursor_id`` the Liftbridge cursor the watcher keeps.

    :param stream: the stream.
    :param partition: the partition.
    :param apply_function: dotted path of ``f(message, *args, **kwargs)`` returning something
        truthy for messages that should fire; runs in the triggerer's event loop, so it must be
        quick (it may be ``async``). ``None``: every message fires. If it raises, the watcher stops
        without moving its cursor past that message.
    :param apply_function_args: / :param apply_function_kwargs: extra arguments of the function.
    :param cursor_id: the Liftbridge cursor holding the watcher's place; by default derived from
        the stream, partition and filter. Set it to keep the place when the filter changes.
    :param start_at: where a watcher without a place starts: ``"new_only"`` (default; messages
        after the newest one when the watcher first starts), ``"earliest"``, an offset or an ISO
        8601 timestamp. Ignored once the cursor is set.
    :param brokers: ``"host:port[,host:port]"`` to connect to directly (plain gRPC, default
        client settings) instead of through the connection.
    :param poll_interval: seconds between checks while the stream is missing, paused or read-only.
    :param liftbridge_conn_id: the connection to use when ``brokers`` is not given.
    :param max_in_flight: ack mode: at most this many messages are handed to the triggerer before
        their events are confirmed stored (capped at ``[triggerer]
        shared_stream_subscriber_queue_size``). Also the bound on how many messages fire again
        after the triggerer is killed.
    :param commit_interval: / :param commit_every: ack mode: the cursor is written at most this
        many seconds after a message is confirmed, or once this many confirmed messages are not
        covered by it, whichever comes first (``commit_every`` also batches the cursor writes for
        filtered-out messages on the run() path).
    :param consumer_group: watch as a member of this Liftbridge consumer group: the whole stream,
        its partitions shared with the group's other members (other watchers, DAGs, triggerers), each
        message firing in one member only. Positions are the group's cursors; ``partition`` and
        ``cursor_id`` do not apply, ``start_at`` (``"new_only"``, ``"earliest"``) is where partitions
        without a group position start. A rebalance can fire a message whose position was not yet
        written once more (at-least-once, as without a group).
    :param consumer_id: this watcher's member id (default: a new one per trigger run).
    :raises LiftbridgeArgumentError: an argument is invalid (checked here, so a DAG with a bad
        watcher fails to parse).
    """

    def __init__(
        self,
        *,
        stream: str,
        partition: int = 0,
        apply_function: str | None = None,
        apply_function_args: Sequence[Any] | None = None,
        apply_function_kwargs: Mapping[str, Any] | None = None,
        cursor_id: str | None = None,
        start_at: int | str = "new_only",
        brokers: str | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        liftbridge_conn_id: str = DEFAULT_CONN_ID,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        commit_interval: float = DEFAULT_COMMIT_INTERVAL,
        commit_every: int = DEFAULT_COMMIT_EVERY,
        consumer_group: str | None = None,
        consumer_id: str | None = None,
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        self.consumer_group = consumer_group or None
        self.consumer_id = consumer_id or None
        if self.consumer_group:
            if cursor_id is not None:
                raise LiftbridgeArgumentError("cursor_id and consumer_group exclude each other: a group keeps its own")
            group_auto_offset(start_at)
        self.stream = check_stream(stream)
        self.partition = check_partition(partition)
        self.apply_function = apply_function
        self._function: Callable[..., Any] | None = (
            None if apply_function is None else resolve_apply_function(apply_function)
        )
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        if cursor_id is not None and (not isinstance(cursor_id, str) or not cursor_id.strip()):
            raise LiftbridgeArgumentError(f"cursor_id must be a non-empty string or None, got {cursor_id!r}")
        self._cursor_id_arg = cursor_id
        self.cursor_id = cursor_id or default_cursor_id(
            stream, self.partition, apply_function, self.apply_function_args, self.apply_function_kwargs
        )
        _parse_watch_start(start_at)  # validate; kept as given so serialize() returns it unchanged
        self.start_at = start_at
        if brokers is not None and (not isinstance(brokers, str) or not brokers.strip()):
            raise LiftbridgeArgumentError(f"brokers must be 'host:port[,host:port]' or None, got {brokers!r}")
        self.brokers = brokers
        self.poll_interval = _positive("poll_interval", poll_interval, "a positive number of seconds", float)
        self.commit_interval = _positive("commit_interval", commit_interval, "a positive number of seconds", float)
        self.max_in_flight = _positive("max_in_flight", max_in_flight, "a positive whole number", int)
        self.commit_every = _positive("commit_every", commit_every, "a positive whole number", int)

    def serialize_args(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "partition": self.partition,
            "apply_function": self.apply_function,
            "apply_function_args": self.apply_function_args,
            "apply_function_kwargs": self.apply_function_kwargs,
            "cursor_id": self._cursor_id_arg,
            "start_at": self.start_at,
            "brokers": self.brokers,
            "poll_interval": self.poll_interval,
            "liftbridge_conn_id": self.liftbridge_conn_id,
            "max_in_flight": self.max_in_flight,
            "commit_interval": self.commit_interval,
            "commit_every": self.commit_every,
        } | ({"consumer_group": self.consumer_group, "consumer_id": self.consumer_id} if self.consumer_group else {})

    async def event_payload(self, delivery: Delivery) -> dict[str, Any] | None:
        """The event payload for a message, or ``None`` when the filter passes it over.

        :raises LiftbridgeAirflowError: the apply function raised.
        """
        message = delivery.message
        if self._function is None:
            result: Any = True
        else:
            result = apply_to_message(
                self._function, str(self.apply_function), message, self.apply_function_args, self.apply_function_kwargs
            )
            if inspect.isawaitable(result):
                result = await result
        if not result:
            return None
        cursor_id = delivery.cursor_key
        if self.consumer_group:
            from .event_group import split_delivery_key

            cursor_id = split_delivery_key(cursor_id)[0]
        return {"status": "success", **match_event(message, result), "cursor_id": cursor_id}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event per matching message, forever. The cursor for message N is written when
        the generator is resumed after yielding N's event (the consumer has taken it)."""
        reader = make_reader(self)
        skipped = 0
        try:
            async with closing_subscription(reader.deliveries()) as deliveries:
                async for delivery in deliveries:
                    payload = await self.event_payload(delivery)
                    if payload is None:
                        skipped += 1
                        if skipped >= self.commit_every:
                            await reader.commit(delivery.cursor_key, delivery.message.offset)
                            skipped = 0
                        continue
                    yield TriggerEvent(payload)
                    await reader.commit(delivery.cursor_key, delivery.message.offset)
                    skipped = 0
        except LiftbridgeError as exc:
            raise LiftbridgeWatcherError(
                f"watcher of stream {self.stream!r} partition {self.partition}: {exc}"
            ) from exc
        finally:
            await reader.close()

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        """Not used: an event trigger yields many events (see :meth:`run`)."""
        raise NotImplementedError("LiftbridgeEventTrigger fires from run(), not wait()")

    # -- ack mode (Airflow 3.3+): the triggerer moves the cursor once the event is stored --------------

    def shared_stream_key(self) -> Hashable | None:
        """Identical watchers share one subscription; the cursor moves when all have stored their
        events. ``None`` (run() path) where this Airflow has no ack mode."""
        if not HAS_ACK_MODE:
            return None
        return (
            "liftbridge-event",
            self.brokers or self.liftbridge_conn_id,
            self.stream,
            self.partition,
            self.cursor_id,
            json.dumps(self.start_at),
        ) + ((self.consumer_group, self.consumer_id) if self.consumer_group else ())

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> SharedStreamProducer:
        """The ack-mode producer: reads the partition, hands over at most ``max_in_flight``
        unconfirmed messages (capped at the fan-out queue size), writes the cursor."""
        trigger = cls(**kwargs)
        queue_size = subscriber_queue_size()
        window = effective_window(trigger.max_in_flight, queue_size)
        if window < trigger.max_in_flight:
            log.info(
                "watcher of %s/%d: max_in_flight %d capped at [triggerer] shared_stream_subscriber_queue_size %d",
                trigger.stream,
                trigger.partition,
                trigger.max_in_flight,
                queue_size,
            )
        return _CursorProducer(trigger, window)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """Turn the shared stream of deliveries into this watcher's events.

        An event Airflow took but could not gate on its storing is rejected, so the cursor stays
        before its message (see :func:`_event_was_gated`)."""
        async for delivery in shared_stream:
            payload = await self.event_payload(delivery)
            if payload is None:
                continue
            window = _open_window()
            yield TriggerEvent(payload)
            if window is not None and not _event_was_gated(window):
                log.warning(
                    "watcher of %s/%d: the triggerer is stopping and did not track the event of offset %d; "
                    "the cursor stays before it, so it is read again on the next start",
                    self.stream,
                    self.partition,
                    delivery.message.offset,
                )
                reject_shared_stream_event()
