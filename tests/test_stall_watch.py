"""The flake hunt's witness (tests/stall_watch.py) writes down a test that kept its process's
Python from running, naming the test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.processes import run_child

HOLDS_THE_GIL = """
import ctypes

def test_holds_the_gil():
    # libc's usleep through PyDLL, which keeps the GIL: no other thread of the process runs for 1.5 s.
    assert ctypes.PyDLL(None).usleep(1_500_000) == 0
"""


def test_a_test_holding_the_gil_is_written_down_by_name(tmp_path: Path) -> None:
    (tmp_path / "test_hold.py").write_text(HOLDS_THE_GIL)
    log = tmp_path / "stalls.log"
    done = run_child(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.stall_watch", "-p", "no:cacheprovider"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_hold.py")],
        env=dict(os.environ, LIFTBRIDGE_STALL_LOG=str(log), LIFTBRIDGE_STALL_SECONDS="0.3"),
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stalls = [line for line in log.read_text().splitlines() if " stall " in line]
    assert any("test_hold.py::test_holds_the_gil" in line.partition(" in ")[2] for line in stalls), stalls
