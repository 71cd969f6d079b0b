"""Helpers of the operator tests: record sources importable by dotted path, and reading a stream back."""

from __future__ import annotations

from collections.abc import Iterator

from airflow_provider_liftbridge.client import LiftbridgeClient, Message, Record, StartPosition, StopPosition

#: How many records ``counted_records`` has handed out so far (tests reset it).
PULLED = {"count": 0}


def make_records(n: int, prefix: str = "rec") -> list[dict[str, object]]:
    """``n`` JSON records with an ``id`` field."""
    return [{"id": f"{prefix}-{i}", "n": i} for i in range(n)]


def counted_records(n: int) -> Iterator[bytes]:
    """A lazy source of ``n`` records that counts how many were pulled."""
    for i in range(n):
        PULLED["count"] += 1
        yield f"value-{i}".encode()


def records_with_expected_offsets(offsets: list[int]) -> list[Record]:
    """Records for a stream with optimistic concurrency control."""
    return [Record(value=f"occ-{o}".encode(), expected_offset=o) for o in offsets]


def read_all(client: LiftbridgeClient, stream: str, partition: int = 0) -> list[Message]:
    """Every committed message of a partition (empty list for an empty partition)."""
    if client.fetch_partition_metadata(stream, partition).high_watermark < 0:
        return []
    return list(
        client.subscribe(stream, partition=partition, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
    )


#: Tries of ``records_failing_first_try`` so far (tests reset it).
TRIES = {"count": 0}


def records_failing_first_try(n: int, fail_at: int) -> Iterator[bytes]:
    """``n`` JSON rows; the first try of the task stops with an error when row ``fail_at`` is
    pulled (after the rows before it went out), later tries hand out all of them."""
    TRIES["count"] += 1
    for i in range(n):
        if i == fail_at and TRIES["count"] == 1:
            raise RuntimeError("first try dies here")
        yield b'{"row": %d, "note": "%s"}' % (i, b"fragile " * 20)
