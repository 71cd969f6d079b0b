"""``subscribe_columns`` against the dev server, on both clients (``client`` fixture): the same
messages as ``subscribe``, as columns, in batches of the asked size."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_liftbridge.client import (
    InvalidArgumentError,
    MessageColumns,
    Record,
)
from airflow_provider_liftbridge.client.column_subscription import HELD_MESSAGES


def rows_of(batches: list[MessageColumns]) -> list[tuple[Any, ...]]:
    """Every row as (stream, partition, offset, key or None, value, timestamp, headers or {})."""
    return [
        (b.stream, b.partition, b.offsets[i], b.keys[i] or None, b.values[i], b.timestamps[i], dict(b.headers(i) or {}))
        for b in batches
        for i in range(len(b))
    ]


def test_columns_hold_what_subscribe_delivers(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    client.publish_many(stream_name, [b"plain-%d" % i for i in range(5)])
    client.publish_many(stream_name, [Record(b"keyed-%d" % i, key=b"k%d" % i) for i in range(3)])
    client.publish_many(stream_name, [Record(b"headed-%d" % i, headers={"n": b"%d" % i, "e": b""}) for i in range(3)])
    client.publish_many(stream_name, [b"zipped-%d" % i * 20 for i in range(3)], compression="gzip")
    client.publish_many(stream_name, [b"plain-again-%d" % i for i in range(4)])

    batches = list(client.subscribe_columns(stream_name, stop_at=17, rows=4))
    messages = list(client.subscribe(stream_name, stop_at=17))

    assert [len(b) for b in batches] == [4, 4, 4, 4, 2]
    assert rows_of(batches) == [
        (m.stream, m.partition, m.offset, m.key, m.value, m.timestamp, dict(m.headers)) for m in messages
    ]
    assert [b.offsets for b in batches][-1] == [16, 17]
    assert batches[3].values[0] == b"zipped-1" * 20  # offset 12, decompressed as subscribe does
    # The server's own headers on plain messages: one shared set that every row points to.
    assert len(batches[0].header_sets) == 1 and batches[0].header_index == [0, 0, 0, 0]
    assert set(batches[0].header_sets[0]) == {"subject", "reply"}
    # User headers are a set of their own per message; the shared set is stored once per batch.
    assert len(batches[2].header_sets) == 4 and batches[2].header_index == [0, 1, 2, 3]


def test_start_offset_and_the_end_of_a_readonly_partition(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    client.publish_many(stream_name, [b"v%d" % i for i in range(10)])
    client.set_stream_readonly(stream_name)

    # No stop offset: the partition's end ends the subscription, and what is held is delivered.
    batches = list(client.subscribe_columns(stream_name, start_at=3, rows=4))

    assert [b.offsets for b in batches] == [[3, 4, 5, 6], [7, 8, 9]]
    assert [v for b in batches for v in b.values] == [b"v%d" % i for i in range(3, 10)]


@pytest.mark.parametrize("rows", [0, -1, 1.5, True])
def test_rows_must_be_a_positive_int(client: Any, stream_name: str, rows: Any) -> None:
    client.create_stream(stream_name, stream_name)
    with pytest.raises(InvalidArgumentError, match="rows must be an int >= 1"):
        next(client.subscribe_columns(stream_name, stop_at=0, rows=rows))


def test_batches_larger_than_what_is_held_at_once(client: Any, stream_name: str) -> None:
    # More rows per batch than HELD_MESSAGES: each batch's columns are pulled out in several goes,
    # and the server's shared header set stays one entry across them.
    client.create_stream(stream_name, stream_name)
    plain = HELD_MESSAGES + 44
    client.publish_many(stream_name, [b"p%d" % i for i in range(plain)])
    client.publish_many(stream_name, [Record(b"h%d" % i, headers={"n": b"%d" % i}) for i in range(5)])
    client.publish_many(stream_name, [b"q%d" % i for i in range(plain)])
    last = 2 * plain + 4

    batches = list(client.subscribe_columns(stream_name, stop_at=last, rows=2 * plain))
    messages = list(client.subscribe(stream_name, stop_at=last))

    assert [len(b) for b in batches] == [2 * plain, 5]
    assert rows_of(batches) == [
        (m.stream, m.partition, m.offset, m.key, m.value, m.timestamp, dict(m.headers)) for m in messages
    ]
    first = batches[0]
    assert len(first.header_sets) == 1 + 5  # the shared set once, one per message with its own
    assert first.header_index[:plain] == [0] * plain
    assert first.header_index[plain : plain + 5] == [1, 2, 3, 4, 5]
    assert first.header_index[plain + 5 :] == [0] * (plain - 5)
