"""How long each unit of the suite's work takes, written down, and the table that orders the units.

A unit is what ``tests/conftest.py`` hands a pytest-xdist worker at a time: a test file, or the
whole ``tests/system`` tier. The units are started longest first (the table below), so a long one
does not start last and leave the other worker idle at the end.

- ``unit_of(nodeid)``: the unit of a test.
- ``expected_seconds(items)``: each unit's expected seconds, from ``tests/unit_durations.tsv``
  (``seconds<TAB>unit`` lines, a run's figures); a unit not in it (a new file) is estimated from
  its number of tests at the table's mean seconds per test.
- With ``LIFTBRIDGE_UNIT_TIMES=FILE``, the process that reports the results (the xdist controller,
  or the one process of ``-n 0``) sums each unit's setup, call and teardown durations and writes,
  at the end, one line per unit, longest first: seconds, tests, worker, when its first and last
  results came (seconds since the session's start), the unit, and the descriptors its test
  process held at its first and last result (after the first test's setup, after the last one's
  teardown). Its first two columns are the table's; copy them over ``tests/unit_durations.tsv``
  to refresh it (docs/testing.md, "Wall time"). A unit whose descriptors grew much left something
  open: a worker that reaches 1,024 fails ``select()`` and, under a soft limit of 1,024, every
  open (``scripts/test.sh`` names those that grew by over ``LIFTBRIDGE_FD_GROWTH``, default 20).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

TABLE = Path(__file__).with_name("unit_durations.tsv")
_LOG = os.environ.get("LIFTBRIDGE_UNIT_TIMES", "")


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: its file, or ``tests/system`` for the system tier (its
    Airflow deployment is a package fixture: split, each worker would start one of its own)."""
    path = nodeid.split("::", 1)[0]
    return "tests/system" if path.startswith("tests/system/") else path


def read_table(path: Path = TABLE) -> dict[str, float]:
    """The table's seconds per unit; empty if there is no table."""
    table: dict[str, float] = {}
    if not path.exists():
        return table
    for line in path.read_text().splitlines():
        seconds, _, unit = line.partition("\t")
        if unit and not line.startswith("#"):
            table[unit.split("\t", 1)[0]] = float(seconds)
    return table


def expected_seconds(nodeids: Iterable[str], table: dict[str, float] | None = None) -> dict[str, float]:
    """Each unit's expected seconds: the table's figure, else its number of tests at the table's
    mean seconds per test (a unit the table does not know is placed by its size)."""
    table = read_table() if table is None else table
    counts = Counter(unit_of(nodeid) for nodeid in nodeids)
    known = [unit for unit in counts if unit in table]
    per_test = sum(table[u] for u in known) / max(1, sum(counts[u] for u in known)) or 1.0
    return {unit: table.get(unit, count * per_test) for unit, count in counts.items()}


_started = time.monotonic()
_units: dict[str, list[Any]] = {}  # unit: [seconds, tests, worker, first, last, fds first, fds last]
_reporting = [False]  # this process gets every result: the xdist controller or a run of -n 0
_FDS = "open_descriptors"  # the user property carrying them from a worker to the controller


def pytest_configure(config: pytest.Config) -> None:
    _reporting[0] = bool(_LOG) and not hasattr(config, "workerinput")


def _open_descriptors() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
    except OSError:  # no /proc
        return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """Each report carries the descriptors the test process holds (where the test ran)."""
    report: pytest.TestReport = yield
    if _LOG:
        # A list of its own: the report's is the item's, shared by its three reports.
        report.user_properties = [*report.user_properties, (_FDS, _open_descriptors())]
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _reporting[0]:
        return
    node = getattr(report, "node", None)  # pytest-xdist: the worker's controller
    worker = node.gateway.id if node is not None else "main"
    now = time.monotonic() - _started
    fds = dict(report.user_properties).get(_FDS)
    entry = _units.setdefault(unit_of(report.nodeid), [0.0, 0, worker, now, now, fds, fds])
    entry[0] += report.duration
    entry[1] += report.when == "call" or (report.when == "setup" and not report.passed)
    entry[2], entry[4], entry[6] = worker, now, fds


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _reporting[0] or not _units:
        return
    rows = sorted(_units.items(), key=lambda kv: -kv[1][0])
    with open(_LOG, "w") as out:
        for unit, (seconds, tests, worker, first, last, fds_first, fds_last) in rows:
            out.write(f"{seconds:.1f}\t{unit}\t{tests}\t{worker}\t{first:.0f}\t{last:.0f}\t{fds_first}\t{fds_last}\n")
