"""A member stays in its group while its caller works, and leaves when the caller never comes back
(client/liveness.py, docs/consumer-groups.md "What keeps a member alive").

The server here times a member out after 3 s without a heartbeat, and a batch takes 4 s: a member
that heartbeats only when polled would lose its partitions in every batch. The keeper heartbeats
every second, so a member survives two seconds of its process not running (a loaded machine).
What the tests look at are the server's own words (its log: a member "timed out of" or "left" a
group) and who read what, not a window between two timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from airflow_provider_liftbridge.client import (
    AsyncLiftbridgeClient,
    GroupConsumer,
    LiftbridgeClient,
    MaxPollIntervalExceededError,
    Record,
)
from airflow_provider_liftbridge.client.consumer import group_cursor_id
from airflow_provider_liftbridge.devserver import DevServer
from tests import margins

#: Seconds without a heartbeat after which the server removes a member.
MEMBER_TIMEOUT = 3.0
#: The handling of one batch: longer than the member timeout.
SLOW_BATCH = 4.0
GROUPS_LOG = "airflow_provider_liftbridge.devserver.groups"


@pytest.fixture
def groups_server() -> Iterator[DevServer]:
    """A one-broker dev server whose member timeout is :data:`MEMBER_TIMEOUT`."""
    with DevServer(brokers=1, groups_consumer_timeout=MEMBER_TIMEOUT, groups_coordinator_timeout=MEMBER_TIMEOUT) as s:
        yield s


@pytest.fixture
def client(groups_server: DevServer) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(groups_server.address, timeout=5.0) as c:
        yield c


@pytest.fixture
def group_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The dev server's consumer-group log (joins, leaves, time-outs), as it happens."""
    caplog.set_level(logging.INFO, logger=GROUPS_LOG)
    return caplog


def _said(log: pytest.LogCaptureFixture, group: str, words: str) -> list[str]:
    """What the server logged about ``group`` with ``words`` in it (e.g. "b-other timed out of")."""
    return [
        m for r in log.records if r.name == GROUPS_LOG and words in (m := r.getMessage()) and m.endswith(f" {group}")
    ]


def _wait_until(check: Callable[[], object], timeout: float = 20.0) -> None:
    margins.wait_until(check, timeout, "condition", interval=0.05)


def _publish(client: LiftbridgeClient, stream: str, partition: int, n: int, start: int = 0) -> None:
    client.publish_many(stream, [Record(b"%d" % i, partition=partition) for i in range(start, start + n)])


def _read_on(consumer: GroupConsumer, seen: list[tuple[int, int]], stop: threading.Event) -> threading.Thread:
    """Read ``consumer``'s messages into ``seen`` on a thread until ``stop``."""

    def read() -> None:
        while not stop.is_set():
            seen.extend((m.partition, m.offset) for m in consumer.messages(timeout=0.2))

    reader = threading.Thread(target=read, name=f"reader-{consumer.consumer_id}")
    reader.start()
    return reader


def test_a_batch_slower_than_the_member_timeout_keeps_its_partitions(
    client: LiftbridgeClient, stream_name: str, group_log: pytest.LogCaptureFixture
) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    for p in (0, 1):
        _publish(client, stream_name, p, 4)
    slow = client.group_consumer(group, stream_name, consumer_id="a-slow", auto_offset="earliest")
    other = client.group_consumer(group, stream_name, consumer_id="b-other", auto_offset="earliest")
    slow.join()
    other.join()
    _wait_until(lambda: slow.check_assignments() == {stream_name: [0]})
    seen_slow: list[tuple[int, int]] = []
    seen_other: list[tuple[int, int]] = []
    stop = threading.Event()
    reader = _read_on(other, seen_other, stop)
    try:
        for _ in range(2):  # two batches of two, each handled for SLOW_BATCH seconds
            batch = [(m.partition, m.offset) for m in slow.messages(max_messages=2, timeout=20)]
            time.sleep(SLOW_BATCH)  # the batch function: the caller is away, its keeper heartbeats
            seen_slow.extend(batch)
            slow.commit()
        _wait_until(lambda: (1, 3) in seen_other)
    finally:
        stop.set()
        reader.join(10)
    assert _said(group_log, group, "timed out of") == []  # the coordinator never lost the slow member
    assert slow.check_assignments() == {stream_name: [0]} and other.assignments == {stream_name: [1]}
    assert seen_slow == [(0, o) for o in range(4)]
    assert sorted(seen_other) == [(1, o) for o in range(4)]  # nothing of partition 0 read twice
    assert client.fetch_cursor(group_cursor_id(group), stream_name, 0) == 3
    slow.leave()
    other.leave()


def test_a_stuck_caller_leaves_after_max_poll_interval_and_the_other_member_takes_over(
    client: LiftbridgeClient, stream_name: str, group_log: pytest.LogCaptureFixture
) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _publish(client, stream_name, 0, 3)
    stuck = client.group_consumer(
        group,
        stream_name,
        consumer_id="a-stuck",
        auto_offset="earliest",
        auto_commit_interval=None,
        max_poll_interval=MEMBER_TIMEOUT + 1.5,
    )
    other = client.group_consumer(group, stream_name, consumer_id="b-other", auto_offset="earliest")
    stuck.join()
    other.join()
    _wait_until(lambda: stuck.check_assignments() == {stream_name: [0]})
    messages = stuck.messages(timeout=20)
    assert next(messages).offset == 0
    stuck.commit()  # offset 0 is done
    assert next(messages).offset == 1  # ... and the caller never comes back from offset 1
    # Its keeper heartbeats for longer than the member timeout, then leaves: a clean leave, which
    # moves partition 0 to the other member at once. That lasts until the stuck caller comes back.
    _wait_until(lambda: _said(group_log, group, "a-stuck left group"))
    assert _said(group_log, group, "timed out of") == []
    _wait_until(lambda: other.check_assignments() == {stream_name: [0, 1]})
    got = [(m.partition, m.offset) for m in other.messages(max_messages=2, timeout=20)]
    assert got == [(0, 1), (0, 2)]  # from the committed position: offset 1 was not done
    with pytest.raises(MaxPollIntervalExceededError, match="max_poll_interval"):
        stuck.commit()  # nothing stored: partition 0 is the other member's now
    assert client.fetch_cursor(group_cursor_id(group), stream_name, 0) == 0
    messages.close()
    stuck.leave()  # already out: nothing to do
    other.leave()


def test_an_async_member_stays_in_while_its_caller_awaits_a_slow_batch(
    groups_server: DevServer, client: LiftbridgeClient, stream_name: str, group_log: pytest.LogCaptureFixture
) -> None:
    client.create_stream(stream_name, stream_name)
    _publish(client, stream_name, 0, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"

    async def run() -> tuple[list[int], int]:
        async with AsyncLiftbridgeClient(groups_server.address, timeout=5.0) as aclient:
            async with aclient.group_consumer(group, stream_name, auto_offset="earliest") as consumer:
                epoch = consumer.member.epoch
                got = [m.offset async for m in consumer.messages(max_messages=1, timeout=20)]
                await asyncio.sleep(SLOW_BATCH)  # the batch: the keeper task heartbeats meanwhile
                got += [m.offset async for m in consumer.messages(max_messages=1, timeout=20)]
                await consumer.commit()
                return got, consumer.member.epoch - epoch

    got, epochs = asyncio.run(run())
    assert got == [0, 1] and epochs == 0  # no rebalance: the member never left
    assert _said(group_log, group, "timed out of") == []
    assert client.fetch_cursor(group_cursor_id(group), stream_name, 0) == 1


def test_an_async_caller_back_after_max_poll_interval_commits_nothing_even_if_its_keeper_never_ran(
    groups_server: DevServer, client: LiftbridgeClient, stream_name: str, group_log: pytest.LogCaptureFixture
) -> None:
    """The batch blocks the event loop (a blocking call in a coroutine), so the keeper task cannot
    run, leave or heartbeat: the server times the member out (the timeout that must happen: nothing
    else is in the group meanwhile, the other member joins only after it). The other member reads
    on from the committed position and commits; the caller comes back after max_poll_interval and
    its commit stores nothing (before the fix it moved the group's position back to its own)."""
    client.create_stream(stream_name, stream_name)
    _publish(client, stream_name, 0, 3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    taken_over: list[tuple[int, int]] = []

    def other_member_takes_over() -> None:
        _wait_until(lambda: _said(group_log, group, "a-stuck timed out of"))
        with client.group_consumer(group, stream_name, consumer_id="b-other", auto_offset="earliest") as other:
            taken_over.extend((m.partition, m.offset) for m in other.messages(max_messages=2, timeout=20))
            other.commit()

    async def run() -> None:
        async with AsyncLiftbridgeClient(groups_server.address, timeout=5.0) as aclient:
            stuck = aclient.group_consumer(
                group,
                stream_name,
                consumer_id="a-stuck",
                auto_offset="earliest",
                auto_commit_interval=None,
                max_poll_interval=1.0,
            )
            await stuck.join()
            messages = stuck.messages(timeout=20)
            assert (await anext(messages)).offset == 0
            await stuck.commit()  # offset 0 is done
            assert (await anext(messages)).offset == 1  # offset 1 in the caller's hands ...
            other_member_takes_over()  # ... while it blocks the loop: no keeper runs
            with pytest.raises(MaxPollIntervalExceededError, match="max_poll_interval=1.0 s"):
                await stuck.commit()
            await messages.aclose()
            await stuck.leave()  # already out: nothing to do

    asyncio.run(run())
    assert taken_over == [(0, 1), (0, 2)]  # from the committed position: offset 1 was not done
    assert client.fetch_cursor(group_cursor_id(group), stream_name, 0) == 2  # the other member's, not moved back
    assert _said(group_log, group, "a-stuck left group") == []  # the server had timed it out already
