"""LiftbridgeStreamToFileOperator through real DAG runs (``dag.test()``) against the dev server:
the files and their content, a retry that overwrites instead of adding, the next run, bad input.
The SIGKILLed try is in tests/reliability/test_archive_killed.py."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, StartPosition, StopPosition
from airflow_provider_liftbridge.client.reading import DEAD_LETTER_HEADERS
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import Parquet, SinceLastRun
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream
from airflow_provider_liftbridge.operators.file_writers import file_name
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators import archive_support as support

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(120)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def make_dag(stream: str, path: Any, **op_kwargs: Any) -> Any:
    """One registered DAG with one archive task (retried once, at once)."""
    from airflow.sdk import DAG

    op_kwargs.setdefault("read", SinceLastRun("archive"))
    with DAG(f"archive_{stream}_{uuid.uuid4().hex[:6]}", schedule=None, start_date=START) as dag:
        LiftbridgeStreamToFileOperator(
            task_id="archive", stream=stream, path=path, retries=1, retry_delay=dt.timedelta(seconds=0), **op_kwargs
        )
    register_dag(dag)
    return dag


def run(dag: Any) -> tuple[Any, Any]:
    dag_run = dag.test()
    return dag_run, xcom_of(dag_run, "archive")


def publish(client: LiftbridgeClient, stream: str, n: int, start: int = 0, partition: int = 0) -> None:
    orders = [json.dumps({"order": i, "amount": i + 0.5}).encode() for i in range(start, start + n)]
    client.publish_many(stream, orders, partition=partition)


def parquet_offsets(directory: Path) -> Counter[tuple[int, int]]:
    """(partition, offset) of every row of every Parquet file in ``directory``."""
    seen: Counter[tuple[int, int]] = Counter()
    for path in directory.glob("*.parquet"):
        table = pq.read_table(path, columns=["partition", "offset"])
        seen.update(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True))
    return seen


def test_parquet_archive_of_two_partitions_then_the_next_run(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    publish(liftbridge_client, stream_name, 25, partition=0)
    publish(liftbridge_client, stream_name, 7, partition=1)
    dag = make_dag(stream_name, str(tmp_path), value_format="json", batch_size=10, format=Parquet(row_group_rows=4))
    dag_run, result = run(dag)
    assert str(dag_run.state) == "success"
    expected = [(0, 0, 9), (0, 10, 19), (0, 20, 24), (1, 0, 6)]
    assert [(f["partition"], f["first_offset"], f["last_offset"]) for f in result["files"]] == expected
    assert sorted(os.listdir(tmp_path)) == sorted(file_name(stream_name, p, a, b, "parquet") for p, a, b in expected)
    first = pq.ParquetFile(tmp_path / file_name(stream_name, 0, 0, 9, "parquet"))
    assert first.metadata.num_row_groups == 3  # 4 + 4 + 2 rows
    rows = first.read().to_pylist()
    assert [(r["offset"], r["order"], r["amount"]) for r in rows] == [(i, i, i + 0.5) for i in range(10)]
    assert rows[0]["stream"] == stream_name and rows[0]["timestamp"].year >= 2024
    assert (
        liftbridge_client.fetch_cursor("archive", stream_name, 0),
        liftbridge_client.fetch_cursor("archive", stream_name, 1),
    ) == (24, 6)
    assert result["processed"] == 32
    # The next run writes only what arrived since, in new files.
    publish(liftbridge_client, stream_name, 3, start=25, partition=0)
    _, result = run(dag)
    assert [(f["partition"], f["first_offset"], f["last_offset"], f["rows"]) for f in result["files"]] == [
        (0, 25, 27, 3)
    ]
    assert parquet_offsets(tmp_path) == Counter({(0, o): 1 for o in range(28)} | {(1, o): 1 for o in range(7)})


def test_a_failed_try_after_a_complete_file_is_overwritten_by_the_retry(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """Try 1 completes files 0..9 (committed) and 10..19 (renamed into place, then on_file
    raises: not committed); try 2 writes 10..19 again under the same name, then 20..29."""
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 30)
    support.reset()
    dag = make_dag(
        stream_name,
        f"file://{tmp_path}/archive",
        format="jsonl",
        batch_size=10,
        on_file="tests.operators.archive_support.fail_first_try_at_file",
        on_file_kwargs={"fail_at": 2},
    )
    dag_run, result = run(dag)
    assert str(dag_run.state) == "success"
    assert [(t, f["first_offset"]) for t, f in support.FILES] == [(1, 0), (1, 10), (2, 10), (2, 20)]
    names = sorted(os.listdir(tmp_path / "archive"))
    assert names == [file_name(stream_name, 0, a, a + 9, "jsonl") for a in (0, 10, 20)]
    offsets = Counter(
        json.loads(line)["offset"] for name in names for line in (tmp_path / "archive" / name).read_text().splitlines()
    )
    assert offsets == Counter(range(30))
    assert [f["first_offset"] for f in result["files"]] == [0, 10, 20]  # the first try's file included
    assert result["partitions"]["0"]["resumed"] is True
    assert liftbridge_client.fetch_cursor("archive", stream_name, 0) == 29


def test_an_asset_outlet_gets_an_event_with_the_files(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.sdk import Asset
    from airflow.utils.session import create_session
    from sqlalchemy import select

    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 3)
    asset = Asset(f"archive_{stream_name}", uri=tmp_path.as_uri())
    _, result = run(make_dag(stream_name, str(tmp_path), format="jsonl", outlets=[asset]))
    with create_session() as session:
        events = session.scalars(
            select(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .where(AssetModel.name == asset.name)
        ).all()
        extras = [event.extra for event in events]
    assert extras == [{"stream": stream_name, "files": [f["path"] for f in result["files"]]}]
    assert len(result["files"]) == 1


def test_csv_archive_with_text_values(tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"plain,text", "naïve".encode()])
    _, result = run(make_dag(stream_name, str(tmp_path), format="csv"))
    (entry,) = result["files"]
    rows = list(csv.DictReader(io.StringIO(Path(entry["path"]).read_text())))
    assert [(r["offset"], r["value"]) for r in rows] == [("0", "plain,text"), ("1", "naïve")]


def test_an_unwritable_path_fails_before_anything_is_read(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 3)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file")
    dag_run, _ = run(make_dag(stream_name, str(blocked / "archive")))
    assert str(dag_run.state) == "failed"
    assert liftbridge_client.fetch_cursor("archive", stream_name, 0) == -1
    assert os.listdir(tmp_path) == ["not-a-directory"]


def test_a_value_that_is_not_json_fails_naming_its_offset_and_commits_nothing_past_it(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 5)
    liftbridge_client.publish(stream_name, b"not json")  # offset 5
    publish(liftbridge_client, stream_name, 2, start=6)
    dag_run, _ = run(make_dag(stream_name, str(tmp_path), value_format="json", batch_size=4))
    assert str(dag_run.state) == "failed"
    logged = capfd.readouterr()
    assert (
        f"cannot archive stream {stream_name!r} partition 0 offset 5: the value is not JSON" in logged.out + logged.err
    )
    assert liftbridge_client.fetch_cursor("archive", stream_name, 0) == 3  # the first file, 0..3
    assert sorted(os.listdir(tmp_path)) == [file_name(stream_name, 0, 0, 3, "parquet")]


def test_a_value_that_is_not_json_goes_to_the_dead_letter_stream(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 2)
    liftbridge_client.publish(stream_name, b"not json", key=b"k")
    publish(liftbridge_client, stream_name, 2, start=3)
    dead = f"{stream_name}-dead"
    _, result = run(
        make_dag(
            stream_name,
            str(tmp_path),
            value_format="json",
            dead_letters=DeadLetterStream(dead, create=True),
        )
    )
    assert result["dead_lettered"] == 1
    (entry,) = result["files"]
    assert (entry["first_offset"], entry["last_offset"], entry["rows"]) == (0, 4, 4)
    assert pq.read_table(entry["path"]).column("order").to_pylist() == [0, 1, 3, 4]
    (letter,) = liftbridge_client.subscribe(dead, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
    assert letter.value == b"not json" and letter.key == b"k"
    assert set(DEAD_LETTER_HEADERS) <= set(letter.headers)
    assert b"not JSON" in letter.headers["dead-letter-error"]
    assert letter.headers["dead-letter-source-offset"] == b"2"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"format": "avro"}, "format='avro' is not valid: Parquet"),
        ({"format": Parquet(row_group_rows=0)}, "format.row_group_rows=0 is not valid"),
        ({"value_format": "xml"}, "value_format 'xml' is unknown; use one of bytes, text, json"),
        ({"batch_size": 0}, "batch_size=0 is not valid"),
        ({"dead_letters": DeadLetterStream("dlq", create="yes")}, "dead_letters.create='yes' is not valid"),  # type: ignore[arg-type]
        ({"read": None}, "needs read="),
        ({"max_rows_per_file": 10}, "use batch_size=10 instead of max_rows_per_file=10"),
        ({"parquet_compression": "zstd"}, r"use format=Parquet\(compression='zstd'\)"),
        ({"on_file": "no such.module.func"}, "on_file='no such.module.func' is not valid"),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    kwargs = {"read": SinceLastRun("c")} | kwargs
    with pytest.raises(LiftbridgeArgumentError, match=match):
        LiftbridgeStreamToFileOperator(task_id="t", stream="s", path=str(tmp_path), **kwargs)


def test_a_position_read_cleans_up_only_inside_its_plan(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """What a try removes before it writes: temporary files whose range overlaps its plan (a dead
    try's) and files that start in it; another plan's temporary and final files, another stream's
    and temporary names of the old form (no range, whose they are is unknown) stay."""
    from airflow_provider_liftbridge.operators.archive_files import NO_END, temporary_name

    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 10)  # the plan: offsets 0..9
    mine = [temporary_name(stream_name, 0, 0, NO_END), temporary_name(stream_name, 0, 4, 10)]
    mine.append(file_name(stream_name, 0, 5, 9, "parquet"))  # renamed by a dead try, not committed
    others = [
        temporary_name(stream_name, 0, 10, 20),  # a later plan's, being written
        temporary_name(stream_name, 1, 0, 10),  # partition 1's
        temporary_name(stream_name + "-0", 0, 0, 10),  # the stream "<name>-0"'s
        f".{stream_name}-0-0123456789ab.tmp",  # the old form: unknown whose
        file_name(stream_name, 0, 10, 19, "parquet"),  # a later plan's
    ]
    for name in mine + others:
        (tmp_path / name).write_bytes(b"left over")
    dag_run, result = run(make_dag(stream_name, str(tmp_path), value_format="json"))
    assert str(dag_run.state) == "success"
    written = file_name(stream_name, 0, 0, 9, "parquet")
    assert [Path(f["path"]).name for f in result["files"]] == [written]
    assert sorted(os.listdir(tmp_path)) == sorted([written, *others])
    assert {(tmp_path / name).read_bytes() for name in others} == {b"left over"}
