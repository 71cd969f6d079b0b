"""The consume operator's group mode keeps its member in the group while its batch function runs
longer than the server's member timeout (client/liveness.py, docs/consumer-groups.md)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import ConsumerGroup
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


def test_a_batch_function_slower_than_the_member_timeout_keeps_the_tasks_partitions(
    groups_server: DevServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, stream_name: str
) -> None:
    """Each batch takes longer than the member timeout: the task's member stays in the group (the
    server never times it out, it joins once), reads its partitions once each, in its batches.

    The task's member is the group's only one: a second member in the test's process would have to
    stay in the group through ``dag.test()``'s set-up too, which keeps this process from running for
    seconds at a time on a loaded machine (docs/testing.md); two members are the client test's
    (``tests/client/test_consumer_liveness.py``)."""
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(groups_server.address))
    caplog.set_level(logging.INFO, logger=GROUPS_LOG)
    group = f"g-{stream_name}"
    with LiftbridgeClient(groups_server.address, timeout=5.0) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        publish(client, stream_name, 4, partition=0)
        publish(client, stream_name, 2, partition=1)
        support.reset(sleep=SLOW_BATCH)
        dag_run, result = run_dag(
            stream_name,
            read=ConsumerGroup(group),
            apply_function_batch="tests.operators.consume_support.slow_batch",
            batch_size=2,
            retries=0,
        )
        said = [m for r in caplog.records if r.name == GROUPS_LOG and f"group {group} " in (m := r.getMessage() + " ")]
        assert [m for m in said if "timed out of" in m] == []
        assert len([m for m in said if " joined " in m]) == 1  # never out of the group, never back in
        assert str(dag_run.state) == "success"
        assert {p: r["processed"] for p, r in result["partitions"].items()} == {"0": 4, "1": 2}
        assert not any("moved_away" in r for r in result["partitions"].values())
        assert sorted(support.BATCHES) == [[0, 1], [0, 1], [2, 3]]  # three batches, each of SLOW_BATCH s
        assert [client.fetch_cursor(f"__group:{group}", stream_name, p) for p in (0, 1)] == [3, 1]


def test_max_poll_interval_is_checked_when_the_dag_is_parsed() -> None:
    with pytest.raises(LiftbridgeArgumentError, match="max_poll_interval"):
        LiftbridgeConsumeOperator(
            task_id="c",
            stream="s",
            read=ConsumerGroup("g", max_poll_interval=0),
            apply_function="tests.operators.consume_support.record",
        )
    op = LiftbridgeConsumeOperator(
        task_id="c",
        stream="s",
        read=ConsumerGroup("g", max_poll_interval=None),
        apply_function="tests.operators.consume_support.record",
    )
    assert op.read.max_poll_interval is None  # never leaves for a slow batch


def test_a_batch_back_after_max_poll_interval_commits_nothing_and_the_retry_reads_on(
    groups_server: DevServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    stream_name: str,
) -> None:
    """The second batch comes back only after the task's member left the group (the batch function
    waits for the server's log of the leave, not for a time): that batch
    is not committed, the try fails naming max_poll_interval, and the retry reads on from the
    committed position (the batch in hands is processed again, as docs/consumer-groups.md says).
    Before the fix the late batch was committed and the try went on as if it were still a member.

    ``max_poll_interval`` is 4 s: the hand-over wait before the first batch (1.5 s) counts as time
    away too, and must not reach it."""
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(groups_server.address))
    caplog.set_level(logging.INFO, logger=GROUPS_LOG)
    group = f"g-{stream_name}"

    def leaves() -> int:
        said = [r.getMessage() for r in caplog.records if r.name == GROUPS_LOG]
        return sum(m.endswith(f" group {group}") and (" left " in m or " timed out of " in m) for m in said)

    with LiftbridgeClient(groups_server.address, timeout=5.0) as client:
        client.create_stream(stream_name, stream_name)
        publish(client, stream_name, 4)
        support.reset(slow_from=2, leaves=leaves)
        dag_run, result = run_dag(
            stream_name,
            read=ConsumerGroup(group, max_poll_interval=4.0),
            apply_function_batch="tests.operators.consume_support.batch_back_after_leaving",
            batch_size=2,
        )
        assert str(dag_run.state) == "success"  # the retry
        # try 1: [0, 1] committed, [2, 3] back too late (not committed); try 2 from offset 2.
        assert support.BATCHES == [[1, 0, 1], [1, 2, 3], [2, 2, 3]]
        assert result["partitions"]["0"]["first_offset"] == 2 and result["partitions"]["0"]["processed"] == 2
        assert client.fetch_cursor(f"__group:{group}", stream_name, 0) == 3
    task_log = capsys.readouterr().out  # dag.test() writes the task's log, its failure included, to stdout
    assert "MaxPollIntervalExceededError" in task_log and "max_poll_interval=4.0 s" in task_log
    assert "a retry of this task reads on from the group's committed position" in task_log
