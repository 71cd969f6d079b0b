"""A pytest plugin that runs every selected test N times and prints pass/fail counts per test:
the flake hunt of ``scripts/repeat.sh`` (docs/testing.md, "Flakes").

``python -m pytest -p tests.repeat --repeat 20 tests/client/test_consumer.py::test_x`` runs the
test 20 times in a row (ids ``...[rep0]`` ... ``[rep19]``, so fixtures of function scope are made
anew each time) and ends with a table: per test, how many runs passed and failed. A test that
fails once in twenty under load has a timing assumption in it (or in the code it tests).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import pytest

_STEP = "_repeat_step"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("repeat").addoption(
        "--repeat", type=int, default=1, metavar="N", help="run each selected test N times (tests/repeat.py)"
    )


@pytest.fixture
def _repeat_step(request: pytest.FixtureRequest) -> int:
    """Which run of the test this is (0 .. N-1)."""
    return int(request.param)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    count = int(metafunc.config.getoption("repeat"))
    if count > 1:
        metafunc.fixturenames.append(_STEP)
        metafunc.parametrize(_STEP, range(count), indirect=True, ids=[f"rep{i}" for i in range(count)])


def _test_of(nodeid: str) -> str:
    """The test a repeated node id belongs to: ``f.py::t[rep3]`` -> ``f.py::t``, ``t[a-rep3]`` -> ``t[a]``."""
    base, _, params = nodeid.partition("[")
    if not params:
        return nodeid
    params = params[:-1]
    rest = "-".join(p for p in params.split("-") if not re.fullmatch(r"rep\d+", p))
    return f"{base}[{rest}]" if rest else base


_counts: dict[str, Counter[str]] = defaultdict(Counter)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    test = _test_of(report.nodeid)
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "skipped" if report.skipped else ("passed" if report.passed else "failed")
        _counts[test][outcome] += 1
    elif report.when == "teardown" and report.failed:
        _counts[test]["failed"] += 1  # an error in teardown counts as a failed run


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _counts:
        return
    terminalreporter.section("repeat: runs per test")
    for test, counts in sorted(_counts.items()):
        runs = sum(counts.values())
        line = f"{counts['passed']:4d} passed {counts['failed']:4d} failed"
        if counts["skipped"]:
            line += f" {counts['skipped']:4d} skipped"
        terminalreporter.write_line(f"{line}  of {runs:4d}  {test}")
