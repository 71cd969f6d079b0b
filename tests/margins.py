"""The margin report (docs/testing.md, "The margin report"): how much of its deadline every wait
of a test used.

With ``LIFTBRIDGE_MARGIN_LOG=FILE`` (``scripts/test.sh`` sets it), every test process appends to
FILE, after each test, one line per wait of that test: the largest share of its deadline that
wait used (over all the times it ran in the test), the seconds used and the deadline, how it ended
and where it is::

    0.412\t2.06\t5.00\tok\ttests/devserver/test_cluster.py::test_x\tsubscribe (tests/devserver/test_cluster.py:51)

A wait that used a large share of its deadline on a quiet machine fails on a busy one; the report
finds it before the busy machine does. ``timeout`` lines are waits that ran out, which a passing
test meant (it asserts that nothing comes); they are not margins and are left out of the worst.

The waits report through :func:`record`: the tests' wait helpers call it (:func:`wait_until`,
:func:`bounded` around a hand-written poll loop,
``tests/devserver/helpers.py``'s ``subscribe``, ``scripts/deployment.py``'s ``wait_until`` through
its ``on_wait`` hook); and while the log is set, the standard waits called from a file under
``tests/`` report themselves: ``concurrent.futures.Future.result``, ``asyncio.wait_for``,
``threading.Thread.join`` and ``threading.Event.wait`` with a timeout. The cost is a clock read and
a dictionary update per wait, and one append per test.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

_T = TypeVar("_T")
_LOG = os.environ.get("LIFTBRIDGE_MARGIN_LOG", "")
_TESTS = str(Path(__file__).resolve().parent) + os.sep
_lock = threading.Lock()
#: (test id, wait) -> (share, used, deadline, timed out) of the wait's largest share in that test.
_worst: dict[tuple[str, str], tuple[float, float, float, bool]] = {}


def _test_id() -> str:
    current = os.environ.get("PYTEST_CURRENT_TEST", "")  # "nodeid (call)", pytest's own
    return current.rsplit(" (", 1)[0] if current else "(no test)"


def record(wait: str, used: float, deadline: float, *, timed_out: bool = False) -> None:
    """Note that ``wait`` (what was awaited, and where) took ``used`` of its ``deadline`` seconds
    in the running test; ``timed_out`` when it ran out. Nothing happens unless the log is set."""
    if not _LOG or deadline <= 0:
        return
    share = used / deadline
    key = (_test_id(), wait)
    with _lock:
        if key not in _worst or share > _worst[key][0]:
            _worst[key] = (share, used, deadline, timed_out)


@contextmanager
def timed(wait: str, deadline: float) -> Iterator[None]:
    """Record how long the body took of ``deadline``; a ``TimeoutError`` leaving it, or a body
    that took longer than ``deadline`` (a hand-written poll loop that raised its own error), counts
    as running out."""
    start = time.monotonic()
    timed_out = False
    try:
        yield
    except TimeoutError:
        timed_out = True
        raise
    finally:
        used = time.monotonic() - start
        record(wait, used, deadline, timed_out=timed_out or used > deadline)


def bounded(what: str, deadline: float) -> contextlib.AbstractContextManager[None]:
    """:func:`timed` for a hand-written poll loop: records under ``what`` and the caller's
    ``file:line``."""
    return timed(f"{what} ({caller()})", deadline)


def wait_until(
    check: Callable[[], _T], timeout: float, what: str, interval: float = 0.01, *, where: str | None = None
) -> _T:
    """Call ``check`` until it returns something true; return that, and record the margin under
    ``what`` and ``where`` (default: the caller's ``file:line``).

    :raises AssertionError: ``timeout`` seconds passed first (``what`` says what was awaited).
    """
    polls = _polls(check, timeout, what, where or caller())
    try:
        while True:
            next(polls)
            time.sleep(interval)
    except StopIteration as done:
        return done.value


async def until(
    check: Callable[[], _T], timeout: float, what: str, interval: float = 0.01, *, where: str | None = None
) -> _T:
    """:func:`wait_until` for a coroutine: polls with ``asyncio.sleep`` between checks.

    :raises AssertionError: ``timeout`` seconds passed first.
    """
    polls = _polls(check, timeout, what, where or caller())
    try:
        while True:
            next(polls)
            await asyncio.sleep(interval)
    except StopIteration as done:
        return done.value


def _polls(check: Callable[[], _T], timeout: float, what: str, where: str) -> Generator[None, None, _T]:
    """The poll loop of :func:`wait_until` and :func:`until` without its sleeps: yields where the
    caller sleeps, returns the first true result, and records the margin either way."""
    start = time.monotonic()
    while True:
        result = check()
        used = time.monotonic() - start
        if result:
            record(f"{what} ({where})", used, timeout)
            return result
        if used > timeout:
            record(f"{what} ({where})", used, timeout, timed_out=True)
            raise AssertionError(f"{what}: not within {timeout:g} s")
        yield


def flush() -> None:
    """Append what the waits recorded since the last flush to the log."""
    with _lock:
        worst = dict(_worst)
        _worst.clear()
    if not _LOG or not worst:
        return
    lines = [
        f"{share:.3f}\t{used:.2f}\t{deadline:.2f}\t{'timeout' if out else 'ok'}\t{test}\t{wait}\n"
        for (test, wait), (share, used, deadline, out) in worst.items()
    ]
    with open(_LOG, "a") as log:  # one write of a few lines: workers' appends do not interleave
        log.write("".join(lines))


def caller(depth: int = 2) -> str:
    """``file:line`` of the caller of the function calling this (``depth`` frames up, skipping
    this module's), relative to the repository: where a wait helper was called from."""
    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    root = str(Path(_TESTS).parent) + os.sep
    return f"{name.removeprefix(root)}:{frame.f_lineno}"


def _from_tests() -> str | None:
    """``file:line`` of the caller's caller if it is a test file (not this one), else None."""
    frame = sys._getframe(2)
    name = frame.f_code.co_filename
    if not name.startswith(_TESTS) or name == __file__:
        return None
    return f"{name.removeprefix(str(Path(_TESTS).parent) + os.sep)}:{frame.f_lineno}"


def _patch_standard_waits() -> None:
    """Make the standard waits with a timeout report themselves when a test file calls them."""
    result = concurrent.futures.Future.result

    @functools.wraps(result)
    def future_result(self: concurrent.futures.Future[Any], timeout: float | None = None) -> Any:
        where = _from_tests() if timeout else None
        if where is None:
            return result(self, timeout)
        with timed(f"Future.result ({where})", timeout):  # type: ignore[arg-type]
            return result(self, timeout)

    wait_for = asyncio.wait_for

    @functools.wraps(wait_for)
    def asyncio_wait_for(aw: Any, timeout: float | None) -> Any:
        where = _from_tests() if timeout else None
        if where is None:
            return wait_for(aw, timeout)

        async def waiting() -> Any:
            with timed(f"asyncio.wait_for ({where})", timeout):  # type: ignore[arg-type]
                return await wait_for(aw, timeout)

        return waiting()

    join = threading.Thread.join

    @functools.wraps(join)
    def thread_join(self: threading.Thread, timeout: float | None = None) -> None:
        where = _from_tests() if timeout else None
        if where is None:
            return join(self, timeout)
        start = time.monotonic()
        join(self, timeout)
        record(f"Thread.join ({where})", time.monotonic() - start, timeout, timed_out=self.is_alive())  # type: ignore[arg-type]
        return None

    event_wait = threading.Event.wait

    @functools.wraps(event_wait)
    def wait(self: threading.Event, timeout: float | None = None) -> bool:
        where = _from_tests() if timeout else None
        if where is None:
            return event_wait(self, timeout)
        start = time.monotonic()
        done = event_wait(self, timeout)
        record(f"Event.wait ({where})", time.monotonic() - start, timeout, timed_out=not done)  # type: ignore[arg-type]
        return done

    concurrent.futures.Future.result = future_result  # type: ignore[method-assign]
    asyncio.wait_for = asyncio_wait_for  # type: ignore[assignment]
    threading.Thread.join = thread_join  # type: ignore[method-assign]
    threading.Event.wait = wait  # type: ignore[method-assign]


def pytest_configure(config: pytest.Config) -> None:
    if not _LOG:
        return
    _patch_standard_waits()
    try:  # scripts/deployment.py's waits (the system tier, the demo) report through its hook
        from scripts import deployment
    except ImportError:
        return
    deployment.on_wait = record


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    flush()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    flush()  # what session fixtures' teardowns waited for
