"""Partitioned runs (Airflow 3.3, ``CronPartitionTimetable``) of the reading operators, against
the dev server: ``read=DataInterval()`` reads the partition's hour (the key read in the
timetable's time zone when the run has no partition date, as on Airflow 3.2), the archive's
``path_layout`` names the partition, and the outlet's asset event carries the partition key.
Bad input fails at the first try with nothing read or written. Runs are made as the scheduler
makes them (tests/operators/partition_support.py)."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import DataInterval, SinceLastRun
from airflow_provider_liftbridge.operators.archive_layout import ArchiveLayout
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from tests.airflow_support import xcom_of
from tests.operators.interval_support import T0, publish_three_hours
from tests.operators.partition_support import run_partitioned

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(240)]
LAYOUT = "dt={partition_date:%Y-%m-%d}/hour={partition_date:%H}"
HOUR = dt.timedelta(hours=1)


def partitioned_dag(task: type, stream: str, *, cron: str = "0 * * * *", zone: str = "UTC", **kwargs: Any) -> Any:
    """A DAG on ``CronPartitionTimetable(cron, timezone=zone)`` with one reading task ``read``."""
    from airflow.sdk import DAG, CronPartitionTimetable

    kwargs.setdefault("retries", 0)  # "at the first try": a failure is not retried
    with DAG(
        f"partitioned_{stream}_{uuid.uuid4().hex[:6]}",
        schedule=CronPartitionTimetable(cron, timezone=zone),
        start_date=T0,
        catchup=False,
    ) as dag:
        task(task_id="read", stream=stream, **kwargs)
    return dag


def rows(root: Path) -> dict[str, set[tuple[int, int, int]]]:
    """Folder (relative) -> its rows' (partition, offset, hour field)."""
    found: dict[str, set[tuple[int, int, int]]] = {}
    for path in root.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found.setdefault(str(path.parent.relative_to(root)), set()).add(
                (row["partition"], row["offset"], row["hour"])
            )
    return found


def test_the_archive_of_a_partition_reads_its_hour_into_its_folder_and_its_event_names_the_key(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.sdk import Asset
    from airflow.utils.session import create_session
    from sqlalchemy import select

    per_hour = publish_three_hours(liftbridge_client, stream_name)
    asset = Asset(name=f"archive-{stream_name}", uri=f"file://{tmp_path}")
    dag = partitioned_dag(
        LiftbridgeStreamToFileOperator,
        stream_name,
        read=DataInterval(),
        path=str(tmp_path),
        path_layout=LAYOUT + "/key={partition_key}",
        format="jsonl",
        value_format="json",
        outlets=[asset],
    )
    dag_run = run_partitioned(dag, "2026-03-02T11:00:00", T0 + HOUR)
    assert str(dag_run.state) == "success"
    summary = xcom_of(dag_run, "read")
    assert summary["interval"]["start"].startswith("2026-03-02T11:00:00")
    assert summary["interval"]["end"].startswith("2026-03-02T12:00:00")
    found = rows(tmp_path)
    assert list(found) == ["dt=2026-03-02/hour=11/key=2026-03-02T11:00:00"]
    assert {(p, o) for p, o, _ in found[next(iter(found))]} == per_hour[1]
    assert {h for *_, h in next(iter(found.values()))} == {11}
    with create_session() as session:
        events = session.scalars(
            select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id).where(AssetModel.uri == asset.uri)
        ).all()
        assert [e.partition_key for e in events] == ["2026-03-02T11:00:00"]
        assert events[0].extra["partition_key"] == "2026-03-02T11:00:00"
        assert sorted(events[0].extra["files"]) == sorted(f["path"] for f in summary["files"])


def test_a_key_without_a_partition_date_is_read_in_the_timetables_time_zone(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    # Airflow 3.2 gives no partition date: the key is read with the timetable's key_format and
    # zone. 12:00 in Berlin on 2026-03-02 (CET, UTC+1) is 11:00 UTC; the folders use the key's zone.
    per_hour = publish_three_hours(liftbridge_client, stream_name)
    dag = partitioned_dag(
        LiftbridgeStreamToFileOperator,
        stream_name,
        zone="Europe/Berlin",
        read=DataInterval(),
        path=str(tmp_path),
        path_layout=LAYOUT,
        format="jsonl",
        value_format="json",
    )
    assert str(run_partitioned(dag, "2026-03-02T12:00:00").state) == "success"
    found = rows(tmp_path)
    assert list(found) == ["dt=2026-03-02/hour=12"]
    assert {(p, o) for p, o, _ in found["dt=2026-03-02/hour=12"]} == per_hour[1]


def count(messages: list[Any]) -> int:
    """The reading tasks' batch function here: nothing to do but take the batch."""
    return 0


def test_a_daily_schedule_reads_the_whole_day_and_explicit_times_win(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    per_hour = publish_three_hours(liftbridge_client, stream_name)
    everything = set().union(*per_hour.values())
    daily = partitioned_dag(
        LiftbridgeConsumeOperator, stream_name, cron="0 0 * * *", read=DataInterval(), apply_function_batch=count
    )
    dag_run = run_partitioned(daily, "2026-03-02T00:00:00", T0.replace(hour=0))
    assert str(dag_run.state) == "success"
    summary = xcom_of(dag_run, "read")
    assert summary["processed"] == len(everything)
    assert summary["interval"]["end"].startswith("2026-03-03T00:00:00")
    # A key that names no time, with start_time and end_time given: those are read.
    explicit = partitioned_dag(
        LiftbridgeConsumeOperator,
        stream_name,
        read=DataInterval(start_time="2026-03-02T12:00:00Z", end_time="2026-03-02T13:00:00Z", cursor_id="explicit"),
        apply_function_batch=count,
    )
    dag_run = run_partitioned(explicit, "eu-west")
    assert str(dag_run.state) == "success"
    assert xcom_of(dag_run, "read")["processed"] == len(per_hour[2])


@pytest.mark.parametrize(
    ("cron", "key", "message"),
    [
        ("0 * * * *", "eu-west", r"the partition key 'eu-west' names no time \(expected '%Y-%m-%dT%H:%M:%S'\)"),
        ("0 0 30 2 *", "2026-03-02T00:00:00", "has no next time after the partition '2026-03-02T00:00:00'"),
    ],
)
def test_a_key_naming_no_time_or_a_schedule_without_a_next_time_fails_before_anything_is_read(
    stream_name: str,
    liftbridge_client: LiftbridgeClient,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    cron: str,
    key: str,
    message: str,
) -> None:
    publish_three_hours(liftbridge_client, stream_name)
    dag = partitioned_dag(
        LiftbridgeStreamToFileOperator, stream_name, cron=cron, read=DataInterval(), path=str(tmp_path)
    )
    dag_run = run_partitioned(dag, key)
    assert str(dag_run.state) == "failed"
    assert [ti.try_number for ti in dag_run.get_task_instances()] == [1]
    assert list(tmp_path.rglob("*")) == []
    logged = "".join(capfd.readouterr())  # the task runner logs the error the task failed with
    assert re.search(message, logged), logged[-3000:]
    assert re.search(r"give DataInterval\((start_time=\.\.\., )?end_time=\.\.\.\) \(ISO 8601 with a time zone", logged)


def test_a_layout_naming_the_partition_on_a_run_without_one_is_refused_with_nothing_written(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish(stream_name, b"one")
    with DAG(f"unpartitioned_{stream_name}", schedule=None, start_date=T0) as dag:
        LiftbridgeStreamToFileOperator(
            task_id="read",
            stream=stream_name,
            path=str(tmp_path),
            path_layout="{{ 'key={partition_key}' }}",  # known once rendered
            read=SinceLastRun("arch"),
            format="jsonl",
            retries=0,
        )
    from tests.airflow_support import register_dag

    register_dag(dag)
    assert str(dag.test().state) == "failed"
    assert list(tmp_path.rglob("*")) == []
    assert liftbridge_client.fetch_cursor("arch", stream_name, 0) == -1
    with pytest.raises(LiftbridgeArgumentError, match="this run has no partition key") as raised:
        ArchiveLayout("key={partition_key}").folder_of(None, None)
    assert "run it on a partitioned schedule" in str(raised.value)


def test_bad_partition_fields_fail_when_the_layout_is_parsed() -> None:
    with pytest.raises(LiftbridgeArgumentError, match=r"\{partition_key\} takes no format"):
        ArchiveLayout("k={partition_key:%H}")
    with pytest.raises(LiftbridgeArgumentError, match=r"\{partition_date\} needs a strftime format"):
        ArchiveLayout("d={partition_date}")
    assert ArchiveLayout(LAYOUT).uses_partition and not ArchiveLayout("h={timestamp:%H}").uses_partition
