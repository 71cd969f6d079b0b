"""The margin report (tests/margins.py) writes down, per test and wait, the share of its deadline
the wait used, and tells a wait that ran out from one that ended in time."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.processes import run_child

WAITS = """
import time

import pytest

from tests import margins


def test_waits():
    start = time.monotonic()
    margins.wait_until(lambda: time.monotonic() - start > 0.4, 2.0, "four tenths of a second")
    with pytest.raises(AssertionError, match="never: not within 0.2 s"):
        margins.wait_until(lambda: False, 0.2, "never")
"""


def test_each_wait_is_written_down_with_its_share_and_whether_it_ran_out(tmp_path: Path) -> None:
    (tmp_path / "test_waits.py").write_text(WAITS)
    log = tmp_path / "margins.tsv"
    done = run_child(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.margins", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_waits.py")],
        env=dict(os.environ, LIFTBRIDGE_MARGIN_LOG=str(log)),
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split("\t")[5].split(" (")[0]: line.split("\t") for line in log.read_text().splitlines()}
    assert sorted(lines) == ["four tenths of a second", "never"]
    share, used, deadline, outcome, test = lines["four tenths of a second"][:5]
    assert (deadline, outcome, test) == ("2.00", "ok", "test_waits.py::test_waits")
    assert 0.2 <= float(share) < 1 and float(used) >= 0.4  # 0.4 s of 2 s, and whatever the machine added
    assert lines["never"][2:5] == ["0.20", "timeout", "test_waits.py::test_waits"]
