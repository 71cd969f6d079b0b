"""Publish files to a stream: JSON lines by key, a CSV file and a Parquet file (gzip-compressed
values), then wait until everything published is committed and report the write statistics the
publish tasks returned in XCom (ack latencies publish -> leader -> commit, throughput).

The first task writes small sample files so the DAG runs anywhere; point the publish tasks'
``path`` at your own files, a glob, or object storage (``s3://bucket/exports/*.parquet`` with
``storage_conn_id``). Uses the ``liftbridge_default`` connection (see ``liftbridge_stream_lifecycle``).

**What it assumes about disks: nothing but the ``files_url`` param.** The sample files are
written by one task and read by two others, which may run on other workers, so they go through
an ``ObjectStoragePath`` at ``files_url`` (one folder per run, removed by the teardown task), never
through a worker's local temporary directory. The default, ``file://<AIRFLOW_HOME>/liftbridge-examples/files``,
is local disk: right for ``airflow dags test``, ``airflow standalone`` and any deployment whose
workers share one host or one volume there. On workers that share no disk (Celery or Kubernetes
workers on several hosts), set ``files_url`` to object storage every worker reaches, e.g.
``s3://aws_default@my-bucket/liftbridge-examples`` (the connection id before the ``@``).
"""

from __future__ import annotations

import csv
import json
import os
import re
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import ObjectStoragePath, dag, task

from airflow_provider_liftbridge.client import PublishOptions
from airflow_provider_liftbridge.operators.publish_file import LiftbridgePublishFileOperator
from airflow_provider_liftbridge.operators.stream import (
    LiftbridgeCreateStreamOperator,
    LiftbridgeDeleteStreamOperator,
)
from airflow_provider_liftbridge.sensors.ack import LiftbridgeAckSensor

ROWS = [{"customer": f"c{i % 5}", "amount": i * 10, "day": f"2024-01-{i % 28 + 1:02d}"} for i in range(50)]


def default_files_url() -> str:
    """``file://<AIRFLOW_HOME>/liftbridge-examples/files``: local disk (see the module docstring)."""
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    return f"file://{home}/liftbridge-examples/files"


def run_folder(files_url: str, run_id: str) -> ObjectStoragePath:
    """This run's folder under ``files_url`` (the run id, with characters object stores dislike replaced)."""
    return ObjectStoragePath(files_url or default_files_url()) / re.sub(r"[^A-Za-z0-9._-]", "_", run_id)


@task
def write_sample_files(files_url: str, run_id: str | None = None) -> str:
    """Write two JSON-lines files, one CSV file and one Parquet file; return their folder's URL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert run_id is not None  # filled in from the task's context
    folder = run_folder(files_url, run_id)
    folder.mkdir(parents=True, exist_ok=True)
    for part in range(2):
        with (folder / f"orders-{part}.jsonl").open("w") as handle:
            for row in ROWS[part::2]:
                handle.write(json.dumps(row) + "\n")
    with (folder / "customers.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["customer", "name"])
        writer.writeheader()
        writer.writerows({"customer": f"c{i}", "name": f"Customer {i}"} for i in range(5))
    with (folder / "orders.parquet").open("wb") as handle:
        pq.write_table(pa.Table.from_pylist(ROWS), handle, row_group_size=16)
    return str(folder)


@task
def remove_sample_files(folder: str) -> None:
    """Remove this run's sample files (teardown: runs even when a publish failed)."""
    path = ObjectStoragePath(folder)
    if path.exists():
        path.rmdir(recursive=True)


@task
def report_write_stats(*summaries: dict[str, Any]) -> dict[str, Any]:
    """What each publish task measured from its acks (``write_stats`` of its XCom summary)."""
    report = {}
    for summary in summaries:
        stats = summary["write_stats"]
        report[summary["files"][0]["path"].rsplit("/", 1)[-1]] = {
            "records_per_second": stats["records_per_second"],
            "to_commit_ms_p99": stats["to_commit_ms"]["p99"],
        }
        print(f"{summary['count']} record(s): {stats}")
    return report


@dag(
    dag_id="liftbridge_publish_files",
    schedule=None,
    start_date=datetime(2024, 1, 1),
    catchup=False,
    params={"stream": "liftbridge-files", "files_url": ""},
    tags=["liftbridge", "example"],
)
def liftbridge_publish_files() -> None:
    stream = "{{ params.stream }}"
    folder = write_sample_files("{{ params.files_url }}")
    create = LiftbridgeCreateStreamOperator(task_id="create_stream", stream=stream, partitions=2)
    jsonl = LiftbridgePublishFileOperator(
        task_id="publish_jsonl",
        stream=stream,
        path="{{ ti.xcom_pull(task_ids='write_sample_files') }}/orders-*.jsonl",
        key_field="customer",
        partitioner="key",
        batch_size=20,
    )
    tables = LiftbridgePublishFileOperator(
        task_id="publish_csv_and_parquet",
        stream=stream,
        path=[
            "{{ ti.xcom_pull(task_ids='write_sample_files') }}/customers.csv",
            "{{ ti.xcom_pull(task_ids='write_sample_files') }}/orders.parquet",
        ],
        key_field="customer",
        partitioner="key",
        options=PublishOptions(compression="gzip"),  # readers of this provider get the rows back as they were
    )
    # retries: a sensor Airflow 3.3.2 kills right after it resumed from deferral (apache/airflow#72716)
    # is retried, and the retry finds its target reached at once (docs/airflow.md, Troubleshooting).
    committed = LiftbridgeAckSensor(
        task_id="wait_until_committed",
        publish_summary=jsonl.output,
        deferrable=True,
        timeout=120,
        retries=1,
        retry_delay=timedelta(seconds=5),
    )
    delete = LiftbridgeDeleteStreamOperator(task_id="delete_stream", stream=stream)

    stats = report_write_stats(jsonl.output, tables.output)
    [folder, create] >> jsonl >> tables >> committed >> stats >> delete.as_teardown(setups=create)
    tables >> remove_sample_files(folder).as_teardown(setups=folder)


liftbridge_publish_files()
