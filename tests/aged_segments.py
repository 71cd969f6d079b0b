"""A partition whose newest log segment is empty after a roll by age (Liftbridge's
``segment.max.age``), for the tests of time lookups that must cope with it. Real time, no clock
hook, so the same tests run on the dev server and on a real Liftbridge (``LIFTBRIDGE_TEST_BROKERS``):
both roll from the stream's cleaner loop (``cleanerInterval``; the dev server checks it every 0.5 s)."""

from __future__ import annotations

import datetime as dt

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient
from tests.margins import wait_until

#: Short enough for a test, long enough that a test's few publishes land in one segment.
SEGMENT_MAX_AGE = dt.timedelta(seconds=2)
CLEANER_INTERVAL = dt.timedelta(seconds=1)
#: How long the roll may take: segment max age + cleaner interval, many times over.
ROLL_WAIT = 60.0


def at(ns: int) -> dt.datetime:
    """The aware datetime at or just before ``ns`` (a subscription's start time has whole µs)."""
    return dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(microseconds=ns // 1000)


def server_lookup(client: LiftbridgeClient, stream: str, when: dt.datetime, hw: int) -> int | None:
    """The server's own answer to a time lookup, within the high watermark ``hw`` (``None``: it
    answered past ``hw``, "nothing that late")."""
    messages = client.subscribe(stream, start_at=when, stop_at=hw)
    try:
        first = next(messages, None)
    except InvalidArgumentError:  # the start it looked up is past the stop
        first = None
    finally:
        messages.close()  # type: ignore[attr-defined]
    return None if first is None else first.offset


def rolled_partition(client: LiftbridgeClient, stream: str, count: int) -> list[int]:
    """Create ``stream`` (one partition) with a short segment max age, publish ``count`` messages
    and wait until its segment rolled by age: the server's time lookup then answers "nothing" for
    a time inside the partition. Return the messages' timestamps (the one of offset ``i`` at ``i``).

    :raises AssertionError: the lookup never went wrong within :data:`ROLL_WAIT`.
    """
    client.create_stream(stream, stream, segment_max_age=SEGMENT_MAX_AGE, cleaner_interval=CLEANER_INTERVAL)
    for i in range(count):
        client.publish(stream, b"m%d" % i)
    stamps = [m.timestamp for m in client.subscribe(stream, start_at=0, stop_at=count - 1)]
    hw = count - 1
    wait_until(
        lambda: (
            server_lookup(client, stream, at(stamps[0]), hw) is None
            or server_lookup(client, stream, at(stamps[-1]), hw) is None
        ),
        ROLL_WAIT,
        "the roll by age: the server's time lookup answers past the partition's messages",
        interval=0.1,
    )
    return stamps
