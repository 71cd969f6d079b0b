"""The Spark publishing operator's transport tuning is one ``options=PublishOptions(...)`` value,
as on the other publishing operators, and it reaches the executors (separate worker processes of
the standalone test cluster, which get it serialised with each Spark task). The removed keywords
are refused naming the replacement (tests/operators/test_publishing_names.py)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from airflow_provider_liftbridge.client import AckPolicy, KeyPartitioner, PublishOptions
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.spark import SparkPublishError
from airflow_provider_liftbridge.spark.sources import DataFrameSource
from tests.airflow_support import conn_env_name, liftbridge_conn_json
from tests.raw_read import stored_messages

pytestmark = pytest.mark.spark


def _operator(rows: int = 10, **kwargs: Any) -> LiftbridgeSparkPublishOperator:
    source = DataFrameSource(dataframe_callable="tests.spark.helpers.orders", callable_kwargs={"rows": rows})
    return LiftbridgeSparkPublishOperator(task_id="publish", source=source, **kwargs)


# -- the value the executors get (no Spark) ---------------------------------------------------


def test_options_is_the_one_home_of_the_transport_tuning() -> None:
    given = PublishOptions(path="grpc", window=8, timeout=2.5, compression="gzip", ack_policy=AckPolicy.ALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new way warns about nothing
        op = _operator(stream="s", options=given)
    assert op.publish_options() == given
    # Unset: the connection's ack policy and timeout (filled in by the plan), the plan's window.
    assert _operator(stream="s").publish_options() == PublishOptions()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (PublishOptions(partition=1), "not options.partition"),
        (PublishOptions(partitioner=KeyPartitioner()), "not options.partitioner"),
        (PublishOptions(resend=NO_RESEND), "not options.resend"),
        ({"window": 8}, "a PublishOptions value is required"),
    ],
)
def test_options_the_operator_cannot_honour_are_refused_when_the_dag_is_parsed(options: object, words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        _operator(stream="s", options=options)


# -- on the executors -------------------------------------------------------------------------


def test_compression_from_options_is_applied_on_the_executors(
    spark: SparkSession, lb_address: str, make_stream: Callable[[int], str], liftbridge_conn: str
) -> None:
    stream = make_stream(1)
    summary = _operator(40, stream=stream, options=PublishOptions(compression="gzip", window=4)).execute({})
    assert summary["count"] == 40
    stored = stored_messages(lb_address, stream)
    assert len(stored) == 40
    assert all(m.headers["content-encoding"] == b"gzip" and not m.value.startswith(b"{") for m in stored)


@pytest.fixture
def brokerless_nats() -> Iterator[str]:
    """A NATS server no Liftbridge broker listens on: what is published there is never acknowledged."""
    proc = NatsServerProcess()
    proc.start()
    try:
        yield proc.url
    finally:
        proc.stop()


def test_the_ack_timeout_reaches_the_executors(
    spark: SparkSession,
    lb_address: str,
    brokerless_nats: str,
    make_stream: Callable[[int], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream is looked up over gRPC, the rows go to a NATS server no broker reads, so each
    executor waits its ack timeout: 1 s from the operator, not the connection's 60 s."""
    monkeypatch.setenv(
        conn_env_name("liftbridge_default"), liftbridge_conn_json(lb_address, nats_url=brokerless_nats, timeout=60)
    )
    stream = make_stream(1)
    op = _operator(20, stream=stream, options=PublishOptions(path="nats", timeout=1.0))
    with pytest.raises(SparkPublishError) as caught:
        op.execute({})
    assert "AckTimeoutError" in str(caught.value) and caught.value.acked_rows == 0, caught.value
    # Each executor names the wait it gave up after (not the elapsed time: at load 34 the whole
    # job took 66 s with 1 s waits).
    assert str(caught.value).count("within 1 s") == 2, caught.value
    assert "within 60 s" not in str(caught.value), caught.value
