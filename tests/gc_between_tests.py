"""Full garbage collections between tests, not inside them.

A test worker's heap grows to about a million tracked objects (Airflow, PySpark and what hundreds
of tests leave in caches). A full collection of it costs 0.3-0.7 s of CPU, and while it runs no
other thread of the process runs: not the test's client, not the in-process dev server's brokers.
On a busy machine that is 1-5 s of wall time. The stall witness (tests/stall_watch.py) of a busy
whole-suite run (issue 45, run e1, load 2-11) wrote down 25 full collections of over a second
(1.1-4.6 s, 0.25-0.76 s CPU, 0.39-0.96 M objects), among them 3.3 s inside the bulk-leader fault
test and 3.9 s inside the Spark streaming DAG test; 23 of its 24 stalls over a second were one of
them. Tests whose servers time out members or leaders after 2-5 s fail on such a stall.

So after each test this collects once (no test is running then) and freezes what survived
(``gc.freeze``): the collections a test's own allocations trigger traverse only what was made since,
milliseconds' worth. What a frozen object still holds is never collected; the worker's memory may
grow by what later becomes cyclic garbage among those objects, for one test process's lifetime.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
