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
import hashlib
import inspect
import json
import logging
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_liftbridge.callables import TRIGGERER
from airflow_provider_liftbridge.client import LiftbridgeError
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import check_function_path, check_partition, check_stream, import_function

from .base import LiftbridgeBaseTrigger, closing_subscription
from .event_group import GroupReader, split_delivery_key
from .event_reader import (
    CursorCommitter,
    Delivery,
    PartitionReader,
    Reader,
    incarnation_cursor_id,
    parse_watch_start,
    started_cursor_id,
)
from .message import apply_to_message, group_auto_offset, match_event

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

#: Logged by watchers on an Airflow without the shared stream's ack mode (before 3.3).
NO_ACK_MODE = (
    "this Airflow (before 3.3) has no ack mode for shared streams (airflow.triggers.shared_stream): "
    "the watcher's cursor moves once the triggerer has taken an event, not once it is stored, and a "
    "burst is not held back by max_in_flight; upgrade to Airflow 3.3+ for both"
)

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


class LiftbridgeWatcherError(LiftbridgeAirflowError):
    """The watcher cannot go on without skipping or repeating messages (the message says why)."""


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


def _positive(name: str, value: Any, what: str, kind: type[int] | type[float]) -> Any:
    """``value`` as ``kind`` if it is a positive number (a whole one for ``int``).

    :raises LiftbridgeArgumentError: it is not.
    """
    number_types: tuple[type, ...] = (int,) if kind is int else (int, float)
    if isinstance(value, bool) or not isinstance(value, number_types) or value <= 0:
        raise LiftbridgeArgumentError(f"{name} must be {what}, got {value!r}")
    return kind(value)


def subscriber_queue_size() -> int:
    """``[triggerer] shared_stream_subscriber_queue_size`` of this process (0 or less: unbounded)."""
    from airflow.configuration import conf

    return conf.getint("triggerer", "shared_stream_subscriber_queue_size", fallback=1024)


def effective_window(max_in_flight: int, queue_size: int) -> int:
    """How many unconfirmed messages the producer may hand over: ``max_in_flight``, capped at the
    fan-out queue's size (a subscriber's queue never holds more than the producer has handed over
    and not seen advanced, so it can then never overflow)."""
    return max_in_flight if queue_size <= 0 else min(max_in_flight, queue_size)


def make_reader(trigger: LiftbridgeEventTrigger) -> Reader:
    """The reader of a watcher: its one partition, or (``consumer_group``) what its group assigns it."""
    if trigger.consumer_group:
        return GroupReader(trigger)
    return PartitionReader(trigger)


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
        self._committer = CursorCommitter(self._reader, trigger.commit_every, trigger.commit_interval)
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
        without moving its cursor past that message. Its shape is checked here (so when the DAG is
        parsed); it is imported in the triggerer when the watcher starts, before anything is read.
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
        watcher fails to parse); from :meth:`run`: ``apply_function`` cannot be imported in the
        triggerer (the message names the path, the cause and where it must be importable).
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
        if apply_function is not None:
            check_function_path(apply_function, "apply_function")
        self.apply_function = apply_function
        self._function: Callable[..., Any] | None = None  # imported where the watcher runs
        self.apply_function_args = list(apply_function_args or [])
        self.apply_function_kwargs = dict(apply_function_kwargs or {})
        if cursor_id is not None and (not isinstance(cursor_id, str) or not cursor_id.strip()):
            raise LiftbridgeArgumentError(f"cursor_id must be a non-empty string or None, got {cursor_id!r}")
        self._cursor_id_arg = cursor_id
        self.cursor_id = cursor_id or default_cursor_id(
            stream, self.partition, apply_function, self.apply_function_args, self.apply_function_kwargs
        )
        parse_watch_start(start_at)  # validate; kept as given so serialize() returns it unchanged
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

    def _import_function(self) -> Callable[..., Any] | None:
        """The apply function (``None``: every message fires), imported in this process (the
        triggerer) the first time.

        :raises LiftbridgeArgumentError: it cannot be imported (names the path and the cause).
        """
        if self._function is None and self.apply_function is not None:
            self._function = import_function(self.apply_function, "apply_function", TRIGGERER)
        return self._function

    async def event_payload(self, delivery: Delivery) -> dict[str, Any] | None:
        """The event payload for a message, or ``None`` when the filter passes it over.

        :raises LiftbridgeAirflowError: the apply function raised.
        :raises LiftbridgeArgumentError: the apply function cannot be imported.
        """
        message = delivery.message
        function = self._import_function()
        if function is None:
            result: Any = True
        else:
            result = apply_to_message(
                function, str(self.apply_function), message, self.apply_function_args, self.apply_function_kwargs
            )
            if inspect.isawaitable(result):
                result = await result
        if not result:
            return None
        cursor_id = delivery.cursor_key
        if self.consumer_group:
            cursor_id = split_delivery_key(cursor_id)[0]
        return {"status": "success", **match_event(message, result), "cursor_id": cursor_id}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event per matching message, forever. The cursor for message N is written when
        the generator is resumed after yielding N's event (the consumer has taken it)."""
        if not HAS_ACK_MODE:
            log.warning(NO_ACK_MODE)
        self._import_function()  # before reading: a module missing here reads nothing, moves no cursor
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
        self._import_function()  # before taking a message: a module missing here moves no cursor
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
