"""LiftbridgeEventTrigger against the dev server: one event per matching message, in order; the
cursor moves only once an event was handed over (run() path) or confirmed stored (ack mode, driven
through Airflow's own SharedStreamManager); restarts from serialize() carry on from the cursor."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from airflow_provider_liftbridge.client import LiftbridgeClient, Message
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.event import (
    HAS_ACK_MODE,
    NO_ACK_MODE,
    LiftbridgeEventTrigger,
    LiftbridgeWatcherError,
    default_cursor_id,
    effective_window,
    incarnation_cursor_id,
    started_cursor_id,
)
from tests import margins
from tests.airflow_conftest import needs_ack_mode

pytestmark = [pytest.mark.usefixtures("liftbridge_conn"), pytest.mark.timeout(60)]
HERE = "tests.triggers.test_event_trigger"
CLASSPATH = "airflow_provider_liftbridge.triggers.event.LiftbridgeEventTrigger"


def is_even(message: Message) -> bool:
    return int(message.value) % 2 == 0


async def async_tagged(message: Message, tag: str) -> str | None:
    await asyncio.sleep(0)
    return f"{tag}:{message.value.decode()}" if message.value.startswith(b"hit") else None


def explode(message: Message) -> bool:
    raise RuntimeError("bad filter")


class Events:
    """Reads a trigger's events the way the triggerer does, one ``__anext__`` at a time, without
    ever cancelling the generator (which would end it) when a test waits in vain."""

    def __init__(self, events: AsyncIterator[TriggerEvent]) -> None:
        self.events = events
        self.pending: asyncio.Future[TriggerEvent] | None = None

    def _read(self) -> asyncio.Future[TriggerEvent]:
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.events.__anext__())
        return self.pending

    async def next(self, timeout: float = 10) -> dict[str, Any]:
        pending = self._read()
        try:
            event = await asyncio.wait_for(asyncio.shield(pending), timeout)
        finally:
            if pending.done():
                self.pending = None
        return dict(event.payload)

    async def none_within(self, wait: float = 0.5) -> None:
        """Assert that nothing fires within ``wait`` seconds (the read stays pending)."""
        pending = self._read()
        await asyncio.sleep(wait)
        assert not pending.done(), f"unexpected: {pending.result() if not pending.exception() else pending}"

    async def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await self.pending
        await self.events.aclose()  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def reading(events: AsyncIterator[TriggerEvent]) -> AsyncIterator[Events]:
    reader = Events(events)
    try:
        yield reader
    finally:
        await reader.close()


def make_stream(client: LiftbridgeClient, name: str, values: list[bytes] = ()) -> None:  # type: ignore[assignment]
    client.create_stream(name, name)
    for value in values:
        client.publish(name, value)


def cursor_of(client: LiftbridgeClient, trigger: LiftbridgeEventTrigger) -> int:
    created = client.fetch_metadata([trigger.stream]).streams[trigger.stream].creation_timestamp
    return client.fetch_cursor(incarnation_cursor_id(trigger.cursor_id, created), trigger.stream, trigger.partition)


def restarted(trigger: LiftbridgeEventTrigger) -> LiftbridgeEventTrigger:
    """What the triggerer builds after a restart: the class from the classpath, the kwargs."""
    classpath, kwargs = trigger.serialize()
    assert classpath == CLASSPATH
    return LiftbridgeEventTrigger(**json.loads(json.dumps(kwargs)))


# -- construction -------------------------------------------------------------------------------


def test_serializes_exactly_and_round_trips() -> None:
    trigger = LiftbridgeEventTrigger(
        stream="s",
        partition=2,
        apply_function=f"{HERE}.async_tagged",
        apply_function_kwargs={"tag": "t"},
        cursor_id="mine",
        start_at=7,
        poll_interval=3,
    )
    assert isinstance(trigger, BaseEventTrigger)
    assert trigger.serialize() == (
        CLASSPATH,
        {
            "stream": "s",
            "partition": 2,
            "apply_function": f"{HERE}.async_tagged",
            "apply_function_args": [],
            "apply_function_kwargs": {"tag": "t"},
            "cursor_id": "mine",
            "start_at": 7,
            "brokers": None,
            "poll_interval": 3.0,
            "liftbridge_conn_id": "liftbridge_default",
            "max_in_flight": 256,
            "commit_interval": 0.5,
            "commit_every": 100,
        },
    )
    assert restarted(trigger).serialize() == trigger.serialize()


def test_default_cursor_id_is_stable_and_follows_the_filter() -> None:
    a = LiftbridgeEventTrigger(stream="s", apply_function=f"{HERE}.is_even")
    b = restarted(a)
    assert a.cursor_id == b.cursor_id == default_cursor_id("s", 0, f"{HERE}.is_even", [], {})
    assert a.cursor_id.startswith("airflow-watcher-")
    assert a.serialize()[1]["cursor_id"] is None  # derived again, identically, after a restart
    assert LiftbridgeEventTrigger(stream="s").cursor_id != a.cursor_id
    assert LiftbridgeEventTrigger(stream="s", partition=1, apply_function=f"{HERE}.is_even").cursor_id != a.cursor_id


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"stream": ""}, "stream='' is not valid"),
        ({"stream": "s", "partition": -1}, "partition=-1 is not valid"),
        ({"stream": "s", "apply_function": "nodots"}, "dotted path"),
        ({"stream": "s", "apply_function": print}, "apply_function=<built-in function print> is not valid"),
        ({"stream": "s", "start_at": "latest"}, "cannot start a watcher"),
        ({"stream": "s", "start_at": "someday"}, "start_at='someday' is not valid: a start position is an offset"),
        ({"stream": "s", "cursor_id": " "}, "cursor_id must be"),
        ({"stream": "s", "brokers": ""}, "brokers must be"),
        ({"stream": "s", "poll_interval": 0}, "poll_interval must be"),
        ({"stream": "s", "liftbridge_conn_id": ""}, "liftbridge_conn_id"),
        ({"stream": "s", "max_in_flight": 0}, "max_in_flight must be a positive whole number"),
        ({"stream": "s", "max_in_flight": 2.5}, "max_in_flight must be"),
        ({"stream": "s", "commit_every": True}, "commit_every must be"),
        ({"stream": "s", "commit_interval": -1}, "commit_interval must be a positive number"),
    ],
)
def test_bad_arguments_fail_in_the_constructor(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        LiftbridgeEventTrigger(**kwargs)


# -- run(): events, order, filter, cursor -------------------------------------------------------


async def test_one_event_per_matching_message_in_order(liftbridge_client: LiftbridgeClient, stream_name: str) -> None:
    make_stream(liftbridge_client, stream_name, [str(n).encode() for n in range(7)])
    trigger = LiftbridgeEventTrigger(stream=stream_name, apply_function=f"{HERE}.is_even", start_at="earliest")
    async with reading(trigger.run()) as events:
        got = [await events.next() for _ in range(4)]
        assert [e["message"]["offset"] for e in got] == [0, 2, 4, 6]
        assert [e["message"]["value_text"] for e in got] == ["0", "2", "4", "6"]
        assert {e["status"] for e in got} == {"success"}
        assert got[0]["match"] is None  # the filter returned True
        assert got[0]["message"]["stream"] == stream_name
        json.dumps(got)  # JSON-safe, as an asset event's extra must be
        await events.none_within()
        liftbridge_client.publish(stream_name, b"8")  # live messages too
        assert (await events.next())["message"]["offset"] == 7


@pytest.mark.skipif(HAS_ACK_MODE, reason="the message watchers log on Airflow before 3.3 (no ack mode)")
async def test_below_airflow_33_a_watcher_says_what_it_cannot_do(
    liftbridge_client: LiftbridgeClient, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    make_stream(liftbridge_client, stream_name, [b"1"])
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest")
    assert trigger.shared_stream_key() is None  # the triggerer drives run()
    with caplog.at_level("WARNING", logger="airflow_provider_liftbridge.triggers.event"):
        async with reading(trigger.run()) as events:
            assert (await events.next())["message"]["offset"] == 0
    assert NO_ACK_MODE in caplog.text and "upgrade to Airflow 3.3+" in NO_ACK_MODE


async def test_async_filter_result_travels_and_no_filter_fires_for_all(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    make_stream(liftbridge_client, stream_name, [b"miss", b"hit-1", b"miss", b"hit-2"])
    tagged = LiftbridgeEventTrigger(
        stream=stream_name,
        apply_function=f"{HERE}.async_tagged",
        apply_function_args=["x"],
        start_at="earliest",
    )
    async with reading(tagged.run()) as events:
        assert [(await events.next())["match"] for _ in range(2)] == ["x:hit-1", "x:hit-2"]
    async with reading(LiftbridgeEventTrigger(stream=stream_name, start_at="earliest").run()) as events:
        assert [(await events.next())["message"]["offset"] for _ in range(4)] == [0, 1, 2, 3]


async def test_cursor_moves_only_after_the_event_is_handed_over(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    make_stream(liftbridge_client, stream_name, [b"0", b"1", b"2"])
    trigger = LiftbridgeEventTrigger(stream=stream_name, apply_function=f"{HERE}.is_even", start_at="earliest")
    created = liftbridge_client.fetch_metadata([stream_name]).streams[stream_name].creation_timestamp
    async with reading(trigger.run()) as events:
        first = await events.next()
        assert first["message"]["offset"] == 0
        assert first["cursor_id"] == incarnation_cursor_id(trigger.cursor_id, created)
        # The event is with the consumer, the generator is suspended: the cursor has not moved.
        assert cursor_of(liftbridge_client, trigger) == -1
        second = await events.next()  # resuming hands offset 0 over, then finds offset 2
        assert second["message"]["offset"] == 2
        assert cursor_of(liftbridge_client, trigger) == 0
        liftbridge_client.publish(stream_name, b"4")
        assert (await events.next())["message"]["offset"] == 3
        assert cursor_of(liftbridge_client, trigger) == 2
    # Closing the generator is not a hand-over: offset 3 stays unacknowledged.
    assert cursor_of(liftbridge_client, trigger) == 2


async def test_restart_from_serialize_resumes_after_the_last_handed_over_event(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    make_stream(liftbridge_client, stream_name, [str(n).encode() for n in range(6)])
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest")
    async with reading(trigger.run()) as events:
        assert [(await events.next())["message"]["offset"] for _ in range(4)] == [0, 1, 2, 3]
    # The triggerer stopped while the event of offset 3 was in flight (not handed over).
    assert cursor_of(liftbridge_client, trigger) == 2

    async with reading(restarted(trigger).run()) as events:
        # At-least-once on this path: the in-flight event of offset 3 fires again; 0..2 do not.
        assert [(await events.next())["message"]["offset"] for _ in range(3)] == [3, 4, 5]
        await events.none_within()  # waiting for offset 6 began after handing 5 over
    assert cursor_of(liftbridge_client, trigger) == 5

    async with reading(restarted(trigger).run()) as events:
        await events.none_within()  # nothing left: no message starts a second run
        liftbridge_client.publish(stream_name, b"6")
        assert (await events.next())["message"]["offset"] == 6


async def test_new_only_pins_its_start_so_a_restart_skips_nothing(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    make_stream(liftbridge_client, stream_name, [b"old-0", b"old-1", b"old-2"])
    trigger = LiftbridgeEventTrigger(stream=stream_name)  # start_at="new_only"
    async with reading(trigger.run()) as events:
        await events.none_within()  # the old messages are not events...
        assert cursor_of(liftbridge_client, trigger) == 2  # ...and "new" is pinned at the first start
    liftbridge_client.publish(stream_name, b"new-3")  # published while no watcher runs
    async with reading(restarted(trigger).run()) as events:
        assert (await events.next())["message"]["value_text"] == "new-3"


async def test_empty_partition_start_survives_a_restart(liftbridge_client: LiftbridgeClient, stream_name: str) -> None:
    make_stream(liftbridge_client, stream_name)
    trigger = LiftbridgeEventTrigger(stream=stream_name)  # new_only on an empty partition: from offset 0
    async with reading(trigger.run()) as events:
        await events.none_within()
    liftbridge_client.publish(stream_name, b"first")
    async with reading(restarted(trigger).run()) as events:
        assert (await events.next())["message"]["offset"] == 0
    created = liftbridge_client.fetch_metadata([stream_name]).streams[stream_name].creation_timestamp
    started = started_cursor_id(incarnation_cursor_id(trigger.cursor_id, created))
    assert liftbridge_client.fetch_cursor(started, stream_name, 0) == 0


async def test_waits_for_a_missing_stream_and_reads_a_recreated_one_from_its_start(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest", poll_interval=0.1)
    async with reading(trigger.run()) as events:
        await events.none_within(0.4)  # no stream yet: the watcher polls, it does not fail
        make_stream(liftbridge_client, stream_name, [b"a0", b"a1"])
        assert [(await events.next())["message"]["value_text"] for _ in range(2)] == ["a0", "a1"]
        liftbridge_client.delete_stream(stream_name)
        await events.none_within(0.4)
        make_stream(liftbridge_client, stream_name, [b"b0"])
        # Offset 0 of the new stream is not mistaken for an old, already-handled offset.
        event = await events.next()
        assert (event["message"]["offset"], event["message"]["value_text"]) == (0, "b0")


async def test_brokers_argument_needs_no_connection(
    lb_address: str, liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    make_stream(liftbridge_client, stream_name, [b"x"])
    trigger = LiftbridgeEventTrigger(
        stream=stream_name, start_at="earliest", brokers=lb_address, liftbridge_conn_id="no_such_connection"
    )
    async with reading(trigger.run()) as events:
        assert (await events.next())["message"]["value_text"] == "x"


async def test_a_failing_filter_stops_the_watcher_before_its_message(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    make_stream(liftbridge_client, stream_name, [b"x"])
    trigger = LiftbridgeEventTrigger(stream=stream_name, apply_function=f"{HERE}.explode", start_at="earliest")
    async with reading(trigger.run()) as events:
        with pytest.raises(LiftbridgeAirflowError, match=r"explode.*offset 0.*bad filter"):
            await events.next()
    assert cursor_of(liftbridge_client, trigger) == -1


# -- ack mode: the cursor moves once the triggerer confirms the event stored ---------------------


@needs_ack_mode
async def test_ack_mode_moves_the_cursor_only_after_the_event_is_stored(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    """Driven the way the triggerer's runner drives it (SharedStreamManager, bind_pending_event
    right after each event); the supervisor's "stored in the metadata DB" is the confirm_persisted
    call, which is the one part played by the test."""
    from airflow.triggers.shared_stream import SharedStreamManager

    make_stream(liftbridge_client, stream_name, [b"1", b"2", b"3"])
    trigger = LiftbridgeEventTrigger(stream=stream_name, apply_function=f"{HERE}.is_even", start_at="earliest")
    key = trigger.shared_stream_key()
    assert key is not None and restarted(trigger).shared_stream_key() == key
    manager = SharedStreamManager(ack_timeout=30)
    try:
        async with reading(
            trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key))
        ) as events:
            assert (await events.next())["message"]["offset"] == 1
            seq = manager.bind_pending_event(trigger_id=1, key=key)
            assert seq is not None
            # Moving on hands offset 1 over; offset 2 is filtered out; nothing more matches yet.
            await events.none_within(0.5)
            # Offset 1 is handed over but not stored: the cursor covers only offset 0, which the
            # filter passed over (nothing to store for it), once the commit interval has passed.
            await wait_for_cursor(liftbridge_client, trigger, 0)
            await asyncio.sleep(0.6)
            assert cursor_of(liftbridge_client, trigger) == 0
            manager.confirm_persisted([seq])
            await wait_for_cursor(liftbridge_client, trigger, 2)  # 1 stored, 2 passed over
            liftbridge_client.publish(stream_name, b"4")
            assert (await events.next())["message"]["offset"] == 3
            seq = manager.bind_pending_event(trigger_id=1, key=key)
            await events.none_within(0.5)
            assert cursor_of(liftbridge_client, trigger) == 2
            manager.confirm_persisted([seq])
            await wait_for_cursor(liftbridge_client, trigger, 3)
    finally:
        await manager.stop_all()
    # A restart carries on after offset 3: no message starts a second run.
    liftbridge_client.publish(stream_name, b"6")
    async with reading(restarted(trigger).run()) as events:
        assert (await events.next())["message"]["offset"] == 4


@needs_ack_mode
async def test_ack_mode_does_not_move_past_an_event_that_was_never_stored(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    from airflow.triggers.shared_stream import AckTimeout, SharedStreamManager

    make_stream(liftbridge_client, stream_name, [b"0", b"2"])
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest")
    key = trigger.shared_stream_key()
    manager = SharedStreamManager(ack_timeout=0.5)
    try:
        async with reading(
            trigger.filter_shared_stream(manager.subscribe(trigger_id=7, trigger=trigger, key=key))
        ) as events:
            assert (await events.next())["message"]["offset"] == 0
            manager.bind_pending_event(trigger_id=7, key=key)  # never confirmed: the store "failed"
            with pytest.raises((AckTimeout, LiftbridgeWatcherError)):
                for _ in range(3):
                    await events.next(5)
    finally:
        await manager.stop_all()
    assert cursor_of(liftbridge_client, trigger) == -1
    async with reading(restarted(trigger).run()) as events:
        assert (await events.next())["message"]["offset"] == 0  # read again, not skipped


async def wait_for_cursor(client: LiftbridgeClient, trigger: LiftbridgeEventTrigger, offset: int) -> None:
    for _ in range(100):
        if cursor_of(client, trigger) == offset:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"cursor stayed at {cursor_of(client, trigger)}, expected {offset}")


# -- ack mode under bursts: back-pressure and the cursor's commit cadence ------------------------


class Runner:
    """Plays the triggerer around Airflow's own SharedStreamManager: takes each event, logs it and
    binds it, then asks for the next one with no await in between (as
    ``TriggerRunner.run_trigger`` does), and confirms the bound events stored in
    rounds, as the supervisor's state sync does. Counts the events handed over and not confirmed."""

    def __init__(self, manager: Any, trigger: LiftbridgeEventTrigger, round_seconds: float = 0.05) -> None:
        self.manager = manager
        self.trigger = trigger
        self.key = trigger.shared_stream_key()
        self.round_seconds = round_seconds
        self.events: list[dict[str, Any]] = []
        self.unconfirmed: list[int] = []
        self.most_unconfirmed = 0
        self.confirming = True
        self.offset_of: dict[int, int] = {}  # seq -> offset
        self.confirmed: set[int] = set()  # offsets whose events were confirmed stored
        self.unbound: list[int] = []  # offsets of events Airflow could not gate (nothing to confirm)
        self.expect_failure = False  # the watcher may stop with an error (it is then not raised)

    async def consume(self) -> None:
        stream = self.trigger.filter_shared_stream(
            self.manager.subscribe(trigger_id=1, trigger=self.trigger, key=self.key)
        )
        async for event in stream:
            await asyncio.sleep(0.001)  # the real runner logs every event it takes (an await, ~1 ms)
            seq = self.manager.bind_pending_event(trigger_id=1, key=self.key)
            self.events.append(dict(event.payload))
            if seq is None:  # the manager no longer knows the group (it is stopping)
                self.unbound.append(event.payload["message"]["offset"])
                continue
            self.offset_of[seq] = event.payload["message"]["offset"]
            self.unconfirmed.append(seq)
            self.most_unconfirmed = max(self.most_unconfirmed, len(self.unconfirmed))

    async def supervise(self) -> None:
        while True:
            await asyncio.sleep(self.round_seconds)
            if self.confirming:
                seqs, self.unconfirmed = self.unconfirmed, []
                self.confirmed.update(self.offset_of[seq] for seq in seqs)
                self.manager.confirm_persisted(seqs)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Runner]:
        tasks = [asyncio.ensure_future(self.consume()), asyncio.ensure_future(self.supervise())]
        try:
            yield self
        finally:
            for task in tasks:
                task.cancel()
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
            await self.manager.stop_all()
        error = outcomes[0]
        if isinstance(error, Exception) and not self.expect_failure:
            raise error

    async def wait_for(self, count: int, timeout: float = 60) -> None:
        where = margins.caller()
        await margins.until(lambda: len(self.events) >= count, timeout, f"{count} events", interval=0.05, where=where)


def test_window_is_capped_at_the_fan_out_queue() -> None:
    assert effective_window(256, 1024) == 256
    assert effective_window(256, 64) == 64
    assert effective_window(256, 0) == 256  # 0: Airflow's queue is unbounded


@needs_ack_mode
@pytest.mark.parametrize(("queue_size", "max_in_flight", "burst"), [(1024, 256, 3000), (64, 256, 2000), (16, 5, 600)])
async def test_a_burst_fires_every_matching_message_once_with_bounded_unconfirmed_events(
    liftbridge_client: LiftbridgeClient,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
    queue_size: int,
    max_in_flight: int,
    burst: int,
) -> None:
    """Before the window, a burst larger than the fan-out queue overflowed it: Airflow failed the
    watcher and every event not yet confirmed, stored ones included, fired again after the restart."""
    from airflow.triggers.shared_stream import SharedStreamManager

    monkeypatch.setenv("AIRFLOW__TRIGGERER__SHARED_STREAM_SUBSCRIBER_QUEUE_SIZE", str(queue_size))
    make_stream(liftbridge_client, stream_name)
    liftbridge_client.publish_many(stream_name, [str(n).encode() for n in range(burst)])
    trigger = LiftbridgeEventTrigger(
        stream=stream_name, apply_function=f"{HERE}.is_even", start_at="earliest", max_in_flight=max_in_flight
    )
    window = min(queue_size, max_in_flight)
    manager = SharedStreamManager(max_subscriber_queue=queue_size, ack_timeout=60)
    async with Runner(manager, trigger).running() as runner:
        await runner.wait_for(burst // 2, timeout=120)
        await wait_for_cursor(liftbridge_client, trigger, burst - 1)
        await asyncio.sleep(0.3)
    assert [e["message"]["offset"] for e in runner.events] == list(range(0, burst, 2))
    assert 0 < runner.most_unconfirmed <= window


@needs_ack_mode
async def test_cursor_is_written_on_a_message_count_or_an_interval_whichever_first(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    from airflow.triggers.shared_stream import SharedStreamManager

    make_stream(liftbridge_client, stream_name, [str(n).encode() for n in range(7)])
    # Count first: an interval this long never expires within the test.
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest", commit_every=5, commit_interval=3600)
    async with Runner(SharedStreamManager(ack_timeout=60), trigger).running() as runner:
        await runner.wait_for(7)
        # A message is done once its event is confirmed stored and the watcher asked for the next
        # one: the fifth done message writes the cursor.
        await wait_for_cursor(liftbridge_client, trigger, 4)
        await asyncio.sleep(0.5)
        assert cursor_of(liftbridge_client, trigger) == 4  # offsets 5 and 6 are done, not written yet
    # Stopping the watcher (the triggerer's graceful stop closes the producer) writes the rest.
    assert cursor_of(liftbridge_client, trigger) == 6

    # Interval first: one confirmed message is written within the interval.
    liftbridge_client.publish(stream_name, b"7")
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest", commit_every=1000, commit_interval=0.2)
    async with Runner(SharedStreamManager(ack_timeout=60), trigger).running() as runner:
        await runner.wait_for(1)
        await wait_for_cursor(liftbridge_client, trigger, 7)
    assert [e["message"]["offset"] for e in runner.events] == [7]


@needs_ack_mode
async def test_unconfirmed_events_hold_the_watcher_and_the_cursor(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    """With nothing confirmed, the watcher hands over ``max_in_flight`` messages and waits."""
    from airflow.triggers.shared_stream import SharedStreamManager

    make_stream(liftbridge_client, stream_name, [str(n).encode() for n in range(50)])
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest", max_in_flight=10)
    runner = Runner(SharedStreamManager(ack_timeout=60), trigger)
    runner.confirming = False
    async with runner.running():
        await runner.wait_for(10)
        await asyncio.sleep(0.5)
        assert len(runner.events) == 10
        assert cursor_of(liftbridge_client, trigger) == -1
        runner.confirming = True
        await runner.wait_for(50)
        await wait_for_cursor(liftbridge_client, trigger, 49)
    assert [e["message"]["offset"] for e in runner.events] == list(range(50))


@needs_ack_mode
async def test_a_stream_recreated_at_once_is_read_from_its_start(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    """Deleted and re-created with no pause in between (what the system tier does): the
    subscription must not carry over to the new stream at the old stream's next offset."""
    from airflow.triggers.shared_stream import SharedStreamManager

    make_stream(liftbridge_client, stream_name, [str(n).encode() for n in range(20)])
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest", poll_interval=0.2)
    async with Runner(SharedStreamManager(ack_timeout=60), trigger).running() as runner:
        await runner.wait_for(20)
        liftbridge_client.delete_stream(stream_name)
        make_stream(liftbridge_client, stream_name, [b"new-0", b"new-1"])
        await runner.wait_for(22, timeout=20)
    assert [e["message"]["value_text"] for e in runner.events[20:]] == ["new-0", "new-1"]


@needs_ack_mode
async def test_stopping_the_triggerer_mid_burst_never_moves_the_cursor_past_an_unstored_event(
    liftbridge_client: LiftbridgeClient, stream_name: str
) -> None:
    """Airflow 3.3.2's SharedStreamManager.stop_all (the triggerer's graceful stop) forgets the
    groups before stopping them, and meanwhile the watcher's task still takes messages from its
    queue: their events cannot be bound (nothing gates them, and the runner that is exiting never
    sends them), yet Airflow counts them acked. Found by the system tier (SIGTERM mid-burst lost
    two messages); the watcher must reject such an event so its cursor stays before it."""
    from airflow.triggers.shared_stream import SharedStreamManager

    make_stream(liftbridge_client, stream_name)
    liftbridge_client.publish_many(stream_name, [str(n).encode() for n in range(200)])
    trigger = LiftbridgeEventTrigger(stream=stream_name, start_at="earliest", max_in_flight=20, commit_every=1)
    manager = SharedStreamManager(ack_timeout=60)
    runner = Runner(manager, trigger)
    runner.confirming = False
    runner.expect_failure = True  # it stops on the rejected event, which is the point
    async with runner.running():
        await runner.wait_for(20)  # the window is full, nothing confirmed yet
        await asyncio.sleep(0.3)
        # The triggerer's last state sync confirms everything it stored, then it stops.
        seqs, runner.unconfirmed = runner.unconfirmed, []
        runner.confirmed.update(runner.offset_of[seq] for seq in seqs)
        manager.confirm_persisted(seqs)
        await manager.stop_all()  # meanwhile the watcher's task goes on taking messages
        await asyncio.sleep(0.5)
    cursor = cursor_of(liftbridge_client, trigger)
    assert runner.unbound, "the race did not happen: nothing was taken during stop_all"
    assert all(offset in runner.confirmed for offset in range(cursor + 1)), (
        f"cursor {cursor} passed unstored events {sorted(set(range(cursor + 1)) - runner.confirmed)[:5]}"
    )


# -- in a DAG --------------------------------------------------------------------------------


@pytest.mark.usefixtures("airflow_db")
def test_example_consumer_dag_parses_and_serializes_its_watcher() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    from tests.airflow_support import DAGS_FOLDER

    bag = DagBag(str(DAGS_FOLDER / "liftbridge_event_consumer.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("liftbridge_event_consumer")
    data = json.dumps(DagSerialization.to_dict(dag))
    assert CLASSPATH in data and "liftbridge_ready_orders_watcher" in data
