"""``subscribe(stop_at=StopPosition.LATEST)`` and ``subscribe_columns`` on a log that retention
emptied, on both clients (``client`` fixture). Liftbridge accepts EARLIEST to LATEST there (its
oldest offset is -1, so the start is 0; the stop is the newest offset) and never ends the
subscription: no record has the stop offset any more (docs/devserver.md, "An emptied log"). The
client ends it at the first record past the stop instead of reading on for good. Also
``oldest_retained``, which finds the oldest kept offset there without waiting for a new record."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, StartPosition, StopPosition, StreamOptions
from airflow_provider_liftbridge.client.reading.seek import oldest_retained
from tests import margins
from tests.aged_segments import rolled_partition

BIG = b"x" * 1000
#: Three records of BIG a segment, one kept segment, the cleaner on every dev-server tick: six
#: records leave only an empty active segment at offset 6 (tests/devserver/test_retention.py).
OPTIONS = StreamOptions(retention_max_messages=2, segment_max_bytes=2500, cleaner_interval=timedelta(milliseconds=100))
WAIT = 30.0
#: ``oldest_retained``'s wait for the record at offset 5 while polling for the emptied log. Its
#: time lookup answers "offset 6" only once nothing is kept here: the cleaner's last two runs go
#: from two full segments (the lookup answers 0) to a rolled empty one, then to nothing kept
#: (tests/devserver/test_retention.py). So this wait decides nothing, and each look at an emptied
#: log costs it: the client's default (10 s) would be paid by every test here. The default (the
#: client's ``timeout``) is what the Spark source's probe uses, with a 3 s client, in
#: tests/spark/test_stream_reader.py.
PROBE_WAIT = 1.0


def _wait_emptied(lb_address: str, stream: str) -> None:
    """Wait until retention left nothing of offsets 0-5. Not by the metadata's first timestamp:
    Liftbridge keeps that as the time its leader first received a message, retention or not."""
    with LiftbridgeClient(lb_address) as probe:
        margins.wait_until(
            lambda: oldest_retained(probe, stream, 0, 5, wait=PROBE_WAIT) == 6,
            WAIT,
            "every record expired",
            interval=0.1,
        )


def _emptied(client: Any, stream: str, lb_address: str) -> None:
    client.create_stream(stream, stream, OPTIONS)
    for i in range(6):
        client.publish(stream, BIG + b"%d" % i)
    _wait_emptied(lb_address, stream)


def _read_while_publishing(client: Any, stream: str, read: Any) -> list[int]:
    """Run ``read()`` (the offsets it delivers) in a thread while records go on arriving, one per
    poll from the second poll on, until it ends; return its offsets. The records keep coming
    because the read can only end on a record past its stop.

    When the read opens is not observable: if the first record lands before it reads the newest
    offset, that record is its LATEST and it ends there with it ([6]), on any client. Otherwise the
    log is still empty when it opens, and it must end on the first record without delivering it
    ([]). Only that case tells the clients apart, and it is the usual one: the first record comes a
    poll after the read started."""
    got: list[int] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            got.extend(read())
        except BaseException as err:  # noqa: BLE001 - handed to the test below
            failed.append(err)
        finally:
            done.set()

    polls = [0]

    def publish_one() -> bool:
        polls[0] += 1
        if polls[0] > 1 and not done.is_set():
            client.publish(stream, b"more")
        return done.is_set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    margins.wait_until(publish_one, WAIT, "the read to end on a record past LATEST", interval=0.2)
    thread.join(WAIT)
    assert not failed, f"the read raised: {failed[0]!r}"
    return got


def test_subscribe_to_latest_on_an_emptied_log_ends_past_the_stop(
    client: Any, lb_address: str, stream_name: str
) -> None:
    _emptied(client, stream_name, lb_address)

    def read() -> list[int]:
        found = client.subscribe(stream_name, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
        return [m.offset for m in found]

    # It ends, with nothing past the newest offset it started with (before: it read on for good,
    # delivering every later record, and the wait above ran out).
    assert _read_while_publishing(client, stream_name, read) in ([], [6])


def test_columns_to_latest_on_an_emptied_log_end_past_the_stop(client: Any, lb_address: str, stream_name: str) -> None:
    _emptied(client, stream_name, lb_address)

    def read() -> list[int]:
        batches = client.subscribe_columns(
            stream_name, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST, rows=4
        )
        return [offset for batch in batches for offset in batch.offsets]

    assert _read_while_publishing(client, stream_name, read) in ([], [6])


@pytest.mark.own_server  # waits on the dev server's first timestamp, which Liftbridge never zeroes
def test_the_oldest_retained_offset_is_found_without_waiting_for_a_new_record(
    lb_address: str, stream_name: str
) -> None:
    # The probe of the Spark stream reader and the UI's Streams tab. A subscription from EARLIEST
    # waits here until a new record comes (nothing is published in this test). The helper asks
    # the time lookup instead, which answers at once that nothing is kept: the next offset.
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, OPTIONS)
        assert oldest_retained(client, stream_name, 0, -1) == 0  # nothing was ever published
        for i in range(6):
            client.publish(stream_name, BIG + b"%d" % i)
        assert oldest_retained(client, stream_name, 0, 5) in range(6)  # not yet cleaned: a kept one
        margins.wait_until(
            lambda: client.fetch_partition_metadata(stream_name).first_message_timestamp == 0,
            WAIT,
            "every record expired (the dev server's sign of it)",
            interval=0.1,
        )
        assert oldest_retained(client, stream_name, 0, 5, wait=PROBE_WAIT) == 6


def test_the_oldest_retained_offset_where_the_time_lookup_answers_past_the_records(
    lb_address: str, stream_name: str
) -> None:
    # One segment of records and an empty newest one (rolled by age): the time lookup answers
    # "the next offset" for any time, as on an emptied log, but the records are all kept.
    with LiftbridgeClient(lb_address) as client:
        rolled_partition(client, stream_name, 5)
        assert oldest_retained(client, stream_name, 0, 4) == 0
