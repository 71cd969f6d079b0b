"""Exactly-once publishing of a Spark partition (the executor side, ``publish_partition``) against
the dev server, with real Arrow batches; no SparkSession is needed for this path. A first try that
died after one batch is resumed by the second try; a replaced history is carried to the operator,
which fails without retries. Last, the same end to end: the Spark operator in a ``dag.test()``
run, its SparkSession's task meeting a replaced history between two groups of rows."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.devserver import DevServer
from airflow_provider_liftbridge.spark import publish as spark_publish
from airflow_provider_liftbridge.spark.errors import SparkOptionError, SparkPublishError
from airflow_provider_liftbridge.spark.plan import PublishPlan
from airflow_provider_liftbridge.spark.publish import check_between_tasks, merge_summaries, publish_partition
from airflow_provider_liftbridge.spark.settings import ConnectionSettings
from tests.margins import wait_until

from .scenarios import count, read_stream, values


def _batches(rows: list[bytes], size: int) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"value": rows[i : i + size]}) for i in range(0, len(rows), size)]


@pytest.mark.parametrize("path", ["grpc", "nats"])
def test_spark_partition_resumes_after_a_dead_try(
    liftbridge_client: LiftbridgeClient, stream_name: str, lb_address: str, nats_url: str, path: str
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    plan = PublishPlan(stream=stream_name, value_col="value", partitioner="round_robin", partitions=2)
    settings = ConnectionSettings(brokers=(lb_address,), nats_servers=(nats_url,) if path == "nats" else ())
    rows = values(900)
    batches = _batches(rows, 200)
    first = publish_partition(batches[:2], plan, settings, spark_partition=3, producer_id="dag/t/run")
    assert (first["rows"], first["skipped"], first["error"]) == (400, 0, None)
    retry = publish_partition(batches, plan, settings, spark_partition=3, producer_id="dag/t/run")
    assert (retry["rows"], retry["skipped"], retry["error"]) == (500, 400, None)
    totals = merge_summaries(stream_name, AckPolicy.LEADER, [retry], 1.0, producer_id="dag/t/run")
    assert (totals.count, totals.written, totals.skipped) == (900, 500, 400)
    in_stream, lost, dup = count(rows, read_stream(liftbridge_client, stream_name, (0, 1)))
    assert (in_stream, lost, dup) == (900, 0, 0)


def test_exactly_once_needs_a_producer_id_and_acks() -> None:
    from airflow_provider_liftbridge.spark.publish import publish_dataframe

    settings = ConnectionSettings(brokers=("127.0.0.1:1",))
    with pytest.raises(SparkOptionError, match="producer_id"):
        publish_dataframe(None, "s", settings=settings, exactly_once=True)  # type: ignore[arg-type]
    with pytest.raises(SparkOptionError, match="acknowledgements"):
        publish_dataframe(
            None,  # type: ignore[arg-type]
            "s",
            settings=settings,
            exactly_once=True,
            producer_id="p",
            options=PublishOptions(ack_policy=AckPolicy.NONE),
        )


def test_spark_partitions_side_by_side_leave_nothing_to_read(
    liftbridge_client: LiftbridgeClient, stream_name: str, lb_address: str, nats_url: str
) -> None:
    # Two exactly-once Spark partitions write the same stream partitions at once; each leaves the
    # offsets between its records to the driver, which reads only those no task was acknowledged for.
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    plan = PublishPlan(stream=stream_name, value_col="value", partitioner="round_robin", partitions=2)
    settings = ConnectionSettings(brokers=(lb_address,), nats_servers=(nats_url,))
    rows = values(40_000)
    halves = {0: rows[:20_000], 1: rows[20_000:]}
    summaries: dict[int, dict[str, object]] = {}

    def task(n: int) -> None:
        summaries[n] = publish_partition(_batches(halves[n], 1000), plan, settings, n, producer_id="dag/t/run")

    threads = [threading.Thread(target=task, args=(n,)) for n in halves]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert [summaries[n]["error"] for n in halves] == [None, None]
    assert all(summaries[n]["unread"] for n in halves)
    assert check_between_tasks(settings, stream_name, list(summaries.values())) == 0
    in_stream, lost, dup = count(rows, read_stream(liftbridge_client, stream_name, (0, 1)))
    assert (in_stream, lost, dup) == (40_000, 0, 0)


def test_a_replaced_history_in_a_spark_task_fails_the_operator_without_retries(
    fast_cluster: DevServer, stream_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A task's exactly-once publisher meets a replaced history between two groups of rows (a
    # follower cut after offset 49 leads once offsets 0-99 are committed): its summary says so,
    # the driver's SparkPublishError carries it, and the operators' shared decision turns it into
    # an AirflowFailException. Any other failure of a task stays retryable.
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_provider_liftbridge.operators.publishing_base import replaced_history_failure

    monkeypatch.setattr(spark_publish, "GROUP_ROWS", 100)  # one group per batch of 100 rows
    rows, producer = values(200), "dag/t/run"
    with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3)

        def batches() -> Iterator[pa.RecordBatch]:
            yield pa.RecordBatch.from_pydict({"value": rows[:100]})
            wait_until(
                lambda: client.fetch_partition_metadata(stream_name, 0).high_watermark == 99,
                60.0,
                "the first group committed",
                interval=0.05,
            )
            part = client.fetch_metadata([stream_name]).streams[stream_name].partitions[0]
            follower = next(r for r in part.replicas if r != part.leader)
            fast_cluster.replace_history(stream_name, 0, fast_cluster.broker_ids.index(follower), 49)
            yield pa.RecordBatch.from_pydict({"value": rows[100:]})

        options = PublishOptions(ack_policy=AckPolicy.ALL, timeout=5.0)
        plan = PublishPlan(
            stream=stream_name, value_col="value", partitioner="round_robin", partitions=1, options=options
        )
        settings = ConnectionSettings(brokers=tuple(fast_cluster.addresses))
        summary = publish_partition(batches(), plan, settings, spark_partition=0, producer_id=producer)
    assert summary["replaced_history"] is True and "TruncatedLogError" in summary["error"]
    with pytest.raises(SparkPublishError) as caught:
        merge_summaries(stream_name, AckPolicy.ALL, [summary], 1.0, producer_id=producer)
    assert caught.value.replaced_history
    failure = replaced_history_failure(stream_name, producer, caught.value)
    assert isinstance(failure, AirflowFailException)
    assert f"stream {stream_name!r} as producer {producer!r}" in str(failure) and "TruncatedLogError" in str(failure)
    other = dict(summary, error="Spark partition 1: UncommittedTailError: ...", replaced_history=False)
    with pytest.raises(SparkPublishError) as caught_other:
        merge_summaries(stream_name, AckPolicy.ALL, [other], 1.0, producer_id=producer)
    assert not caught_other.value.replaced_history
    assert replaced_history_failure(stream_name, producer, caught_other.value) is None


@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("airflow_db")
def test_a_spark_operator_task_that_finds_a_replaced_history_mid_publish_fails_once_without_retries(
    fast_cluster: DevServer,
    stream_name: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """The Spark operator's own path, end to end: a ``dag.test()`` task with ``retries=2`` whose one
    Spark task publishes exactly once with ack policy ALL. Its first group of rows is committed;
    then, while the rest of its Spark partition waits for a flag file (``dag_support``), a follower
    cut after offset 49 leads (``replace_history``), and the task's next group meets that history
    (``TruncatedLogError``). The operator fails once, without Airflow's retries. Without its check
    (``replaced_history_failure``) the ``SparkPublishError`` was retried, and the retry re-sent the
    records the new leader lacked and succeeded."""
    from airflow.sdk import DAG

    from airflow_provider_liftbridge.operators.spark import LiftbridgeSparkPublishOperator
    from airflow_provider_liftbridge.spark.sources import DataFrameSource
    from tests.airflow_support import conn_env_name, liftbridge_conn_json, register_dag

    from . import dag_support

    rest, keep_to = 1000, 49
    flag = tmp_path / "released"
    history: dict[str, object] = {}
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(",".join(fast_cluster.addresses)))
    monkeypatch.setattr(dag_support, "HISTORY", history)
    with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
        client.create_stream(stream_name, stream_name, replication_factor=3)
    replaced: dict[str, object] = {}

    def first_group_committed(client: LiftbridgeClient) -> bool:
        first = history.get("first_group")  # noted by the DataFrame's source when the task builds it
        return isinstance(first, int) and client.fetch_partition_metadata(stream_name, 0).high_watermark == first - 1

    def replace_once_the_first_group_is_committed() -> None:
        try:
            with LiftbridgeClient(fast_cluster.addresses, timeout=5.0, max_retries=8) as client:
                wait_until(lambda: first_group_committed(client), 120.0, "the first group committed", interval=0.05)
                part = client.fetch_metadata([stream_name]).streams[stream_name].partitions[0]
            follower = fast_cluster.broker_ids.index(next(r for r in part.replicas if r != part.leader))
            replaced["lost"] = fast_cluster.replace_history(stream_name, 0, follower, keep_to)
        except BaseException as exc:
            replaced["error"] = exc
        finally:
            flag.write_text("released\n")  # even after a failure here: the task ends, the test reports it

    start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    with DAG(f"eo_spark_replaced_{stream_name}", schedule=None, start_date=start) as dag:
        LiftbridgeSparkPublishOperator(
            task_id="publish",
            stream=stream_name,
            source=DataFrameSource(
                dataframe_callable="tests.reliability.dag_support.rows_held_after_the_first_group",
                callable_kwargs={"rest": rest, "flag": str(flag), "hold": 180.0},
            ),
            value_col="value",
            value_format="bytes",
            exactly_once=True,
            options=PublishOptions(ack_policy=AckPolicy.ALL, timeout=5.0),
            # Its own session unless one runs in this process already (the Spark suite's, on a
            # pytest-xdist worker that ran it first): the task then uses that one. The Arrow batch
            # size is the session's (10,000 rows by default: a first group of 7 batches).
            spark_config={"spark.master": "local[1]", "spark.ui.enabled": "false"},
            retries=2,
            retry_delay=dt.timedelta(seconds=0),
        )
    register_dag(dag)
    replacer = threading.Thread(target=replace_once_the_first_group_is_committed, name="replace-history")
    replacer.start()
    dag_run = dag.test()
    replacer.join(30)
    assert not replacer.is_alive()
    if "error" in replaced:
        raise AssertionError("the history was not replaced") from replaced["error"]  # type: ignore[arg-type]
    first = int(history["first_group"])  # type: ignore[call-overload]
    assert replaced["lost"] == first - keep_to - 1
    (ti,) = dag_run.get_task_instances()
    assert (str(dag_run.state), str(ti.state)) == ("failed", "failed")
    assert history["tries"] == 1 and ti.try_number == 1  # no retry
    log = capsys.readouterr().out
    assert "LiftbridgeReplacedHistoryError" in log and "fails without retries" in log
    assert "Spark partition 0: TruncatedLogError" in log and f"at or below offset {first - 1}," in log
    assert "compare the partition's replicas" in log
