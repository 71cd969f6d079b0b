"""The publish operators' ``compression`` and the write statistics in their XCom summaries."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.client.compression import COMPRESSION_HEADER
from airflow_provider_liftbridge.client.exactly_once import SEQ_HEADER
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators import helpers
from tests.operators.helpers import read_all
from tests.raw_read import stored_messages

pytestmark = pytest.mark.usefixtures("liftbridge_conn")
RECORDS = [{"id": i, "customer": f"customer-{i}", "status": "shipped", "note": "fragile " * 10} for i in range(30)]


def _spy_on_info_log(op: object, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The task logger's INFO lines of ``op`` (outside a task runner Airflow does not print them):
    a wrapper that records each call and passes it on to the real logger."""
    real, lines = op.log, []  # type: ignore[attr-defined]

    class Recorder:
        def __getattr__(self, name: str) -> object:
            return getattr(real, name)

        def info(self, msg: str, *args: object) -> None:
            lines.append(msg % args)
            real.info(msg, *args)

    monkeypatch.setattr(type(op), "log", property(lambda self: Recorder()))
    return lines


def _check_stats(stats: dict[str, object], acks: int) -> None:
    json.dumps(stats)
    assert stats["acks"] == acks and stats["records_per_second"] > 0  # type: ignore[operator]
    for key in ("to_leader_ms", "to_commit_ms"):
        lat = stats[key]
        assert set(lat) == {"p50", "p99", "max"} and 0 <= lat["p50"] <= lat["p99"] <= lat["max"]  # type: ignore[index]


@pytest.mark.parametrize(("path", "codec"), [("grpc", "gzip"), ("nats", "zstd")])
def test_records_are_compressed_and_read_back_whole(
    path: str, codec: str, stream_name: str, liftbridge_client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    op = LiftbridgePublishOperator(
        task_id="p",
        stream=stream_name,
        records=RECORDS,
        options=PublishOptions(path=path, compression=codec),
        batch_size=8,
    )
    logged = _spy_on_info_log(op, monkeypatch)
    summary = op.execute({})
    _check_stats(summary["write_stats"], len(RECORDS))
    assert summary["count"] == summary["acknowledged"] == len(RECORDS)
    assert summary["write_stats"]["bytes"] < sum(len(json.dumps(r)) for r in RECORDS)  # compressed values
    lines = [line for line in logged if "Write statistics" in line]
    assert len(lines) == 1 and "publish->leader ms p50" in lines[0] and "publish->commit" in lines[0]
    assert [json.loads(m.value) for m in read_all(liftbridge_client, stream_name)] == RECORDS


def test_file_operator_compresses_rows_and_reports_stats(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    data = tmp_path / "orders.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    op = LiftbridgePublishFileOperator(
        task_id="f", stream=stream_name, path=str(data), options=PublishOptions(compression="gzip")
    )
    summary = op.execute({})
    _check_stats(summary["write_stats"], len(RECORDS))
    assert summary["files"][0]["count"] == len(RECORDS)
    messages = read_all(liftbridge_client, stream_name)
    assert [json.loads(m.value) for m in messages] == RECORDS
    assert all(COMPRESSION_HEADER not in m.headers and m.headers["file"] for m in messages)


def test_compression_arguments_are_checked_when_the_dag_is_parsed() -> None:
    with pytest.raises(InvalidArgumentError, match="'gzip', 'zstd' or None"):
        LiftbridgePublishOperator(task_id="p", stream="s", records=[], options=PublishOptions(compression="lz4"))


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.parametrize(("path", "codec"), [("nats", "gzip"), ("grpc", "zstd")])
def test_exactly_once_with_compression_resumes_a_failed_try(
    path: str, codec: str, stream_name: str, liftbridge_client: LiftbridgeClient, lb_address: str
) -> None:
    """A DAG run whose exactly-once, compressed publish dies midway on its first try: the retry
    skips the rows the first try stored (recognised by their headers, values compressed) and
    writes the rest; every row is in the stream once, compressed, and reads back whole."""
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name)
    helpers.TRIES["count"] = 0
    rows, fail_at, window = 30, 20, 8
    with DAG(f"eo_compressed_{stream_name}", schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)) as dag:
        LiftbridgePublishOperator(
            task_id="publish",
            stream=stream_name,
            records_callable="tests.operators.helpers.records_failing_first_try",
            records_callable_kwargs={"n": rows, "fail_at": fail_at},
            exactly_once=True,
            options=PublishOptions(path=path, compression=codec),
            batch_size=window,
            retries=1,
            retry_delay=dt.timedelta(seconds=0),
        )
    register_dag(dag)
    dag_run = dag.test()
    assert str(dag_run.state) == "success" and helpers.TRIES["count"] == 2
    summary = xcom_of(dag_run, "publish")
    stored_first = fail_at // window * window  # whole windows sent before the source failed
    assert (summary["skipped"], summary["written"], summary["count"]) == (stored_first, rows - stored_first, rows)
    # The exactly-once publisher sends through the operator's own publisher, so its statistics
    # cover what the retry wrote.
    _check_stats(summary["write_stats"], rows - stored_first)
    messages = read_all(liftbridge_client, stream_name)
    assert [m.headers[SEQ_HEADER] for m in messages] == [b"%d" % i for i in range(rows)]  # once each, in order
    assert [json.loads(m.value)["row"] for m in messages] == list(range(rows))  # decompressed
    raw = stored_messages(lb_address, stream_name)
    assert len(raw) == rows and all(m.headers[COMPRESSION_HEADER] == codec.encode() for m in raw)
    assert not any(m.value.startswith(b"{") for m in raw)
