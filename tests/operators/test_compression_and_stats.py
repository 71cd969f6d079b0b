"""The publish operators' ``compression`` and the write statistics in their XCom summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.compression import COMPRESSION_HEADER
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from tests.operators.helpers import read_all

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
        task_id="p", stream=stream_name, records=RECORDS, publish_path=path, compression=codec, window=8
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
    op = LiftbridgePublishFileOperator(task_id="f", stream=stream_name, path=str(data), compression="gzip")
    summary = op.execute({})
    _check_stats(summary["write_stats"], len(RECORDS))
    assert summary["files"][0]["count"] == len(RECORDS)
    messages = read_all(liftbridge_client, stream_name)
    assert [json.loads(m.value) for m in messages] == RECORDS
    assert all(COMPRESSION_HEADER not in m.headers and m.headers["file"] for m in messages)


def test_compression_arguments_are_checked_when_the_dag_is_parsed() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="'gzip', 'zstd' or None"):
        LiftbridgePublishOperator(task_id="p", stream="s", records=[], compression="lz4")
    with pytest.raises(LiftbridgeArgumentError, match="exactly_once"):
        LiftbridgePublishOperator(task_id="p", stream="s", records=[], compression="gzip", exactly_once=True)
