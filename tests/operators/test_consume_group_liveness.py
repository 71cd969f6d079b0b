"""The consume operator's group mode keeps its member in the group while its batch function runs
longer than the server's member timeout (client/liveness.py, docs/consumer-groups.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from tests.airflow_support import conn_env_name, liftbridge_conn_json
from tests.operators import consume_support as support
from tests.operators.test_consume_operator import publish, run_dag

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(180)]
GROUPS_LOG = "airflow_provider_liftbridge.devserver.groups"
#: Seconds without a heartbeat after which the server removes a member (the keeper's come every second).
MEMBER_TIMEOUT = 3.0
#: Seconds the batch function takes per batch.
SLOW_BATCH = 4.0


@pytest.fixture
def groups_server() -> Iterator[DevServer]:
    """A one-broker dev server that times a member out after :data:`MEMBER_TIMEOUT` seconds."""
    with DevServer(brokers=1, groups_consumer_timeout=MEMBER_TIMEOUT, groups_coordinator_timeout=MEMBER_TIMEOUT) as s:
        yield s


def test_a_batch_function_slower_than_the_member_timeout_keeps_the_tasks_partition(
    groups_server: DevServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stream_name: str
) -> None:
    """Each batch takes longer than the member timeout: the task's member and the other member stay
    in the group (the server never times one out), each reads its own partition, nothing twice."""
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(groups_server.address))
    caplog.set_level(logging.INFO, logger=GROUPS_LOG)
    group = f"g-{stream_name}"
    with LiftbridgeClient(groups_server.address, timeout=5.0) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        publish(client, stream_name, 4, partition=0)
        publish(client, stream_name, 4, partition=1)
        support.reset(sleep=SLOW_BATCH)
        with client.group_consumer(group, [stream_name], auto_commit_interval=None) as other:
            dag_run, result = run_dag(
                stream_name,
                cursor_id=None,
                group_id=group,
                apply_function_batch="tests.operators.consume_support.slow_batch",
                max_batch_size=2,
                retries=0,
            )
            kept = other.check_assignments()[stream_name]
        timed_out = [
            r.getMessage()
            for r in caplog.records
            if r.name == GROUPS_LOG and f"timed out of group {group}" in r.getMessage()
        ]
        assert timed_out == []
        assert str(dag_run.state) == "success"
        (mine,) = (int(p) for p in result["partitions"])
        assert kept == [1 - mine]  # the other member kept its partition all along
        report = result["partitions"][str(mine)]
        assert report["processed"] == 4 and "moved_away" not in report
        assert support.BATCHES == [[0, 1], [2, 3]]
        assert client.fetch_cursor(f"__group:{group}", stream_name, mine) == 3


def test_max_poll_interval_is_checked_when_the_dag_is_parsed() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="max_poll_interval"):
        LiftbridgeConsumeOperator(
            task_id="c",
            stream="s",
            group_id="g",
            apply_function="tests.operators.consume_support.record",
            max_poll_interval=0,
        )
    op = LiftbridgeConsumeOperator(
        task_id="c",
        stream="s",
        group_id="g",
        apply_function="tests.operators.consume_support.record",
        max_poll_interval=None,
    )
    assert op.max_poll_interval is None  # never leaves for a slow batch
