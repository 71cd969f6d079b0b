"""DAG-author mistakes (issue 27, point 9): where each is caught, and that the message names the
parameter, the value and the fix.

A literal value is checked in the constructor, so the DAG fails when it is parsed; a templated
one (``{{ ... }}``) when Airflow renders it, before the task does any I/O; what only the server
knows, when the task runs. The run-time cases talk to the dev server.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.argument_checks import suggest_parameter
from airflow_provider_liftbridge.client import (
    InvalidArgumentError,
    LiftbridgeClient,
    NoSuchPartitionError,
    PublishOptions,
    StreamOptions,
)
from airflow_provider_liftbridge.exceptions import (
    LiftbridgeArgumentError,
    LiftbridgeConnectionConfigError,
    LiftbridgeUnknownArgumentError,
)
from airflow_provider_liftbridge.hooks.connection import settings_from_connection
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from airflow_provider_liftbridge.operators.publishing_base import PUBLISHING_CHECKS
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.operators.stream import (
    LiftbridgeCreateStreamOperator,
    LiftbridgeDeleteStreamOperator,
    LiftbridgePauseStreamOperator,
)
from airflow_provider_liftbridge.sensors.ack import LiftbridgeAckSensor
from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
from airflow_provider_liftbridge.sensors.offset import LiftbridgeOffsetSensor
from airflow_provider_liftbridge.validation import check_headers, check_key, waits_for_rendering

MATCH = "tests.operators.test_parse_time_validation.accept"


def accept(message: Any) -> bool:
    """An apply function for the message sensor cases."""
    return True


def publish(**kwargs: Any) -> LiftbridgePublishOperator:
    return LiftbridgePublishOperator(**({"task_id": "p", "stream": "s", "records": ["x"]} | kwargs))


def create(**kwargs: Any) -> LiftbridgeCreateStreamOperator:
    return LiftbridgeCreateStreamOperator(**({"task_id": "c", "stream": "s"} | kwargs))


def message_sensor(**kwargs: Any) -> LiftbridgeMessageSensor:
    return LiftbridgeMessageSensor(**({"task_id": "m", "stream": "s", "apply_function": MATCH} | kwargs))


def offset_sensor(**kwargs: Any) -> LiftbridgeOffsetSensor:
    return LiftbridgeOffsetSensor(**({"task_id": "o", "stream": "s", "target_offset": 3} | kwargs))


#: (what, build, where it is caught, the words of the message: parameter=value ... fix)
CASES: list[tuple[str, Callable[[], Any], str, list[str]]] = [
    ("batch size 0", lambda: publish(batch_size=0), "parse", ["batch_size=0", "1 or more"]),
    ("options a dict", lambda: publish(options={"path": "grpc"}), "parse", ["options=", "PublishOptions(path="]),
    ("partitioner", lambda: publish(partitioner="random"), "parse", ["partitioner='random'", "'round_robin'"]),
    (
        "exactly-once without acks",
        lambda: publish(exactly_once=True, options=PublishOptions(ack_policy="none")),
        "parse",
        ["exactly_once=True", "ack_policy='all'"],
    ),
    (
        "placement in the options",
        lambda: publish(options=PublishOptions(partition=2)),
        "parse",
        ["not options.partition", "partition=N"],
    ),
    ("float key", lambda: publish(key=1.5), "parse", ["key=1.5", "str(value)"]),
    ("None header", lambda: publish(headers={"k": None}), "parse", ["headers['k']=None", "b''"]),
    ("string bool", lambda: publish(exactly_once="false"), "parse", ["exactly_once='false'", "exactly_once=True"]),
    ("negative partition", lambda: publish(partition=-1), "parse", ["partition=-1", "partition=0"]),
    ("no stream", lambda: create(stream=None), "parse", ["stream=None", "stream='orders'"]),
    ("empty stream", lambda: publish(stream=""), "parse", ["stream=''", "stream='orders'"]),
    ("negative partitions", lambda: create(partitions=-2), "parse", ["partitions=-2", "partitions=3"]),
    (
        "stream option as a keyword",
        lambda: create(replication_factor=3),
        "parse",
        ["replication_factor=3", "options=StreamOptions(replication_factor="],
    ),
    (
        "partitions in options",
        lambda: create(options=StreamOptions(partitions=3)),
        "parse",
        ["options=StreamOptions(partitions=3", "give partitions=N to the operator"],
    ),
    ("bad subject", lambda: create(subject="a b"), "parse", ["subject='a b'", "subject='orders.eu'"]),
    (
        "pause partitions",
        lambda: LiftbridgePauseStreamOperator(task_id="p", stream="s", partitions=[0, -1]),
        "parse",
        ["partitions=[0, -1]", "partitions=[0, 2]"],
    ),
    (
        "delete keyword",
        lambda: LiftbridgeDeleteStreamOperator(task_id="d", stream="s", fail_if_not_exists=True),
        "parse",
        ["'fail_if_not_exists'", "did you mean 'fail_if_missing'?"],
    ),
    (
        "publish keyword",
        lambda: publish(max_batch_size=100),
        "parse",
        ["'max_batch_size'", "did you mean 'batch_size'?"],
    ),
    ("sensor keyword", lambda: offset_sensor(deferable=True), "parse", ["'deferable'", "did you mean 'deferrable'?"]),
    ("start_at", lambda: message_sensor(start_at="yesterday"), "parse", ["start_at='yesterday'", "'earliest'"]),
    ("sensor stream None", lambda: message_sensor(stream=None), "parse", ["stream=None", "stream='orders'"]),
    (
        "target offset",
        lambda: offset_sensor(target_offset="latest-ish"),
        "parse",
        ["target_offset='latest-ish'", "target_offset=41"],
    ),
    (
        "offset sensor without stream",
        lambda: offset_sensor(stream=None),
        "parse",
        ["stream=None", "publish summary as target_offset"],
    ),
    (
        "deferrable timeout 0",
        lambda: offset_sensor(deferrable=True, timeout=0),
        "parse",
        ["timeout=0", "timeout=3600"],
    ),
    (
        "deferrable ack sensor timeout 0",
        lambda: LiftbridgeAckSensor(task_id="a", publish_summary={}, deferrable=True, timeout=0),
        "parse",
        ["timeout=0", "timeout=3600"],
    ),
    (
        "file format",
        lambda: LiftbridgePublishFileOperator(task_id="f", stream="s", path="x", format="xml"),
        "parse",
        ["format='xml'", "'jsonl'"],
    ),
    (
        "no files",
        lambda: LiftbridgePublishFileOperator(task_id="f", stream="s", path=[]),
        "parse",
        ["path=[]", "path='/data/orders/*.jsonl'"],
    ),
    (
        "spark source",
        lambda: LiftbridgeSparkPublishOperator(task_id="s", stream="s", source="/in"),
        "parse",
        ["source='/in'", "DataFrameSource(table="],
    ),
    # Templated: checked by the same validator once rendered.
    ("rendered partitions", lambda: create(partitions="{{ 'x' }}"), "render", ["partitions='x'", "partitions=3"]),
    ("rendered stream", lambda: publish(stream="{{ '' }}"), "render", ["stream=''", "stream='orders'"]),
    (
        "rendered target",
        lambda: offset_sensor(target_offset="{{ 'soon' }}"),
        "render",
        ["target_offset='soon'", "target_offset=41"],
    ),
    (
        "rendered start",
        lambda: message_sensor(start_at="{{ 'yesterday' }}"),
        "render",
        ["start_at='yesterday'", "'earliest'"],
    ),
]


@pytest.mark.parametrize(("what", "build", "where", "words"), CASES, ids=[c[0] for c in CASES])
def test_mistake_is_caught_where_expected_and_named(
    what: str, build: Callable[[], Any], where: str, words: list[str]
) -> None:
    if where == "parse":
        with pytest.raises(LiftbridgeArgumentError) as caught:
            build()
    else:
        op = build()  # the constructor lets a template through...
        with pytest.raises(LiftbridgeArgumentError) as caught:
            op.render_template_fields({})  # ...and the same validator checks what it rendered to
    message = str(caught.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_an_unknown_keyword_is_also_a_type_error_as_airflow_raises() -> None:
    with pytest.raises(TypeError):
        publish(max_batch_size=100)
    assert issubclass(LiftbridgeUnknownArgumentError, TypeError)
    assert suggest_parameter("nothing_like_it", ["stream", "window"]) is None


@pytest.mark.parametrize(
    ("value", "waits"),
    [("{{ ds }}", True), ("{% if x %}a{% endif %}", True), (["a", "{{ x }}"], True), ({"k": "{{ v }}"}, True)]
    + [("plain", False), (3, False), ({"k": "v"}, False), (None, False)],
)
def test_what_waits_for_rendering(value: Any, waits: bool) -> None:
    assert waits_for_rendering(value) is waits


def test_keys_and_header_values_accept_str_bytes_and_int_as_documented() -> None:
    assert check_key(123) == b"123" and check_key("k") == b"k" and check_key(b"\x00") == b"\x00"
    assert check_key(None) is None
    assert check_headers({"n": 1, "s": "x", "b": b"y"}) == {"n": b"1", "s": b"x", "b": b"y"}
    for bad in (True, 1.5, {"a": 1}):
        with pytest.raises(LiftbridgeArgumentError, match="a key is bytes, str or int"):
            check_key(bad)


@pytest.mark.parametrize(
    ("operator_keyword", "option", "bad"),
    [
        ("batch_size", "window", 0),
        ("batch_size", "window", "1.5"),
        ("partition", "partition", -1),
    ],
)
def test_the_operators_and_publish_options_share_one_check_per_option(
    operator_keyword: str, option: str, bad: Any
) -> None:
    """The publishing operators' parse-time validator of a keyword and PublishOptions' check of the
    option are one definition (client/checks.py): the same message, Airflow's error type outside."""
    with pytest.raises(LiftbridgeArgumentError) as by_operator:
        PUBLISHING_CHECKS[operator_keyword](bad, option)
    with pytest.raises(InvalidArgumentError) as by_value:
        PublishOptions(**{option: bad})
    assert str(by_operator.value) == str(by_value.value) and f"{option}={bad!r} is not valid" in str(by_value.value)
    with pytest.raises(LiftbridgeArgumentError, match=f"{operator_keyword}={bad!r} is not valid"):
        LiftbridgePublishOperator(task_id="t", stream="s", records=[], **{operator_keyword: bad})


@pytest.mark.parametrize(
    ("option", "bad", "words"),
    [
        ("ack_policy", "sometimes", "ack_policy='sometimes' is not valid"),
        ("timeout", -5, "timeout=-5 is not valid"),
        ("path", "nat", "path='nat' is not valid"),
        ("compression", "lz4", "'gzip', 'zstd' or None"),
    ],
)
def test_a_bad_publish_option_fails_where_the_dag_makes_it(option: str, bad: Any, words: str) -> None:
    """The transport's options are one value: a bad one fails when the DAG builds it, named."""
    with pytest.raises(InvalidArgumentError, match=re.escape(words)):
        publish(options=PublishOptions(**{option: bad}))


def test_replication_factor_zero_is_liftbridges_default_of_one() -> None:
    # Liftbridge reads replicationFactor 0 as "not set" and uses 1 (server/api.go CreateStream).
    assert create(options=StreamOptions(replication_factor=0)).create_options().replication_factor == 1


@pytest.mark.parametrize("url", ["nats//x", "http://h:4222", "nats://h:99999"])
def test_a_bad_nats_url_is_refused_by_the_connection_and_the_client(url: str) -> None:
    class Conn:
        conn_id, host, port, login, password, schema = "c", "127.0.0.1", 9292, None, None, None
        extra_dejson = {"nats_servers": url}

    with pytest.raises(LiftbridgeConnectionConfigError, match="NATS servers.*use nats://host:port"):
        settings_from_connection(Conn())
    with pytest.raises(InvalidArgumentError, match="nats_servers: .*use nats://host:port"):
        LiftbridgeClient("127.0.0.1:1", nats_servers=[url])


# -- caught when the task runs (the server knows) --------------------------------------------------


@pytest.mark.usefixtures("airflow_db", "liftbridge_conn")
def test_a_partition_template_fails_the_dag_run_with_the_named_message(
    stream_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.sdk import DAG

    from tests.airflow_support import register_dag

    with DAG(f"validate_{uuid.uuid4().hex[:8]}", schedule=None, start_date=dt.datetime(2024, 1, 1)) as dag:
        create(task_id="create", stream=stream_name, partitions="{{ 'x' }}")
    register_dag(dag)
    dag_run = dag.test()
    logged = capsys.readouterr().out
    assert str(dag_run.state) == "failed"
    assert "partitions='x' is not valid" in logged and "invalid literal for int()" not in logged


@pytest.mark.usefixtures("liftbridge_conn")
def test_pausing_a_missing_partition_names_the_partition(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    op = LiftbridgePauseStreamOperator(task_id="p", stream=stream_name, partitions=[1, 5])
    with pytest.raises(NoSuchPartitionError, match=r"has no partition 5: it has partitions 0 to 1; fix partitions"):
        op.execute({})


@pytest.mark.usefixtures("liftbridge_conn")
def test_a_none_record_is_refused_not_published_as_null(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    op = publish(stream=stream_name, records=["a", None], options=PublishOptions(path="grpc"))
    with pytest.raises(LiftbridgeArgumentError, match=r"records\[1\] is None; give b'' .* 'null'"):
        op.execute({})


@pytest.mark.usefixtures("liftbridge_conn")
def test_an_empty_file_is_warned_about(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    (tmp_path / "empty.jsonl").write_text("")
    op = LiftbridgePublishFileOperator(task_id="f", stream=stream_name, path=str(tmp_path / "empty.jsonl"))
    assert op.execute({})["count"] == 0
    logged = capsys.readouterr().out  # task logs go through Airflow's structlog, to stdout here
    assert "empty.jsonl holds no records" in logged and "There were no records to publish" in logged


def test_a_configured_nats_path_not_taken_is_a_warning(
    lb_address: str, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # NATS is configured but nothing listens there: the publish goes over gRPC, said at WARNING.
    with LiftbridgeClient(lb_address, nats_servers=["nats://127.0.0.1:1"]) as client:
        client.create_stream(stream_name, stream_name)
        with caplog.at_level(logging.WARNING, logger="airflow_provider_liftbridge.client"):
            assert len(client.publish_many(stream_name, [b"a", b"b"])) == 2
    assert any(r.levelno == logging.WARNING and "not NATS" in r.getMessage() for r in caplog.records)
