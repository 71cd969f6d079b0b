"""The read side's Arrow batches (``spark/arrow_read.py``, ``read_split``) without a SparkSession:
built from a subscription's columns, checked row by row against what ``subscribe`` delivers."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, MessageColumns, Record
from airflow_provider_liftbridge.spark import ConnectionSettings
from airflow_provider_liftbridge.spark.arrow_read import columns_batch, read_schema
from airflow_provider_liftbridge.spark.reading import LiftbridgeSplit, read_split

SERVER = {"subject": b"s", "reply": b""}


def columns(offsets: list[int], **given: Any) -> MessageColumns:
    rows = len(offsets)
    fields: dict[str, Any] = {
        "keys": [b""] * rows,
        "values": [b"v%d" % o for o in offsets],
        "timestamps": [1_700_000_000_123_456_789 + o for o in offsets],
        "header_sets": [],
        "header_index": [-1] * rows,
    }
    fields.update(given)
    return MessageColumns("orders", 3, offsets, **fields)


def expected_row(c: MessageColumns, i: int) -> dict[str, Any]:
    """One row as the per-message reader built it, but with null headers for a message without."""
    headers = c.headers(i)
    return {
        "stream": c.stream,
        "partition": c.partition,
        "offset": c.offsets[i],
        "key": c.keys[i] or None,
        "value": c.values[i],
        "timestamp": dt.datetime.fromtimestamp(c.timestamps[i] // 1000 / 1e6, tz=dt.UTC),
        "headers": None if headers is None else list(headers.items()),
    }


def test_rows_keys_timestamps_and_headers() -> None:
    c = columns(
        [10, 11, 12, 13, 14],
        keys=[b"", b"k1", b"", b"k3", b"k4"],
        header_sets=[SERVER, {"n": b"1", "e": b""}],
        header_index=[0, -1, 1, 0, 0],
    )
    batch = columns_batch(c)

    assert batch.schema == read_schema()
    assert batch.to_pylist() == [expected_row(c, i) for i in range(5)]
    assert batch.column("key").null_count == 2 and batch.column("headers").null_count == 1
    # Microseconds, truncated (Spark's precision).
    assert batch.column("timestamp")[0].value == 1_700_000_000_123_456


def test_no_headers_at_all_is_a_null_column_of_the_same_type() -> None:
    batch = columns_batch(columns([0, 1, 2]))

    assert batch.schema == read_schema()
    assert batch.column("headers").null_count == 3
    assert batch.column("headers").type == pa.map_(pa.string(), pa.binary())


def test_one_shared_header_set() -> None:
    c = columns(list(range(1000)), header_sets=[SERVER], header_index=[0] * 1000)
    headers = columns_batch(c).column("headers")

    assert headers.null_count == 0
    assert headers.to_pylist() == [list(SERVER.items())] * 1000


def test_bounds_filter_rows() -> None:
    c = columns([5, 6, 7, 8, 9], header_sets=[SERVER], header_index=[0, 0, -1, 0, 0])
    t = c.timestamps

    assert columns_batch(c, first_offset=6, last_offset=8).column("offset").to_pylist() == [6, 7, 8]
    assert columns_batch(c, start_time_ns=t[1], stop_time_ns=t[3]).column("offset").to_pylist() == [6, 7, 8]
    kept = columns_batch(c, first_offset=7, stop_time_ns=t[3])
    assert kept.to_pylist() == [expected_row(c, 2), expected_row(c, 3)]
    assert columns_batch(c, first_offset=5, last_offset=9).num_rows == 5


def test_arrays_from_buffers_are_valid_and_equal_to_pyarrows_own() -> None:
    c = columns(
        [7, 8, 9],
        keys=[b"", "é".encode(), b"k"],
        values=[b"", b"\x00" * 3, b"x"],
        header_sets=[{"é": b"1", "": b""}],
        header_index=[-1, 0, 0],
    )
    batch = columns_batch(c, first_offset=8)
    batch.validate(full=True)
    assert batch.column("offset").equals(pa.array([8, 9], pa.int64()))
    assert batch.column("key").equals(pa.array(["é".encode(), b"k"], pa.binary()))
    assert batch.column("value").equals(pa.array([b"\x00" * 3, b"x"], pa.binary()))
    assert batch.column("stream").equals(pa.array(["orders"] * 2, pa.string()))
    assert batch.column("headers").to_pylist() == [[("é", b"1"), ("", b"")]] * 2


def test_a_batch_imports_no_pandas() -> None:
    """pa.array / pa.scalar of Python values import pandas (about 170 ms in a fresh Spark worker)."""
    code = (
        "import sys\n"
        "from airflow_provider_liftbridge.client import MessageColumns\n"
        "from airflow_provider_liftbridge.spark.arrow_read import columns_batch\n"
        "c = MessageColumns('s', 0, [1, 2], [b'', b'k'], [b'a', b'b'], [5, 6], [{'h': b'1'}], [0, -1])\n"
        "columns_batch(c, first_offset=2, start_time_ns=1, stop_time_ns=9)\n"
        "print('pandas' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_read_split_matches_subscribe(lb_address: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address, timeout=5.0) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b"plain-%d" % i for i in range(20)])
        client.publish_many(stream_name, [Record(b"h%d" % i, key=b"k", headers={"n": b"%d" % i}) for i in range(5)])
        client.publish_many(stream_name, [b"z%d" % i * 10 for i in range(5)], compression="gzip")
        messages = list(client.subscribe(stream_name, start_at=3, stop_at=27))
    settings = ConnectionSettings(brokers=lb_address, timeout=5.0)

    batches = list(read_split(stream_name, settings, LiftbridgeSplit(0, 3, 27)))

    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [r["offset"] for r in rows] == list(range(3, 28))
    assert rows == [
        {
            "stream": stream_name,
            "partition": 0,
            "offset": m.offset,
            "key": m.key,
            "value": m.value,  # decompressed
            "timestamp": dt.datetime.fromtimestamp(m.timestamp // 1000 / 1e6, tz=dt.UTC),
            "headers": list(m.headers.items()),  # the server's subject / reply included
        }
        for m in messages
    ]


@pytest.mark.parametrize("start", ["time", "offset"])
def test_read_split_time_bounds(lb_address: str, stream_name: str, start: str) -> None:
    with LiftbridgeClient(lb_address, timeout=5.0) as client:
        client.create_stream(stream_name, stream_name)
        for i in range(6):
            client.publish(stream_name, b"v%d" % i)
        times = [m.timestamp for m in client.subscribe(stream_name, stop_at=5)]
    settings = ConnectionSettings(brokers=lb_address, timeout=5.0)
    split = LiftbridgeSplit(
        0, 0 if start == "time" else 2, 5, start_time_ns=times[1] if start == "time" else None, stop_time_ns=times[3]
    )

    offsets = [o for b in read_split(stream_name, settings, split) for o in b.column("offset").to_pylist()]

    first = split.start_offset
    low = split.start_time_ns if split.start_time_ns is not None else times[0]
    # Computed from the stored times: two messages may share one.
    assert offsets == [o for o, t in enumerate(times) if o >= first and low <= t <= times[3]]
    assert offsets[-1] == 3 and offsets[0] <= (1 if start == "time" else 2)
