"""The Spark publishing operator's transport tuning is one ``options=PublishOptions(...)`` value,
as on the other publishing operators, and it reaches the executors (separate worker processes of
the standalone test cluster, which get it serialised with each Spark task). The old keywords
(``window``, ``publish_timeout``, ``compression``) still work and warn, naming the replacement."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning
from pyspark.sql import SparkSession

from airflow_provider_liftbridge.client import AckPolicy, KeyPartitioner, PublishOptions
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
from airflow_provider_liftbridge.spark import SparkPublishError
from tests.airflow_support import conn_env_name, liftbridge_conn_json
from tests.raw_read import stored_messages

pytestmark = pytest.mark.spark


def _operator(**kwargs: object) -> LiftbridgeSparkPublishOperator:
    kwargs.setdefault("dataframe_callable", "tests.spark.helpers.orders")
    return LiftbridgeSparkPublishOperator(task_id="publish", **kwargs)  # type: ignore[arg-type]


# -- the value the executors get (no Spark) ---------------------------------------------------


def test_options_is_the_one_home_of_the_transport_tuning() -> None:
    given = PublishOptions(path="grpc", window=8, timeout=2.5, compression="gzip", ack_policy=AckPolicy.ALL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new way warns about nothing
        op = _operator(stream="s", options=given)
    assert op.publish_options() == given
    # Unset: the connection's ack policy and timeout (filled in by the plan), the plan's window.
    assert _operator(stream="s").publish_options() == PublishOptions()
    # The operator's ack_policy wins where it is set, as on the other publishing operators.
    assert _operator(stream="s", options=given, ack_policy="leader").publish_options().ack_policy is AckPolicy.LEADER


@pytest.mark.parametrize(
    ("keyword", "value", "field"),
    [("window", 8, "window"), ("publish_timeout", 2.5, "timeout"), ("compression", "gzip", "compression")],
)
def test_the_old_keywords_still_work_and_warn_naming_the_replacement(keyword: str, value: object, field: str) -> None:
    with pytest.warns(AirflowProviderDeprecationWarning, match=f"use options=PublishOptions\\({field}=\\.\\.\\.\\)"):
        op = _operator(stream="s", options=PublishOptions(window=64, timeout=9.0), **{keyword: value})
    assert getattr(op.publish_options(), field) == value  # the keyword wins over options


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (PublishOptions(partition=1), "takes no options.partition"),
        (PublishOptions(partitioner=KeyPartitioner()), "takes no options.partitioner"),
        (PublishOptions(resend=NO_RESEND), "takes no options.resend"),
        ({"window": 8}, "a PublishOptions value is required"),
    ],
)
def test_options_the_operator_cannot_honour_are_refused_when_the_dag_is_parsed(options: object, words: str) -> None:
    with pytest.raises(LiftbridgeArgumentError, match=words):
        _operator(stream="s", options=options)


def test_a_bad_old_keyword_is_still_named_as_written() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="publish_timeout=-1"):
        _operator(stream="s", publish_timeout=-1)


# -- on the executors -------------------------------------------------------------------------


def test_compression_from_options_is_applied_on_the_executors(
    spark: SparkSession, lb_address: str, make_stream: Callable[[int], str], liftbridge_conn: str
) -> None:
    stream = make_stream(1)
    summary = _operator(
        stream=stream, callable_kwargs={"rows": 40}, options=PublishOptions(compression="gzip", window=4)
    ).execute({})
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


@pytest.mark.parametrize("how", ["options", "deprecated keyword"])
def test_the_ack_timeout_reaches_the_executors(
    spark: SparkSession,
    lb_address: str,
    brokerless_nats: str,
    make_stream: Callable[[int], str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The stream is looked up over gRPC, the rows go to a NATS server no broker reads, so each
    executor waits its ack timeout: 1 s from the operator, not the connection's 60 s."""
    monkeypatch.setenv(
        conn_env_name("liftbridge_default"), liftbridge_conn_json(lb_address, nats_url=brokerless_nats, timeout=60)
    )
    stream = make_stream(1)
    if how == "options":
        op = _operator(stream=stream, callable_kwargs={"rows": 20}, options=PublishOptions(path="nats", timeout=1.0))
    else:
        with pytest.warns(AirflowProviderDeprecationWarning, match="publish_timeout is deprecated"):
            op = _operator(
                stream=stream, callable_kwargs={"rows": 20}, options=PublishOptions(path="nats"), publish_timeout=1.0
            )
    started = time.monotonic()
    with pytest.raises(SparkPublishError) as caught:
        op.execute({})
    elapsed = time.monotonic() - started
    assert "AckTimeoutError" in str(caught.value) and caught.value.acked_rows == 0, caught.value
    assert elapsed < 30, f"the executors waited {elapsed:.1f} s: the connection's timeout, not the operator's"
