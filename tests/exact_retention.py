"""Streams whose retention keeps exactly the newest messages, for the tests of what readers see
once retention removed some. Liftbridge deletes whole segments, never the active one, on the
stream's cleaner interval (``server/commitlog/delete_cleaner.go``; the dev server does the same):
with one message a segment (``segment_max_bytes=1``: a segment rolls before the write that finds
it full) and a short cleaner interval, a limit of N messages keeps exactly the newest N once the
cleaner has run. Real time, no clock hook: the same on the dev server and on a real Liftbridge."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient, StartPosition
from tests.margins import wait_until

#: ``create_stream`` options that make every message a segment of its own, cleaned every 0.1 s
#: (the dev server runs due cleaners every 0.5 s).
ONE_MESSAGE_SEGMENTS: dict[str, Any] = {"segment_max_bytes": 1, "cleaner_interval": dt.timedelta(milliseconds=100)}
#: How long the cleaner may take: two runs (a roll of the full active segment, then the clean),
#: many times over.
CLEAN_WAIT = 30.0


def publish_each(client: LiftbridgeClient, stream: str, values: Iterable[bytes], partition: int = 0) -> None:
    """Publish ``values`` one at a time, each acknowledged before the next: one segment each
    (a batch is written whole into one segment)."""
    for value in values:
        client.publish(stream, value, partition=partition)


def wait_for_earliest(client: LiftbridgeClient, stream: str, offset: int, partition: int = 0) -> None:
    """Wait until the partition's oldest message is ``offset`` (retention removed those before it).

    :raises AssertionError: not within :data:`CLEAN_WAIT`.
    """

    def earliest() -> int:
        messages = client.subscribe(stream, partition=partition, start_at=StartPosition.EARLIEST)
        try:
            return next(iter(messages)).offset
        finally:
            messages.close()  # type: ignore[attr-defined]

    wait_until(lambda: earliest() == offset, CLEAN_WAIT, f"retention removed offsets below {offset}", interval=0.1)
