"""Two interval archive runs of different hours on one archive root, their tries interleaved: the
10:00 run's whole try (its cleanup, writes and renames) runs while the 11:00 run's try has a file
open under its temporary name, between that write and its rename. Neither may touch the other's
files: both runs succeed on their first try and every message is archived once, with a
``dt=/hour=`` layout (the files in different folders) and without one (the same folder).

How the interleave is driven, deterministically: the 11:00 hour holds a value that is not JSON,
which the archiver hands to its dead-letter stream while it writes the file (``reject`` inside
``write_range``). The 11:00 run's operator runs with ``dag.test()`` in this process, its dead-letter
publisher (opened by ``open_dead_letters`` as ``stream_to_file`` imports it, patched here) first
calling a hook; the hook runs the 10:00 run in a second process
(the reliability archive DAG, ``dag.test()`` there too) and waits for it to end before the 11:00
try goes on to its rename. Real operators, real files, the real dev server."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, Message
from airflow_provider_liftbridge.client.reading import DeadLetters
from airflow_provider_liftbridge.devserver import set_reception_clock
from airflow_provider_liftbridge.operators import JsonLines, stream_to_file
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from tests.airflow_support import xcom_of
from tests.operators.interval_support import hourly_dag, logical_date_of
from tests.processes import run_child

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(300)]
T10 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
REPO = Path(__file__).resolve().parents[2]
#: Messages per partition in each hour; in the 11:00 hour, partition 0's message 3 is not JSON.
COUNT = {0: 8, 1: 5}
BAD = 3


class _HookedDeadLetters:
    """The real dead-letter publisher, calling ``hook`` once before its first message."""

    def __init__(self, real: DeadLetters, hook: Any) -> None:
        self.real, self.hook = real, hook

    def send(self, message: Message, error: BaseException) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        self.real.send(message, error)


def hook_dead_letters(monkeypatch: pytest.MonkeyPatch, hook: Any) -> None:
    """The archiver's dead-letter publisher (``open_dead_letters``, which ``make_handler`` calls
    by the name ``stream_to_file`` imported), calling ``hook`` when its first rejected message is
    being set aside (its file is open under the temporary name then)."""
    real_open = stream_to_file.open_dead_letters

    def open_hooked(client: LiftbridgeClient, value: Any) -> Any:
        real = real_open(client, value)
        return _HookedDeadLetters(real, hook) if real is not None else None

    monkeypatch.setattr(stream_to_file, "open_dead_letters", open_hooked)


def publish(client: LiftbridgeClient, stream: str) -> dict[int, set[tuple[int, int]]]:
    """Each hour's JSON messages ``{"n": ...}`` at 10:30 and 11:30 (a non-JSON one among 11:30's
    on partition 0), then one per partition now (so both hours are complete). Returns, per hour
    (10, 11), the (partition, n) of the messages that must be archived."""
    client.create_stream(stream, stream, partitions=2)
    expected: dict[int, set[tuple[int, int]]] = {10: set(), 11: set()}
    try:
        for hour in (10, 11):
            set_reception_clock(stream, T10.replace(hour=hour, minute=30))
            for partition, count in COUNT.items():
                for i in range(count):
                    n = hour * 1000 + partition * 100 + i
                    if hour == 11 and partition == 0 and i == BAD:
                        client.publish(stream, b"not json", partition=partition)
                        continue
                    client.publish(stream, json.dumps({"n": n}).encode(), partition=partition)
                    expected[hour].add((partition, n))
    finally:
        set_reception_clock(stream, None)
    for partition in COUNT:
        client.publish(stream, b'{"n": -1}', partition=partition)
    return expected


def archived(root: Path) -> Counter[tuple[str, int, int]]:
    """(folder, partition, n) of every row of every file under ``root`` (the 10:00 run writes
    Parquet, the 11:00 run JSON lines)."""
    import pyarrow.parquet as pq

    rows: Counter[tuple[str, int, int]] = Counter()
    for path in root.rglob("*.jsonl"):
        folder = str(path.parent.relative_to(root))
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[(folder, row["partition"], row["n"])] += 1
    for path in root.rglob("*.parquet"):
        folder = str(path.parent.relative_to(root))
        table = pq.read_table(path, columns=["partition", "n"]).to_pydict()
        rows.update((folder, p, n) for p, n in zip(table["partition"], table["n"], strict=True))
    return rows


def run_ten_oclock(stream: str, root: Path, layout: str | None, lb_address: str, work: Path) -> dict[str, Any]:
    """The 10:00 hour archived to ``root`` by the reliability archive DAG, ``dag.test()`` in a
    process of its own; returns what it wrote to ``EO_OUT`` (state, tries, XComs)."""
    out = work / "ten.json"
    env = dict(os.environ) | {
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "tests" / "reliability" / "dags"),
        "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": lb_address}),
        "EO_DAG_ID": f"liftbridge_reliability_archive.{stream}",
        "EO_STREAM": stream,
        "EO_ARCHIVE": str(root),
        "EO_ROWS_PER_FILE": "1000",
        "EO_KILL_AFTER_FILE": "1000000",  # never: this run is not killed
        "EO_MARKER": str(work / "ten-marker"),
        "EO_OUT": str(out),
        "EO_READ_BY": "interval",
        "EO_START": T10.isoformat(),
        "EO_END": (T10 + HOUR).isoformat(),
        "EO_LAYOUT": layout or "",
    }
    done = run_child([sys.executable, "-m", "tests.reliability.run_dag"], cwd=REPO, env=env, capture_output=True)
    assert done.returncode == 0 and out.exists(), done.stderr.decode()[-3000:]
    return dict(json.loads(out.read_text()))


@pytest.mark.parametrize("layout", ["dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}", None], ids=["layout", "one-folder"])
def test_a_run_of_another_hour_cleaning_up_between_a_write_and_its_rename_leaves_that_file_alone(
    layout: str | None,
    stream_name: str,
    liftbridge_client: LiftbridgeClient,
    lb_address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    expected = publish(liftbridge_client, stream_name)
    work = tmp_path
    root = work / "archive"
    seen: dict[str, Any] = {}

    def ten_oclock_runs_now() -> None:
        seen["temporary_before"] = sorted(p.name for p in root.rglob(".*.tmp"))
        seen["ten"] = run_ten_oclock(stream_name, root, layout, lb_address, work)
        seen["temporary_after"] = sorted(p.name for p in root.rglob(".*.tmp"))

    hook_dead_letters(monkeypatch, ten_oclock_runs_now)
    dag = hourly_dag(
        LiftbridgeStreamToFileOperator,
        "archive",
        stream_name,
        path=str(root),
        path_layout=layout,
        format=JsonLines(row_group_rows=2),
        value_format="json",
        dead_letters=DeadLetterStream(f"{stream_name}-dead", create=True),
        retries=0,  # a try the other run broke fails the run
    )
    eleven = dag.test(logical_date=logical_date_of(1))  # data interval 11:00-12:00

    # The interleave happened: the 10:00 run ran while the 11:00 file was open under its temporary name.
    assert len(seen.get("temporary_before", [])) == 1, seen
    assert seen["ten"]["state"] == "success" and seen["ten"]["tries"] == {"archive": 1}, seen["ten"]
    assert seen["temporary_after"] == seen["temporary_before"], "the 10:00 run removed the 11:00 run's file"
    assert str(eleven.state) == "success", "the 11:00 run failed: its temporary file was removed under it"
    assert xcom_of(eleven, "archive")["dead_lettered"] == 1

    rows = archived(root)
    assert max(rows.values()) == 1, "a message is archived twice"
    folder = {10: "dt=2026-03-02/hour=10", 11: "dt=2026-03-02/hour=11"} if layout else {10: ".", 11: "."}
    assert sorted(rows) == sorted((folder[h], p, n) for h, pairs in expected.items() for p, n in pairs)
    assert not list(root.rglob(".*")), "a temporary file is left"
