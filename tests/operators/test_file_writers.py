"""The archiver's file writers on their own: what each format holds, the temporary name and the
rename, values that cannot be written. Real files (local paths and ``file://`` URLs through
Airflow's ``ObjectStoragePath``; no object store runs here), real pyarrow; messages are built in
the test because no server is involved in writing."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from airflow.sdk import ObjectStoragePath

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeFileError
from airflow_provider_liftbridge.operators.file_writers import (
    ArchiveValueError,
    WriteOptions,
    file_name,
    write_range,
)

TS = 1_700_000_000_123_456_789


def message(offset: int, value: bytes, key: bytes | None = b"k", headers: dict[str, bytes] | None = None) -> Message:
    return Message("orders", 1, offset, key, value, TS + offset, "orders.1", "", headers or {"h": b"v"})


def orders(first: int, count: int) -> list[Message]:
    return [
        message(o, json.dumps({"order": o, "amount": o * 1.5, "timestamp": "t"}).encode(), key=b"c%d" % (o % 3))
        for o in range(first, first + count)
    ]


def in_batches(messages: list[Message], size: int) -> list[list[Message]]:
    return [messages[i : i + size] for i in range(0, len(messages), size)]


def test_file_names_are_fixed_by_the_range_and_sort_in_offset_order() -> None:
    assert file_name("orders", 1, 0, 999, "parquet") == "orders-1-00000000000000000000-00000000000000000999.parquet"
    assert file_name("a/b c", 0, 5, 6, "jsonl").startswith("a_b_c-0-")
    names = [file_name("s", 0, first, first + 9, "csv") for first in (1000, 10, 100)]
    assert sorted(names) == [names[1], names[2], names[0]]


def test_parquet_holds_every_column_and_one_row_group_per_batch(tmp_path: Path) -> None:
    written = write_range(
        ObjectStoragePath(str(tmp_path)),
        "orders",
        1,
        in_batches(orders(10, 25), 10),
        WriteOptions(format="parquet", value_format="json"),
    )
    assert written is not None and written.rows == 25
    assert Path(written.path).name == file_name("orders", 1, 10, 34, "parquet")
    parquet = pq.ParquetFile(written.path)
    assert parquet.metadata.num_row_groups == 3
    table = parquet.read()
    assert table.column_names == [
        "stream", "partition", "offset", "timestamp", "key", "order", "amount", "value_timestamp", "headers"
    ]  # fmt: skip
    rows = table.to_pylist()
    assert [r["offset"] for r in rows] == list(range(10, 35))
    assert rows[0]["order"] == 10 and rows[0]["amount"] == 15.0 and rows[0]["value_timestamp"] == "t"
    assert rows[0]["key"] == "c1" and rows[0]["stream"] == "orders" and rows[0]["partition"] == 1
    assert rows[0]["headers"] == [("h", b"v")]
    assert int(rows[0]["timestamp"].timestamp() * 1_000_000) == (TS + 10) // 1000  # microseconds
    assert sorted(os.listdir(tmp_path)) == [Path(written.path).name]  # no temporary name left


def test_parquet_bytes_and_text_values(tmp_path: Path) -> None:
    raw = [message(0, b"\x00\xff"), message(1, b"plain", key=None)]
    written = write_range(ObjectStoragePath(str(tmp_path)), "orders", 1, [raw], WriteOptions(value_format="bytes"))
    assert written is not None
    rows = pq.read_table(written.path).to_pylist()
    assert [(r["key"], r["value"]) for r in rows] == [(b"k", b"\x00\xff"), (None, b"plain")]
    written = write_range(ObjectStoragePath(str(tmp_path)), "orders", 1, [raw[1:]], WriteOptions())
    assert written is not None
    assert pq.read_table(written.path).column("value").to_pylist() == ["plain"]


def test_jsonl_and_csv_content(tmp_path: Path) -> None:
    base = ObjectStoragePath(str(tmp_path))
    jsonl = write_range(base, "orders", 1, [orders(0, 3)], WriteOptions(format="jsonl", value_format="json"))
    assert jsonl is not None
    lines = [json.loads(line) for line in Path(jsonl.path).read_text().splitlines()]
    assert lines[2] == {
        "stream": "orders",
        "partition": 1,
        "offset": 2,
        "timestamp": "2023-11-14T22:13:20.123456791Z",
        "key": "c2",
        "order": 2,
        "amount": 3.0,
        "value_timestamp": "t",
        "headers": {"h": "v"},
    }
    csv_file = write_range(base, "orders", 1, [orders(0, 3)], WriteOptions(format="csv", value_format="text"))
    assert csv_file is not None
    rows = list(csv.DictReader(io.StringIO(Path(csv_file.path).read_text())))
    assert list(rows[0]) == ["stream", "partition", "offset", "timestamp", "key", "value", "headers"]
    assert json.loads(rows[1]["value"]) == {"order": 1, "amount": 1.5, "timestamp": "t"}
    assert json.loads(rows[1]["headers"]) == {"h": "v"}
    binary = write_range(base, "orders", 1, [[message(5, b"\xff")]], WriteOptions(format="jsonl", value_format="bytes"))
    assert binary is not None
    assert base64.b64decode(json.loads(Path(binary.path).read_text())["value"]) == b"\xff"


def test_url_path_and_a_retry_overwrites_the_same_file(tmp_path: Path) -> None:
    base = ObjectStoragePath(f"file://{tmp_path}/orders/")
    base.mkdir(parents=True)
    first = write_range(base, "orders", 1, [orders(0, 10)], WriteOptions(format="jsonl"))
    again = write_range(base, "orders", 1, [orders(0, 10)], WriteOptions(format="jsonl"))
    assert first is not None and again is not None and first.path == again.path
    assert [p.name for p in base.iterdir()] == [file_name("orders", 1, 0, 9, "jsonl")]
    assert len((base / file_name("orders", 1, 0, 9, "jsonl")).read_text().splitlines()) == 10


def test_a_value_that_is_not_json_is_an_error_naming_its_offset_and_leaves_no_file(tmp_path: Path) -> None:
    batch = [*orders(0, 3), message(3, b"not json"), *orders(4, 2)]
    with pytest.raises(ArchiveValueError, match=r"stream 'orders' partition 1 offset 3: the value is not JSON"):
        write_range(ObjectStoragePath(str(tmp_path)), "orders", 1, [batch], WriteOptions(value_format="json"))
    assert os.listdir(tmp_path) == []


def test_rejected_messages_are_handed_over_and_the_file_goes_on_without_them(tmp_path: Path) -> None:
    rejected: list[tuple[int, str]] = []
    batch = [*orders(0, 2), message(2, b"[1, 2]"), message(3, b"\xff"), *orders(4, 2)]
    written = write_range(
        ObjectStoragePath(str(tmp_path)),
        "orders",
        1,
        [batch],
        WriteOptions(value_format="json"),
        reject=lambda m, why: rejected.append((m.offset, why.problem)),
    )
    assert written is not None and written.rows == 4
    assert [o for o, _ in rejected] == [2, 3]
    assert "not an object" in rejected[0][1] and "not JSON" in rejected[1][1]
    assert pq.read_table(written.path).column("offset").to_pylist() == [0, 1, 4, 5]


def test_a_field_outside_the_first_rows_columns_names_its_offset(tmp_path: Path) -> None:
    later = message(7, json.dumps({"order": 7, "amount": 1.0, "timestamp": "t", "coupon": "X"}).encode())
    with pytest.raises(ArchiveValueError, match=r"offset 7: .*field\(s\) \['coupon'\]"):
        write_range(
            ObjectStoragePath(str(tmp_path)),
            "orders",
            1,
            [orders(0, 7), [later]],
            WriteOptions(value_format="json"),
        )
    wrong_type = message(9, json.dumps({"order": "nine", "amount": 1.0, "timestamp": "t"}).encode())
    with pytest.raises(ArchiveValueError, match=r"offset 9: a field of the value does not fit"):
        write_range(
            ObjectStoragePath(str(tmp_path)),
            "orders",
            1,
            [[*orders(0, 5), wrong_type]],
            WriteOptions(
                value_format="json", json_schema={"order": "int64", "amount": "float64", "value_timestamp": "string"}
            ),
        )
    assert os.listdir(tmp_path) == []


def test_json_values_after_the_first_rows_hold_what_json_loads_reads(tmp_path: Path) -> None:
    """Once a file's columns are known, Arrow's JSON reader parses a batch's values; what it would
    read otherwise (a value over two lines, a key given twice) is converted value by value: the
    file holds what ``json.loads`` reads, in the first rows' column types."""

    def value(o: int, **more: object) -> bytes:
        fields = {"id": o, "amount": o + 0.5, "name": f"n-{o}", "tags": ["a", str(o)], "nested": {"x": o}} | more
        return json.dumps(fields).encode()

    first = [message(o, value(o)) for o in range(3)]
    by_arrow = [
        message(3, value(3, amount=4)),  # an int in a float column
        message(4, b'{"id": 4, "name": "\\u00e9\\n"}'),  # fields missing, escapes
        message(5, value(5, nested={"x": -1}, tags=[])),
    ]
    by_python = [message(6, b'{"id": 6,\n "amount": 1.25}'), message(7, b'{"id": 7, "id": 8}')]
    written = write_range(
        ObjectStoragePath(str(tmp_path)),
        "orders",
        1,
        [first, by_arrow, by_python],
        WriteOptions(value_format="json"),
    )
    assert written is not None
    table = pq.read_table(written.path)
    assert [str(t) for t in table.schema.types[5:10]] == [
        "int64", "double", "string", "list<element: string>", "struct<x: int64>"
    ]  # fmt: skip
    names = ["id", "amount", "name", "tags", "nested"]
    expected = [{name: json.loads(m.value).get(name) for name in names} for m in first + by_arrow + by_python]
    expected[3]["amount"] = 4.0
    assert table.select(names).to_pylist() == expected
    wrong = message(9, value(9, id="nine"))
    with pytest.raises(ArchiveValueError, match=r"offset 9: a field of the value does not fit"):
        write_range(
            ObjectStoragePath(str(tmp_path)),
            "orders",
            1,
            [first, [message(8, value(8)), wrong, message(10, value(10))]],
            WriteOptions(value_format="json"),
        )
    two_in_one = [message(11, b'{"id": 11}\n{"id": 12}'), message(12, b"")]  # as many lines as messages
    with pytest.raises(ArchiveValueError, match=r"offset 11: the value is not JSON"):
        write_range(
            ObjectStoragePath(str(tmp_path)), "orders", 1, [first, two_in_one], WriteOptions(value_format="json")
        )


def test_jsonl_and_csv_name_the_first_message_that_cannot_be_written(tmp_path: Path) -> None:
    """A batch is converted column by column (headers before values): still the first bad message is named."""
    batch = [*orders(0, 2), message(2, b"\xff"), message(3, b"ok", headers={"h": b"\xfe"})]
    for fmt in ("jsonl", "csv"):
        with pytest.raises(ArchiveValueError, match=r"offset 2: the value is not UTF-8"):
            write_range(ObjectStoragePath(str(tmp_path)), "orders", 1, [batch], WriteOptions(format=fmt))


def test_an_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file, not a directory")
    with pytest.raises(LiftbridgeFileError, match=r"cannot write the archive file .*blocked/\.orders-1-.*give a path"):
        write_range(ObjectStoragePath(str(blocked)), "orders", 1, [orders(0, 3)], WriteOptions())


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"format": "avro"}, "format 'avro' is unknown"),
        ({"value_format": "xml"}, "value_format 'xml' is unknown"),
        ({"json_schema": {"a": "string"}}, "json_schema applies to value_format='json' only"),
        ({"value_format": "json", "json_schema": {"a": "strung"}}, "'strung' is not a pyarrow type name"),
        ({"batch_rows": 0}, "batch_rows must be at least 1"),
    ],
)
def test_bad_options(options: dict[str, object], match: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=match):
        WriteOptions(**options)  # type: ignore[arg-type]
