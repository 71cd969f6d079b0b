"""Exactly-once publishing never reports success over a replaced history it can see (issue 59; seed
59919 in docs/reliability.md).

On Liftbridge v1.9.0-72 a follower cut to a lagging high watermark can be elected: records
acknowledged with ack policy ALL go, and a resumption that read the old history sends records
again into the new one. The dev cluster cannot do that by itself; its test hook
``replace_history`` models it (docs/devserver.md, "A replaced history"): a follower cuts its log
after an offset, committed records included, and leads at once.

- With ack policy ALL, a log found shorter than what the publisher saw committed, or an ack at
  such an offset, fails the call (``TruncatedLogError``);
- once a call saw a partition's leader change, it reads its records again before it returns, and
  a record counted as stored that is missing fails it (``HistoryMismatchError``).

Before either, each of these calls returned success with 50 acknowledged records gone.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, StartPosition, StopPosition
from airflow_provider_liftbridge.client.exactly_once import (
    PRODUCER_HEADER,
    SEQ_HEADER,
    ExactlyOncePublisher,
    HistoryMismatchError,
    TruncatedLogError,
)
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.devserver import DevServer
from tests.margins import wait_until

pytestmark = [pytest.mark.timeout(300)]

FIRST, KEEP_TO = 100, 49  # records of the first call; the follower keeps offsets up to KEEP_TO


def _values(first: int, count: int) -> list[bytes]:
    return [f"r{i:05d}".encode() for i in range(first, first + count)]


def _follower_and_leader(cluster: DevServer, client: LiftbridgeClient, stream: str) -> tuple[int, int]:
    """The indices of a follower of partition 0 and of its leader, once the first call's records
    are committed (on every replica)."""
    wait_until(
        lambda: client.fetch_partition_metadata(stream, 0).high_watermark == FIRST - 1,
        60.0,
        "the first call's records committed",
        interval=0.05,
    )
    part = client.fetch_metadata([stream]).streams[stream].partitions[0]
    follower = next(r for r in part.replicas if r != part.leader)
    return cluster.broker_ids.index(follower), cluster.broker_ids.index(part.leader)


def _seqs(client: LiftbridgeClient, stream: str, producer: str) -> Counter[int]:
    stored = client.subscribe(stream, partition=0, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
    return Counter(int(m.headers[SEQ_HEADER]) for m in stored if m.headers.get(PRODUCER_HEADER) == producer.encode())


def _publisher(client: LiftbridgeClient, stream: str, policy: AckPolicy) -> ExactlyOncePublisher:
    options = PublishOptions(ack_policy=policy, path="grpc", timeout=5.0)
    return ExactlyOncePublisher(client, stream, "replaced", options=options, tail_wait=60.0)


@pytest.mark.parametrize("occ", [True, False], ids=["occ-refused-then-read", "ack-below-committed"])
def test_under_ack_all_a_log_shorter_than_what_was_committed_fails_the_call(
    fast_cluster: DevServer, stream_name: str, occ: bool
) -> None:
    with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3, optimistic_concurrency_control=occ)
        with _publisher(client, stream_name, AckPolicy.ALL) as publisher:
            assert publisher.publish(_values(0, FIRST)).written == FIRST  # offsets 0..99, committed
            follower, _ = _follower_and_leader(fast_cluster, client, stream_name)
            assert fast_cluster.replace_history(stream_name, 0, follower, KEEP_TO) == FIRST - KEEP_TO - 1
            # With OCC the send expecting offset 100 is refused and the resumption reads the new
            # leader's shorter log; without, the new leader acknowledges records at offsets 50-149.
            with pytest.raises(TruncatedLogError) as caught:
                publisher.publish(_values(FIRST, FIRST))
        stored = _seqs(client, stream_name, "replaced")
    error = caught.value
    # Every record the error does not count as written is not stored: each ack is counted
    # before the breach is raised (it stopped at the first ack below a committed offset).
    assert error.result.written == sum(1 for seq in stored if seq >= FIRST)
    assert error.result.written == (0 if occ else FIRST)
    assert error.partition == 0 and error.committed_offset == FIRST - 1
    assert error.newest_offset == (KEEP_TO if occ else KEEP_TO + 1)
    assert (error.missing, error.twice) == (FIRST - KEEP_TO - 1, 0)  # offsets 50-99 lost their records
    text = str(error)
    assert f"stream {stream_name!r}" in text and "partition 0" in text and "Nothing more was sent" in text


def _grow_and_kill_the_old_leader(cluster: DevServer, client: LiftbridgeClient, stream: str, others: int) -> None:
    """The follower leads with a history cut after KEEP_TO, another producer adds ``others``
    records, and the old leader (the publisher's cached leader) dies: the next send fails and its
    resumption reads the partition at the new leader."""
    follower, leader = _follower_and_leader(cluster, client, stream)
    cluster.replace_history(stream, 0, follower, KEEP_TO)
    client.publish_many(stream, _values(10_000, others), ack_policy=AckPolicy.ALL)
    cluster.kill_broker(leader)


@pytest.mark.parametrize(
    ("policy", "others"),
    # LEADER: the shorter log is the documented loss of LEADER acks, only logged by the scan.
    # ALL: the new leader's log has grown past what the publisher saw before it reads it (59919).
    [(AckPolicy.LEADER, 0), (AckPolicy.ALL, 60)],
    ids=["leader-acks", "all-acks-log-grown-back"],
)
def test_a_call_that_saw_the_leader_change_reads_its_records_again_and_fails_on_a_missing_one(
    fast_cluster: DevServer, stream_name: str, policy: AckPolicy, others: int
) -> None:
    with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3)
        with _publisher(client, stream_name, policy) as publisher:
            assert publisher.publish(_values(0, FIRST)).written == FIRST
            _grow_and_kill_the_old_leader(fast_cluster, client, stream_name, others)
            with pytest.raises(HistoryMismatchError) as caught:
                publisher.publish(_values(FIRST, FIRST))
        stored = _seqs(client, stream_name, "replaced")
    error = caught.value
    gone = set(range(KEEP_TO + 1, FIRST))
    assert gone.isdisjoint(stored) and len(stored) == 2 * FIRST - len(gone)  # what the call could not see
    assert (error.missing, error.twice) == (len(gone), 0)
    assert error.result.written == FIRST  # the second call's records: each sent and acknowledged once
    text = str(error)
    assert f"found {len(gone)} sequence number(s) counted as stored missing and 0 stored twice" in text


def test_a_call_that_saw_the_leader_change_and_lost_nothing_returns_after_reading_again(
    fast_cluster: DevServer, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An ordinary failover: the read after it finds every record once, and the call returns.
    caplog.set_level(logging.INFO, logger="airflow_provider_liftbridge.client.exactly_once")
    with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3)
        with _publisher(client, stream_name, AckPolicy.ALL) as publisher:
            assert publisher.publish(_values(0, FIRST)).written == FIRST
            _, leader = _follower_and_leader(fast_cluster, client, stream_name)
            fast_cluster.kill_broker(leader)
            assert publisher.publish(_values(FIRST, FIRST)).written == FIRST
        assert _seqs(client, stream_name, "replaced") == Counter(range(2 * FIRST))
    (line,) = [r.getMessage() for r in caplog.records if "read its records again" in r.getMessage()]
    assert line.endswith(f"(partition 0 offsets 0-{2 * FIRST - 1}): 0 missing, 0 twice")


@pytest.mark.usefixtures("airflow_db")
def test_an_operator_task_that_finds_a_replaced_history_fails_without_airflow_retries(
    fast_cluster: DevServer, stream_name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 59919 on dc61f12: the retry of a try that raised ``HistoryMismatchError`` re-sent what
    the leader lacked, and a replica that kept the other history then held those records twice.
    A task with ``retries=2`` whose exactly-once publish meets a replaced history is failed once,
    not retried (before: ``LiftbridgePublishNotAcknowledgedError``, and Airflow retried it)."""
    from airflow.sdk import DAG

    from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
    from tests.airflow_support import conn_env_name, liftbridge_conn_json, register_dag

    from . import dag_support

    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(",".join(fast_cluster.addresses)))
    monkeypatch.setattr(dag_support, "HISTORY", {"cluster": fast_cluster, "stream": stream_name})
    with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3)
    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    with DAG(f"eo_replaced_{stream_name}", schedule=None, start_date=start) as dag:
        LiftbridgePublishOperator(
            task_id="publish",
            stream=stream_name,
            records_callable="tests.reliability.dag_support.records_replacing_history",
            records_callable_kwargs={"n": 2 * FIRST, "first": FIRST, "keep_to": KEEP_TO},
            exactly_once=True,
            options=PublishOptions(path="grpc", ack_policy="all", timeout=5.0),
            batch_size=FIRST,
            retries=2,
            retry_delay=dt.timedelta(seconds=0),
        )
    register_dag(dag)
    dag_run = dag.test()
    (ti,) = dag_run.get_task_instances()
    assert (str(dag_run.state), str(ti.state)) == ("failed", "failed")
    assert dag_support.HISTORY["tries"] == 1 and ti.try_number == 1  # no retry
    log = capsys.readouterr().out
    assert "LiftbridgeReplacedHistoryError" in log and "fails without retries" in log
    assert "TruncatedLogError" in log and "compare the partition's replicas" in log
