"""LiftbridgePublishFileOperator: formats, paths, headers, errors and bounded memory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeFileError
from airflow_provider_liftbridge.operators.file_formats import FileFormat, detect_format
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from tests.operators.helpers import read_all

pytestmark = pytest.mark.usefixtures("liftbridge_conn")


@pytest.fixture
def stream(stream_name: str, liftbridge_client: LiftbridgeClient) -> str:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    return stream_name


def publish(stream: str, path: object, **kwargs: object) -> dict[str, object]:
    return LiftbridgePublishFileOperator(task_id="f", stream=stream, path=path, **kwargs).execute({})  # type: ignore[arg-type]


def all_messages(client: LiftbridgeClient, stream: str) -> list:  # type: ignore[type-arg]
    return read_all(client, stream, 0) + read_all(client, stream, 1)


def test_lines_with_file_and_record_headers(tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient) -> None:
    path = tmp_path / "app.log"
    path.write_bytes(b"first\r\nsecond\n\nthird")
    summary = publish(stream, str(path), headers={"env": "test"})
    assert summary["count"] == summary["acknowledged"] == 3
    assert summary["files"] == [
        {
            "path": str(path),
            "format": "lines",
            "count": 3,
            "partitions": {"0": {"first_offset": 0, "last_offset": 2, "count": 3}},
        }
    ]
    messages = read_all(liftbridge_client, stream)
    assert [m.value for m in messages] == [b"first", b"second", b"third"]
    assert [m.headers["record"] for m in messages] == [b"0", b"1", b"2"]
    assert {m.headers["file"] for m in messages} == {str(path).encode()}
    assert all(m.headers["env"] == b"test" for m in messages)


@pytest.mark.parametrize("path_kind", ["grpc", "nats"])
def test_jsonl_by_key_field(path_kind: str, tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient) -> None:
    path = tmp_path / "orders.jsonl"
    rows = [{"customer": f"c{i % 3}", "amount": i} for i in range(30)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = publish(
        stream,
        f"file://{path}",
        key_field="customer",
        partitioner="key",
        options=PublishOptions(path=path_kind),
        batch_size=7,
    )
    assert summary["count"] == 30 and summary["acknowledged"] == 30
    messages = all_messages(liftbridge_client, stream)
    assert sorted(json.loads(m.value)["amount"] for m in messages) == list(range(30))
    for m in messages:
        assert m.key == json.loads(m.value)["customer"].encode()
    assert sum(span["count"] for span in summary["partitions"].values()) == 30  # type: ignore[union-attr]


def test_csv_with_and_without_header(tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient) -> None:
    with_header = tmp_path / "people.csv"
    with with_header.open("w", newline="") as handle:
        csv.writer(handle).writerows([["id", "name"], ["1", "Ada"], ["2", "Bo, Jr."]])
    bare = tmp_path / "bare.tsv"
    bare.write_text("x\t1\ny\t2\n")
    publish(stream, str(with_header), key_field="id", partition=0)
    publish(
        stream, str(bare), format=FileFormat("auto", csv_header=False, csv_delimiter="\t"), key_field="0", partition=1
    )
    assert [(m.key, json.loads(m.value)) for m in read_all(liftbridge_client, stream, 0)] == [
        (b"1", {"id": "1", "name": "Ada"}),
        (b"2", {"id": "2", "name": "Bo, Jr."}),
    ]
    assert [(m.key, json.loads(m.value)) for m in read_all(liftbridge_client, stream, 1)] == [
        (b"x", ["x", "1"]),
        (b"y", ["y", "2"]),
    ]


def test_parquet_read_by_batches(tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient) -> None:
    path = tmp_path / "t.parquet"
    table = pa.table({"id": list(range(45)), "name": [f"n{i}" for i in range(45)], "blob": [b"\x00"] * 45})
    pq.write_table(table, path, row_group_size=10)
    summary = publish(stream, str(path), key_field="id", batch_size=8, partition=0)
    assert summary["count"] == 45
    messages = read_all(liftbridge_client, stream, 0)
    assert json.loads(messages[44].value) == {"id": 44, "name": "n44", "blob": "AA=="}
    assert [m.key for m in messages[:3]] == [b"0", b"1", b"2"]


def test_whole_file_and_its_limit(tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient) -> None:
    small = tmp_path / "report.bin"
    small.write_bytes(bytes(range(256)) * 4)
    summary = publish(stream, str(small), format="whole", partition=0)
    assert summary["count"] == 1
    assert read_all(liftbridge_client, stream, 0)[0].value == small.read_bytes()
    with pytest.raises(LiftbridgeFileError, match="larger than max_whole_file_bytes"):
        publish(stream, str(small), format=FileFormat("whole", max_whole_file_bytes=100))


def test_glob_and_list_in_order(tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        (tmp_path / name).write_text(name + "\n")
    summary = publish(stream, [f"{tmp_path}/*.txt", str(tmp_path / "sub" / "c.txt")], partition=0)
    assert [Path(str(f["path"])).name for f in summary["files"]] == ["a.txt", "b.txt", "c.txt"]  # type: ignore[index]
    assert [m.value for m in read_all(liftbridge_client, stream, 0)] == [b"a.txt", b"b.txt", b"sub/c.txt"]


@pytest.mark.parametrize(
    ("setup", "path", "words"),
    [
        (None, "missing.txt", "does not exist"),
        (None, "*.nothing", "no file matches"),
        ("dir", "folder", "is a directory"),
        ("badjson", "bad.jsonl", "bad.jsonl: line 2 is not JSON"),
        ("badcsv", "bad.csv", r"CSV line 3 has 1 field\(s\)"),
        ("nokey", "nokey.jsonl", "key_field='id' is not a field of record 0; its fields are"),
        ("notparquet", "fake.parquet", "not a readable Parquet file"),
    ],
)
def test_bad_files_are_named(tmp_path: Path, stream: str, setup: str | None, path: str, words: str) -> None:
    if setup == "dir":
        (tmp_path / "folder").mkdir()
    elif setup == "badjson":
        (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{oops\n')
    elif setup == "badcsv":
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n3\n")
    elif setup == "nokey":
        (tmp_path / "nokey.jsonl").write_text('{"a": 1}\n')
    elif setup == "notparquet":
        (tmp_path / "fake.parquet").write_text("not parquet")
    with pytest.raises(LiftbridgeFileError, match=words):
        publish(stream, str(tmp_path / path), key_field="id" if setup == "nokey" else None)


def test_bad_format_fails_at_parse_time() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="format='xml' is not valid: use one of 'auto', "):
        LiftbridgePublishFileOperator(task_id="f", stream="s", path="x", format="xml")


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.JSONL", "jsonl"), ("a.ndjson", "jsonl"), ("a.csv", "csv"), ("a.parquet", "parquet"), ("a.dat", "lines")],
)
def test_format_detection(name: str, fmt: str) -> None:
    assert detect_format(name, "auto") == fmt


class ReadTrackingOperator(LiftbridgePublishFileOperator):
    """The real operator, noting how far into the file it had read each time a window was sent."""

    def _records(self, path, fmt, handle):  # type: ignore[no-untyped-def]
        self.handle = handle
        return super()._records(path, fmt, handle)

    def open_publisher(self, client):  # type: ignore[no-untyped-def]
        sender = super().open_publisher(client)
        original = sender.send
        self.read_at_send: list[int] = []

        def send(batch):  # type: ignore[no-untyped-def]
            self.read_at_send.append(self.handle.tell())
            return original(batch)

        sender.send = send  # type: ignore[method-assign]
        return sender


def test_large_file_is_read_one_window_at_a_time(
    tmp_path: Path, stream: str, liftbridge_client: LiftbridgeClient
) -> None:
    path = tmp_path / "big.jsonl"
    line = json.dumps({"customer": "c0", "payload": "x" * 2000}) + "\n"
    rows, window = 3000, 200
    path.write_text(line * rows)
    op = ReadTrackingOperator(
        task_id="f",
        stream=stream,
        path=str(path),
        key_field="customer",
        batch_size=window,
        partition=1,
    )
    summary = op.execute({})
    assert summary["count"] == summary["acknowledged"] == rows
    assert liftbridge_client.fetch_partition_metadata(stream, 1).high_watermark == rows - 1
    # When window k is sent, at most windows 0..k (plus one read buffer) have been read from the
    # 6 MB file: memory is bounded by the window, not the file.
    assert len(op.read_at_send) == rows // window
    for k, position in enumerate(op.read_at_send):
        assert position <= (k + 1) * window * len(line) + 64 * 1024, (k, position)
