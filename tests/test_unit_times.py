"""The units of the suite's work, the table that orders them, and the record a run writes of them
(tests/unit_times.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit_times import TABLE, expected_seconds, read_table, unit_of

ROOT = Path(__file__).resolve().parent.parent


def test_a_unit_is_a_file_and_the_system_tier_is_one():
    assert unit_of("tests/client/test_core.py::test_x[a-b]") == "tests/client/test_core.py"
    assert unit_of("tests/client/test_core.py::TestX::test_y") == "tests/client/test_core.py"
    assert unit_of("tests/system/test_ui.py::test_login") == "tests/system"
    assert unit_of("tests/system/sub/test_z.py::test_w") == "tests/system"


def test_the_table_is_read_by_its_first_two_columns(tmp_path):
    table = tmp_path / "t.tsv"
    table.write_text("# seconds\tunit\n120.5\ttests/a.py\t7\tgw0\t0\t130\n3\ttests/system\n")
    assert read_table(table) == {"tests/a.py": 120.5, "tests/system": 3.0}
    assert read_table(tmp_path / "missing.tsv") == {}


def test_a_unit_the_table_does_not_know_is_placed_by_its_number_of_tests():
    table = {"tests/a.py": 30.0, "tests/b.py": 10.0}  # 4 tests in 40 s: 10 s a test
    nodeids = ["tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t1", "tests/b.py::t2", "tests/new.py::t1"]
    nodeids += [f"tests/big.py::t{i}" for i in range(5)]
    seconds = expected_seconds(nodeids, table)
    assert seconds == {"tests/a.py": 30.0, "tests/b.py": 10.0, "tests/new.py": 10.0, "tests/big.py": 50.0}
    order = sorted(seconds, key=lambda unit: -seconds[unit])
    assert order[0] == "tests/big.py" and order[1] == "tests/a.py"


def test_with_no_table_the_units_are_ordered_by_their_number_of_tests():
    seconds = expected_seconds(["tests/a.py::t1", "tests/b.py::t1", "tests/b.py::t2"], {})
    assert seconds["tests/b.py"] > seconds["tests/a.py"]


def test_the_committed_table_names_only_units_that_exist():
    table = read_table(TABLE)
    assert table, f"{TABLE} is empty or missing"
    missing = [unit for unit in table if not (ROOT / unit).exists()]
    assert not missing, f"{TABLE.name} names units that are gone (refresh it: docs/testing.md, 'Wall time'): {missing}"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_writes_each_units_seconds_and_tests_longest_first(tmp_path, workers):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slow.py").write_text(
        "import time\n\ndef test_a():\n    time.sleep(0.6)\n\ndef test_b():\n    pass\n"
    )
    (suite / "test_quick.py").write_text(
        "import pytest\n\ndef test_c():\n    pass\n\n@pytest.mark.skip(reason='x')\ndef test_d():\n    pass\n"
    )
    log = tmp_path / "units.tsv"
    env = {**os.environ, "LIFTBRIDGE_UNIT_TIMES": str(log), "PYTHONPATH": str(ROOT)}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.unit_times", "-n", workers]
        + ["--rootdir", str(suite), "-c", os.devnull, str(suite)],
        cwd=suite,
        env=env,
        check=True,
        capture_output=True,
    )
    rows = {line.split("\t")[1].rsplit("/", 1)[-1]: line.split("\t") for line in log.read_text().splitlines()}
    assert set(rows) == {"test_slow.py", "test_quick.py"}
    assert float(rows["test_slow.py"][0]) >= 0.6  # its sleep, at least
    seconds = [float(line.split("\t")[0]) for line in log.read_text().splitlines()]
    assert seconds == sorted(seconds, reverse=True)
    assert [row[2] for row in rows.values()] == ["2", "2"]
    assert {row[3] for row in rows.values()} <= ({"main"} if workers == "0" else {"gw0", "gw1"})
    assert all(int(row[6]) > 2 and int(row[7]) > 2 for row in rows.values())  # stdin, stdout, stderr and more
