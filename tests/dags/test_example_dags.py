"""The example DAGs, run for real with ``dag.test()`` (SQLite metadata DB, dev server, deferred
sensors run in line by Airflow's test runner)."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from tests.airflow_support import DAGS_FOLDER

ORDERS = [  # what liftbridge_spark_streaming seeds (the DAGs folder is not a package)
    {"order_id": f"o-{i}", "status": "cancelled" if i % 4 == 0 else "paid"} for i in range(60)
]

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(DAGS_FOLDER))
    assert bag.import_errors == {}
    return bag


def run(dagbag: Any, dag_id: str, **conf: Any) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """Run a DAG once; return the run, task states and XCom return values."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag_run = dagbag.get_dag(dag_id).test(run_conf=conf or None)
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_id, key="return_value")).all()
        xcoms = {row.task_id: XComModel.deserialize_value(row) for row in rows}
    return dag_run, states, xcoms


def test_example_dags_parse(dagbag: Any) -> None:
    assert {
        "liftbridge_stream_lifecycle",
        "liftbridge_publish_files",
        "liftbridge_stream_archive",
        "liftbridge_interval_archive",
        "liftbridge_hourly_partitions",
        "liftbridge_daily_rollup",
    } <= set(dagbag.dag_ids)


def test_stream_lifecycle_end_to_end(dagbag: Any, liftbridge_client: LiftbridgeClient) -> None:
    dag_run, states, xcoms = run(dagbag, "liftbridge_stream_lifecycle")
    assert dag_run.state == "success", states
    assert set(states.values()) == {"success"}
    stream = xcoms["create_stream"]["stream"]
    assert stream.startswith("lifecycle-manual")
    assert xcoms["create_stream"]["created"] is True
    assert xcoms["publish_records"]["count"] == 4
    assert xcoms["publish_records"]["partitions"] == {"0": {"first_offset": 0, "last_offset": 3, "count": 4}}
    # The deferrable sensors found their targets committed (one look each, no deferral).
    assert xcoms["wait_for_offset"] == {"stream": stream, "partition": 0, "target_offset": 3, "offset": 3}
    found = xcoms["find_ready_order"]
    assert found["match"] == {"order": 3, "status": "ready"}
    assert json.loads(base64.b64decode(found["message"]["value"])) == {"order": 3, "status": "ready"}
    assert base64.b64decode(found["message"]["key"]) == b"3"
    assert xcoms["pause_stream"] == {"stream": stream, "partitions": None, "resume_all": False}
    assert xcoms["delete_stream"] == {"stream": stream, "deleted": True}
    assert stream not in liftbridge_client.fetch_metadata([stream]).streams


def test_failed_publish_fails_the_run_and_teardown_still_deletes(
    dagbag: Any, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.set_stream_readonly(stream_name)  # every publish is refused
    dag_run, states, _ = run(dagbag, "liftbridge_stream_lifecycle", stream=stream_name)
    assert dag_run.state == "failed"
    assert states["create_stream"] == "success"  # existing stream accepted
    assert states["publish_records"] == "failed"  # never a silent success
    assert states["wait_for_offset"] == "upstream_failed"
    assert states["delete_stream"] == "success"  # teardown
    assert stream_name not in liftbridge_client.fetch_metadata([stream_name]).streams


def test_publish_files_end_to_end(dagbag: Any, stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    dag_run, states, xcoms = run(dagbag, "liftbridge_publish_files", stream=stream_name)
    assert dag_run.state == "success", states
    # The files went from task to task through the files_url folder (default: under AIRFLOW_HOME),
    # one per run, removed by the teardown.
    folder = xcoms["write_sample_files"]
    assert folder.startswith(f"file://{os.environ['AIRFLOW_HOME']}/liftbridge-examples/files/")
    from airflow.sdk import ObjectStoragePath

    assert states["remove_sample_files"] == "success" and not ObjectStoragePath(folder).exists()
    jsonl = xcoms["publish_jsonl"]
    assert jsonl["count"] == jsonl["acknowledged"] == 50
    assert [f["count"] for f in jsonl["files"]] == [25, 25]
    tables = xcoms["publish_csv_and_parquet"]
    assert [(f["format"], f["count"]) for f in tables["files"]] == [("csv", 5), ("parquet", 50)]
    # Write statistics in both summaries; the second task compressed its values with gzip.
    assert jsonl["write_stats"]["acks"] == 50 and tables["write_stats"]["acks"] == 55
    assert set(xcoms["report_write_stats"]) == {"orders-0.jsonl", "customers.csv"}
    committed = xcoms["wait_until_committed"]
    assert committed["mode"] == "offsets" and committed["stream"] == stream_name
    for partition, span in jsonl["partitions"].items():
        assert committed["partitions"][partition]["offset"] >= span["last_offset"]
    assert stream_name not in liftbridge_client.fetch_metadata([stream_name]).streams


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_spark_pipeline_end_to_end(dagbag: Any, liftbridge_client: LiftbridgeClient, spark_session: Any) -> None:
    """Transform with Spark, publish from the executors, wait with deferred offset sensors, read back.

    The process's one SparkContext is the standalone test cluster's (``spark_session``): the
    publish operator and ``@task.pyspark`` reuse the active session, so the executors that publish
    and read run the Airflow-free executor archive.
    """
    assert spark_session.sparkContext.master.startswith("spark://")
    dag_run, states, xcoms = run(dagbag, "liftbridge_spark_pipeline")
    assert dag_run.state == "success", states
    published = xcoms["transform_and_publish"]
    assert published["count"] == published["acknowledged"] == 800  # the built-in sample's paid orders
    assert xcoms["read_back"] == published["count"]  # gzip-compressed, read back whole
    assert published["write_stats"]["acks"] == published["count"]
    for partition, span in published["partitions"].items():
        assert (
            liftbridge_client.fetch_partition_metadata(published["stream"], int(partition)).high_watermark
            >= span["last_offset"]
        )


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_spark_streaming_end_to_end(
    dagbag: Any, liftbridge_client: LiftbridgeClient, spark_session: Any, stream_name: str
) -> None:
    """A bounded streaming job (availableNow) from one stream into another through a transformation,
    on the standalone test cluster; a second run goes on from the checkpoint."""
    conf = {"source": f"{stream_name}-orders", "target": f"{stream_name}-priced"}
    dag_run, states, xcoms = run(dagbag, "liftbridge_spark_streaming", **conf)
    assert dag_run.state == "success", states
    # The default checkpoint: this DAG's own folder under AIRFLOW_HOME, named after the two streams.
    assert xcoms["price_orders"]["checkpoint"] == (
        f"{os.environ['AIRFLOW_HOME']}/liftbridge-examples/checkpoints/liftbridge_spark_streaming/"
        f"{conf['source']}-to-{conf['target']}"
    )
    paid = [o for o in ORDERS if o["status"] == "paid"]
    # 60 orders keyed over 2 partitions, at most 20 per partition per micro-batch: several batches.
    assert xcoms["price_orders"]["input_rows"] == 60 and xcoms["price_orders"]["batches"] >= 2
    assert xcoms["count_priced"] == len(paid)
    priced = {}
    for partition in range(2):
        high = liftbridge_client.fetch_partition_metadata(conf["target"], partition).high_watermark
        for message in liftbridge_client.subscribe(conf["target"], partition=partition, start_at=0, stop_at=high):
            body = json.loads(message.value)
            assert message.key == body["customer"].encode()
            priced[body["order_id"]] = body
    assert set(priced) == {o["order_id"] for o in paid}
    assert all(p["amount_with_vat"] == round(p["amount"] * 1.2, 2) for p in priced.values())

    # Second run: 60 more orders are seeded; the query reads only those (its checkpoint), and the
    # target holds each paid order of both runs once.
    dag_run, states, xcoms = run(dagbag, "liftbridge_spark_streaming", **conf)
    assert dag_run.state == "success", states
    assert xcoms["price_orders"]["input_rows"] == 60
    assert xcoms["count_priced"] == 2 * len(paid)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_stream_archive_end_to_end(
    dagbag: Any, liftbridge_client: LiftbridgeClient, spark_session: Any, tmp_path: Any
) -> None:
    """Sample orders -> consume and clean -> Parquet archive -> Spark reads it back. The simulated
    crash is off here (``dag.test()`` runs tasks in this process); tests/system runs it on."""
    import pyarrow.parquet as pq

    conf = {"sample_orders": 300, "simulate_crash": False, "archive_url": (tmp_path / "archive").as_uri()}
    dag_run, states, xcoms = run(dagbag, "liftbridge_stream_archive", **conf)
    assert dag_run.state == "success", states
    assert xcoms["sample_orders"]["count"] == 300
    assert xcoms["clean_orders"]["processed"] >= 300  # what arrived since the last run: these at least
    files = xcoms["archive_orders"]["files"]
    rows = [row for f in files for row in pq.read_table(f["path"]).to_pylist()]
    this_run = [r for r in rows if r["order_id"].startswith(dag_run.run_id)]
    assert len(this_run) == 240  # every 5th order is cancelled and dropped by clean_batch
    assert all(r["amount_with_vat"] == round(r["amount"] * 1.2, 2) for r in this_run)
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows)
    report = xcoms["spark_report"]
    assert (report["files"], report["rows"]) == (len(files), len(rows))
    for partition in (0, 1):
        assert liftbridge_client.fetch_cursor("shop-orders-archive", "shop-orders-clean", partition) == max(
            (f["last_offset"] for f in files if f["partition"] == partition), default=-1
        )


def test_interval_archive_backfill_of_three_hours_archives_each_hour_once(
    dagbag: Any, liftbridge_client: LiftbridgeClient, stream_name: str, tmp_path: Any
) -> None:
    """Three hours of messages stamped in the past (the dev server's reception clock), then three
    runs of liftbridge_interval_archive with those hours' logical dates, as a backfill makes:
    each archives its hour into its own dt=/hour= folder, once; today's message is in none."""
    import pyarrow.parquet as pq
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from tests.operators.interval_support import logical_date_of, publish_three_hours

    per_hour = publish_three_hours(liftbridge_client, stream_name)
    root = tmp_path / "lake"
    dag = dagbag.get_dag("liftbridge_interval_archive")
    for hour in range(3):
        dag_run = dag.test(
            logical_date=logical_date_of(hour), run_conf={"stream": stream_name, "archive_url": root.as_uri()}
        )
        assert dag_run.state == "success"
        with create_session() as session:
            rows = session.scalars(
                XComModel.get_many(
                    run_id=dag_run.run_id, dag_ids=dag.dag_id, task_ids="hour_report", key="return_value"
                )
            ).all()
            report = XComModel.deserialize_value(rows[0])
        assert report["rows"] == {f"dt=2026-03-02/hour={10 + hour}": len(per_hour[hour])}
    for hour in range(3):
        folder = root / "dt=2026-03-02" / f"hour={10 + hour}"
        found = set()
        for path in folder.glob("*.parquet"):
            data = pq.read_table(path, columns=["partition", "offset"]).to_pydict()
            found |= set(zip(data["partition"], data["offset"], strict=True))
        assert found == per_hour[hour]
    assert sorted(p.name for p in (root / "dt=2026-03-02").iterdir()) == ["hour=10", "hour=11", "hour=12"]
