"""A flake hunt's witness (docs/testing.md): with ``LIFTBRIDGE_STALL_LOG=FILE`` (``scripts/test.sh
--busy`` sets it), every test process appends a line to FILE whenever its Python code could not
run for over :data:`STALL` seconds (``LIFTBRIDGE_STALL_SECONDS`` for another bound), and for every
full garbage collection that took as long.

Several failures of the busy runs need the test process (and the in-process dev server in it) to
stand still for seconds; this says whether it did, when, in which test, and whether the process
was running meanwhile (its CPU time went on: the GIL was held, by a collection or C code) or
waiting for a core (it did not: the machine was starved). One line per event::

    2026-12-05T18:10:02 gw1 stall 6.31 s (cpu 0.12 s) in tests/hooks/test_connection_test.py::test_x
    2026-12-05T18:10:02 gw1 gc gen2 1.84 s (cpu 1.80 s, 2,113,004 objects) in tests/...::test_y
"""

from __future__ import annotations

import datetime as dt
import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

#: Seconds a 0.1 s sleep (or a full collection) may take beyond its due before it is written down.
STALL = float(os.environ.get("LIFTBRIDGE_STALL_SECONDS", "1.0"))

_BETWEEN = "(between tests)"
_current = [_BETWEEN]
_gc_started: list[tuple[float, float]] = []


def _write(log: Path, what: str, test: str) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    stamp = dt.datetime.now().isoformat(timespec="seconds")
    with log.open("a") as out:
        out.write(f"{stamp} {worker} {what} in {test}\n")


def _watch(log: Path) -> None:
    while True:
        wall, cpu, test = time.monotonic(), time.process_time(), _current[0]
        time.sleep(0.1)
        late = time.monotonic() - wall - 0.1
        if late > STALL:  # named after the tests that ran when it began and when it ended
            tests = dict.fromkeys(t for t in (test, _current[0]) if t != _BETWEEN) or {_BETWEEN: None}
            _write(log, f"stall {late:.2f} s (cpu {time.process_time() - cpu:.2f} s)", " / ".join(tests))


def _on_gc(log: Path, phase: str, info: dict[str, Any]) -> None:
    if info.get("generation") != 2:
        return
    if phase == "start":
        _gc_started[:] = [(time.monotonic(), time.process_time())]
    elif _gc_started:
        (wall, cpu), _gc_started[:] = _gc_started[0], []
        took = time.monotonic() - wall
        if took > STALL:
            objects = len(gc.get_objects(generation=2))
            what = f"gc gen2 {took:.2f} s (cpu {time.process_time() - cpu:.2f} s, {objects:,} objects)"
            _write(log, what, _current[0])


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get("LIFTBRIDGE_STALL_LOG")
    if not path:
        return
    log = Path(path)
    threading.Thread(target=_watch, args=(log,), name="stall-watch", daemon=True).start()
    gc.callbacks.append(lambda phase, info: _on_gc(log, phase, info))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    _current[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current[0] = _BETWEEN
