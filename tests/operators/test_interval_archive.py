"""LiftbridgeStreamToFileOperator with read=DataInterval() and a time layout, through real DAG runs
(``dag.test()`` with explicit logical dates) against the dev server: each hourly run archives its
hour into its own ``dt=/hour=`` folder, once; a clear rewrites the same files; a backfill of an
older hour leaves the newer hours' files alone; bad layouts fail at parse time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import DataInterval
from airflow_provider_liftbridge.operators.archive_layout import ArchiveLayout
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from tests.airflow_support import xcom_of
from tests.operators.interval_support import hourly_dag, logical_date_of, publish_three_hours

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(240)]
LAYOUT = "dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}"


def tree(root: Path) -> dict[str, list[str]]:
    """Folder (relative) -> sorted file names (hidden ones included, to see strays)."""
    out: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            out.setdefault(str(path.parent.relative_to(root)), []).append(path.name)
    return out


def rows(root: Path) -> list[tuple[str, int, int, int]]:
    """(folder, partition, offset, hour field) of every JSON line in the archive."""
    import json

    found = []
    for path in root.rglob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found.append((str(path.parent.relative_to(root)), row["partition"], row["offset"], row["hour"]))
    return sorted(found)


def archive_dag(stream: str, root: Path, **kwargs: Any) -> Any:
    kwargs.setdefault("path_layout", LAYOUT)
    return hourly_dag(
        LiftbridgeStreamToFileOperator,
        "archive",
        stream,
        path=str(root),
        format="jsonl",
        value_format="json",
        batch_size=2,
        **kwargs,
    )


def test_each_hour_lands_in_its_own_folder_once_and_a_clear_rewrites_the_same_files(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    per_hour = publish_three_hours(liftbridge_client, stream_name)
    dag = archive_dag(stream_name, tmp_path)
    for hour in (2, 0, 1):  # the newest first, then a backfill of the older ones
        dag_run = dag.test(logical_date=logical_date_of(hour))
        assert str(dag_run.state) == "success"
        files = xcom_of(dag_run, "archive")["files"]
        assert {f"hour={10 + hour}" in f["path"] for f in files} == {True}
    found = rows(tmp_path)
    assert len(found) == len(set(found)) == sum(len(v) for v in per_hour.values())  # each message once
    for hour in range(3):
        folder = f"dt=2026-03-02/hour={10 + hour}"
        assert {(p, o) for f, p, o, h in found if f == folder} == per_hour[hour]
        assert {h for f, _, _, h in found if f == folder} == {10 + hour}
    before = tree(tmp_path)
    assert not [n for names in before.values() for n in names if n.startswith(".")]  # no temporary files
    dag_run = dag.test(logical_date=logical_date_of(1))  # cleared: the hour again, the same file names
    assert str(dag_run.state) == "success" and tree(tmp_path) == before and rows(tmp_path) == found


def test_a_field_layout_splits_a_batch_into_one_file_per_folder(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    per_hour = publish_three_hours(liftbridge_client, stream_name)
    dag = archive_dag(stream_name, tmp_path, path_layout="hour={data_interval_start:%H}/country={value.country}")
    assert str(dag.test(logical_date=logical_date_of(0)).state) == "success"
    found = rows(tmp_path)
    assert {(p, o) for _, p, o, _ in found} == per_hour[0]
    assert {f for f, *_ in found} == {"hour=10/country=DE", "hour=10/country=FR"}


def test_bad_layouts_fail_when_the_dag_is_parsed(stream_name: str, tmp_path: Path) -> None:
    def op(layout: str) -> Any:
        return LiftbridgeStreamToFileOperator(
            task_id="a", stream=stream_name, path=str(tmp_path), read=DataInterval(), path_layout=layout
        )

    with pytest.raises(LiftbridgeArgumentError, match=r"unknown field \{when\}"):
        op("dt={when:%Y}")
    with pytest.raises(LiftbridgeArgumentError, match="the format '%Y-%Q' of .timestamp. has %Q"):
        op("dt={timestamp:%Y-%Q}")
    with pytest.raises(LiftbridgeArgumentError, match="needs a strftime format"):
        op("dt={timestamp}")
    with pytest.raises(LiftbridgeArgumentError, match="not a valid template"):
        op("dt={timestamp:%Y")
    with pytest.raises(LiftbridgeArgumentError, match="starts with '.' or '_'"):
        op("_tmp/{timestamp:%H}")
    with pytest.raises(LiftbridgeArgumentError, match="takes no format"):
        op("c={value.country:x}")
    assert ArchiveLayout(LAYOUT).uses_value is False


def test_a_value_that_is_not_json_fails_the_try_before_its_position_moves(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path
) -> None:
    from airflow_provider_liftbridge.devserver import set_reception_clock
    from tests.operators.interval_support import T0

    liftbridge_client.create_stream(stream_name, stream_name)
    set_reception_clock(stream_name, T0.replace(minute=5))
    try:
        liftbridge_client.publish(stream_name, b"not json")
    finally:
        set_reception_clock(stream_name, None)
    liftbridge_client.publish(stream_name, b'{"country": "DE"}')  # now: after the hour, which is complete
    dag = hourly_dag(
        LiftbridgeStreamToFileOperator,
        "archive",
        stream_name,
        path=str(tmp_path),
        format="jsonl",
        path_layout="c={value.country}",
        retries=0,
    )
    assert str(dag.test(logical_date=logical_date_of(0)).state) == "failed"
    assert (
        liftbridge_client.fetch_cursor(
            "airflow|interval|" + dag.dag_id + "/archive|" + "1772445600000-1772449200000", stream_name, 0
        )
        == -1
    )
    assert tree(tmp_path) == {}
