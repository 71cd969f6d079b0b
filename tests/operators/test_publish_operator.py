"""LiftbridgePublishOperator and the shared publishing helpers, over gRPC and NATS-direct."""

from __future__ import annotations

import json

import pytest

from airflow_provider_liftbridge.client import (
    Ack,
    BatchPublisher,
    LiftbridgeClient,
    NoSuchStreamError,
    PublishOptions,
    Record,
    partition_for_key,
)
from airflow_provider_liftbridge.exceptions import (
    LiftbridgeArgumentError,
    LiftbridgePublishNotAcknowledgedError,
)
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.records import build_record, to_bytes
from tests.operators import helpers
from tests.operators.helpers import read_all

pytestmark = pytest.mark.usefixtures("liftbridge_conn")
PATHS = ["grpc", "nats"]


@pytest.mark.parametrize("path", PATHS)
def test_inline_records_of_every_kind(path: str, stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    op = LiftbridgePublishOperator(
        task_id="p",
        stream=stream_name,
        records=[{"id": "a", "n": 1}, "text", b"\x00\xff", [1, 2], Record(b"own", key=b"k", headers={"h": b"1"})],
        key="default-key",
        headers={"source": "test"},
        options=PublishOptions(path=path),
    )
    summary = op.execute({})
    stats = summary.pop("write_stats")
    assert stats["acks"] == 5 and stats["to_commit_ms"]["max"] >= stats["to_commit_ms"]["p50"] >= 0
    assert summary == {
        "stream": stream_name,
        "count": 5,
        "acknowledged": 5,
        "ack_policy": "LEADER",
        "partitions": {"0": {"first_offset": 0, "last_offset": 4, "count": 5}},
    }
    json.dumps(summary)  # XCom-safe
    messages = read_all(liftbridge_client, stream_name)
    assert [m.value for m in messages] == [b'{"id":"a","n":1}', b"text", b"\x00\xff", b"[1,2]", b"own"]
    assert [m.key for m in messages] == [b"default-key"] * 4 + [b"k"]
    assert all(m.headers["source"] == b"test" for m in messages)
    assert messages[4].headers["h"] == b"1"


@pytest.mark.parametrize("path", PATHS)
def test_key_partitioning_matches_the_go_client(
    path: str, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=3)
    records = helpers.make_records(12)
    summary = LiftbridgePublishOperator(
        task_id="p",
        stream=stream_name,
        records=records,
        key_field="id",
        partitioner="key",
        options=PublishOptions(path=path),
    ).execute({})
    assert summary["count"] == summary["acknowledged"] == 12
    seen = 0
    for partition in range(3):
        for message in read_all(liftbridge_client, stream_name, partition):
            assert partition_for_key(message.key, 3) == partition
            seen += 1
        span = summary["partitions"].get(str(partition))
        if span:
            assert span["count"] == len(read_all(liftbridge_client, stream_name, partition))
    assert seen == 12


def test_records_from_a_callable_and_an_explicit_partition(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    summary = LiftbridgePublishOperator(
        task_id="p",
        stream=stream_name,
        records_callable="tests.operators.helpers.make_records",
        records_callable_kwargs={"n": 3, "prefix": "cb"},
        partition=1,
    ).execute({})
    assert summary["partitions"] == {"1": {"first_offset": 0, "last_offset": 2, "count": 3}}
    assert [json.loads(m.value)["id"] for m in read_all(liftbridge_client, stream_name, 1)] == ["cb-0", "cb-1", "cb-2"]


def test_records_given_as_a_json_string(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    # What "{{ ti.xcom_pull('t') | tojson }}" renders to.
    liftbridge_client.create_stream(stream_name, stream_name)
    summary = LiftbridgePublishOperator(task_id="p", stream=stream_name, records='[{"a": 1}, "b"]').execute({})
    assert summary["count"] == 2
    assert [m.value for m in read_all(liftbridge_client, stream_name)] == [b'{"a":1}', b"b"]


def test_ack_policy_none_publishes_without_offsets(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    summary = LiftbridgePublishOperator(
        task_id="p", stream=stream_name, records=["x", "y"], options=PublishOptions(path="grpc", ack_policy="none")
    ).execute({})
    assert summary == {"stream": stream_name, "count": 2, "acknowledged": 0, "ack_policy": "NONE", "partitions": {}}


@pytest.mark.parametrize("path", PATHS)
def test_refused_records_fail_the_task(path: str, stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    op = LiftbridgePublishOperator(
        task_id="p",
        stream=stream_name,
        records_callable="tests.operators.helpers.records_with_expected_offsets",
        records_callable_kwargs={"offsets": [0, 1, 7]},  # the third one is wrong: it would get offset 2
        options=PublishOptions(path=path, timeout=3),
        batch_size=1,
    )
    with pytest.raises(LiftbridgePublishNotAcknowledgedError) as info:
        op.execute({})
    assert info.value.acknowledged == 2
    assert "record #2" in str(info.value)
    assert [m.value for m in read_all(liftbridge_client, stream_name)] == [b"occ-0", b"occ-1"]


@pytest.mark.parametrize("path", ["grpc", "auto"])
def test_readonly_stream_fails_the_task(path: str, stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    # "auto" sees the read-only partition in the metadata and takes gRPC, which refuses at once
    # (NATS-direct publishes to it would be dropped without an ack).
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.set_stream_readonly(stream_name)
    with pytest.raises(LiftbridgePublishNotAcknowledgedError, match="0 acknowledged"):
        LiftbridgePublishOperator(
            task_id="p", stream=stream_name, records=["x"], options=PublishOptions(path=path)
        ).execute({})


def test_nats_path_refuses_paused_partitions_up_front(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    liftbridge_client.pause_stream(stream_name, partitions=[1])
    with pytest.raises(LiftbridgePublishNotAcknowledgedError, match=r"partition 1 is paused.*path='grpc'"):
        LiftbridgePublishOperator(
            task_id="p", stream=stream_name, records=["x"], partition=1, options=PublishOptions(path="nats")
        ).execute({})
    # A partition that is not paused takes NATS as asked.
    summary = LiftbridgePublishOperator(
        task_id="p", stream=stream_name, records=["y"], partition=0, options=PublishOptions(path="nats")
    ).execute({})
    assert summary["partitions"] == {"0": {"first_offset": 0, "last_offset": 0, "count": 1}}
    # "auto" falls back to gRPC, which resumes the paused partition.
    summary = LiftbridgePublishOperator(task_id="p", stream=stream_name, records=["x"], partition=1).execute({})
    assert summary["partitions"] == {"1": {"first_offset": 0, "last_offset": 0, "count": 1}}


@pytest.mark.parametrize("path", PATHS)
def test_missing_stream(path: str, stream_name: str) -> None:
    with pytest.raises((NoSuchStreamError, LiftbridgePublishNotAcknowledgedError)):
        LiftbridgePublishOperator(
            task_id="p", stream=stream_name, records=["x"], options=PublishOptions(path=path)
        ).execute({})


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "exactly one of records and records_callable"),
        ({"records": [], "records_callable": "x.y"}, "exactly one"),
        ({"records_callable": print}, "dotted path"),
        ({"records": ["x"], "partitioner": "random"}, "partitioner='random' is not valid: use one of 'key'"),
        ({"records": ["x"], "options": {"path": "grpc"}}, "a PublishOptions value is required"),
    ],
)
def test_bad_arguments_fail_at_parse_time(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        LiftbridgePublishOperator(task_id="p", stream="s", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"records": "not json"}, "not a JSON list"),
        ({"records": {"a": 1}}, "must be a list"),
        ({"records_callable": "tests.operators.helpers.nope"}, "records_callable"),
        (
            {"records": [{"a": 1}], "key_field": "id"},
            r"key_field='id' is not a field of this record; its fields are \['a'\]",
        ),
    ],
)
def test_bad_records_fail_the_task(stream_name: str, kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        LiftbridgePublishOperator(
            task_id="p", stream=stream_name, options=PublishOptions(path="grpc"), **kwargs
        ).execute({})  # type: ignore[arg-type]


def test_windows_bound_what_is_read_ahead(
    stream_name: str, liftbridge_client: LiftbridgeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator publishes through the client's batch publisher, ``batch_size`` records at a time,
    reading its source no further ahead than the batch being sent."""
    liftbridge_client.create_stream(stream_name, stream_name)
    helpers.PULLED["count"] = 0
    batches: list[tuple[int, int]] = []
    send = BatchPublisher.send

    def counting_send(self: BatchPublisher, records: list[Record]) -> list[Ack]:
        batches.append((len(records), helpers.PULLED["count"]))
        return send(self, records)

    monkeypatch.setattr(BatchPublisher, "send", counting_send)  # spy only: the real send runs
    op = LiftbridgePublishOperator(
        task_id="w",
        stream=stream_name,
        records_callable="tests.operators.helpers.counted_records",
        records_callable_kwargs={"n": 2500},
        batch_size=1000,
        options=PublishOptions(path="grpc"),
    )
    summary = op.execute({})
    assert summary["count"] == summary["acknowledged"] == 2500
    assert [size for size, _ in batches] == [1000, 1000, 500]
    # The source is never more than one window ahead of what was published.
    assert [pulled for _, pulled in batches] == [1000, 2000, 2500]
    assert summary["partitions"] == {"0": {"first_offset": 0, "last_offset": 2499, "count": 2500}}


def test_to_bytes_and_build_record() -> None:
    import datetime as dt
    import decimal

    assert to_bytes({"when": dt.date(2024, 1, 2), "amount": decimal.Decimal("1.50"), "raw": b"\x01"}) == (
        b'{"when":"2024-01-02","amount":"1.50","raw":"AQ=="}'
    )
    with pytest.raises(LiftbridgeArgumentError, match="cannot encode"):
        to_bytes({"x": object()})
    record = build_record({"id": 7}, key_field="id", headers={"a": "1"}, extra_headers={"b": b"2"})
    assert record.key == b"7" and dict(record.headers or {}) == {"a": b"1", "b": b"2"}
    with pytest.raises(LiftbridgeArgumentError, match="needs records that are mappings"):
        build_record("plain", key_field="id")


def test_grpc_path_stays_on_grpc_when_the_connection_knows_nats(
    stream_name: str, liftbridge_client: LiftbridgeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection lists NATS servers; options=PublishOptions(path='grpc') must still publish over
    gRPC, as its log says."""
    liftbridge_client.create_stream(stream_name, stream_name)
    with caplog.at_level("INFO", logger="airflow_provider_liftbridge.client"):
        LiftbridgePublishOperator(
            task_id="p", stream=stream_name, records=["a", "b"], options=PublishOptions(path="grpc")
        ).execute({})
    paths = [r.getMessage() for r in caplog.records if r.name.startswith("airflow_provider_liftbridge.client")]
    assert any("over gRPC PublishAsync" in m for m in paths), paths
    assert not any("NATS-direct" in m for m in paths), paths
