"""LiftbridgeConsumeOperator through real DAG runs (``dag.test()``) against the dev server:
planned ranges across retries and runs, commit cadences, dead letters, bad input."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import plan_cursor_ids, run_tag
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators import consume_support as support

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(120)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def make_dag(stream: str, **op_kwargs: Any) -> Any:
    """One registered DAG with one consume task (retried once, at once)."""
    from airflow.sdk import DAG

    op_kwargs.setdefault("cursor_id", "c")
    with DAG(f"consume_{stream}_{uuid.uuid4().hex[:6]}", schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator(
            task_id="consume", stream=stream, retries=1, retry_delay=dt.timedelta(seconds=0), **op_kwargs
        )
    register_dag(dag)
    return dag


def run(dag: Any) -> tuple[Any, Any]:
    """Run ``dag`` once (a new run each time); return (run, the consume task's XCom)."""
    dag_run = dag.test()
    return dag_run, xcom_of(dag_run, "consume")


def run_dag(stream: str, **op_kwargs: Any) -> tuple[Any, Any]:
    return run(make_dag(stream, **op_kwargs))


def publish(client: LiftbridgeClient, stream: str, n: int, start: int = 0, partition: int = 0) -> None:
    client.publish_many(stream, [json.dumps({"n": i}).encode() for i in range(start, start + n)], partition=partition)


def test_consume_end_to_end_with_args_and_a_second_run(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    publish(liftbridge_client, stream_name, 5, partition=0)
    publish(liftbridge_client, stream_name, 3, partition=1)
    support.reset()
    kwargs = dict(
        apply_function="tests.operators.consume_support.record",
        apply_function_args=["t"],
        apply_function_kwargs={"suffix": "!"},
        max_batch_size=2,
    )
    dag_run, result = run_dag(stream_name, **kwargs)
    assert str(dag_run.state) == "success"
    assert sorted(o for _, o, _ in support.SEEN) == [0, 0, 1, 1, 2, 2, 3, 4]
    assert result["processed"] == 8 and result["dead_lettered"] == 0
    assert result["partitions"]["0"] | {} == {
        "first_offset": 0,
        "last_offset": 4,
        "processed": 5,
        "dead_lettered": 0,
        "committed": 4,
        "plan_end": 5,
        "resumed": False,
        "lag": 0,
    }
    assert liftbridge_client.fetch_cursor("c", stream_name, 1) == 2
    # A second DAG (another task) with the same cursor goes on where the first stopped.
    publish(liftbridge_client, stream_name, 2, start=5, partition=0)
    support.reset()
    _, result = run_dag(stream_name, **kwargs)
    assert [(o, json.loads(v)["n"]) for _, o, v in support.SEEN] == [(5, 5), (6, 6)]
    assert result["partitions"]["1"]["processed"] == 0


def test_retry_resumes_at_the_failed_message_and_reads_only_the_plan(
    stream_name: str, liftbridge_client: LiftbridgeClient, lb_address: str
) -> None:
    """Try 1 fails at offset 3 (after messages arrived beyond the plan): the position stays at 2;
    try 2 reads 3..4 only; the next run reads what arrived after the plan."""
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 5)
    support.reset(fail_at=3, publish_more=(lb_address, stream_name, 4))
    dag = make_dag(stream_name, apply_function="tests.operators.consume_support.fail_at_offset", max_batch_size=2)
    dag_run, result = run(dag)
    assert str(dag_run.state) == "success"
    assert [(t, o) for t, o, _ in support.SEEN] == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 3), (2, 4)]
    assert result["partitions"]["0"] == {
        "first_offset": 3,
        "last_offset": 4,
        "processed": 2,
        "dead_lettered": 0,
        "committed": 4,
        "plan_end": 5,
        "resumed": True,
        "lag": 4,
    }
    end_id, tag_id = plan_cursor_ids("c", f"{dag.dag_id}/consume")
    assert liftbridge_client.fetch_cursor(end_id, stream_name, 0) == 5
    assert liftbridge_client.fetch_cursor(tag_id, stream_name, 0) == run_tag(dag_run.run_id)
    support.reset()
    dag_run, result = run(dag)  # a new run: plans afresh from the position
    assert [(o, v) for _, o, v in support.SEEN] == [(5 + i, b"late-%d" % i) for i in range(4)]
    assert result["partitions"]["0"]["resumed"] is False and result["partitions"]["0"]["committed"] == 8
