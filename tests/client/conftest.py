"""Client fixtures: every behaviour test runs against both clients.

``client`` is a :class:`LiftbridgeClient`, or an :class:`AsyncLiftbridgeClient` driven from a
private event-loop thread behind the same blocking surface (``AsyncAsSync``), so one test body
checks every transport against the real dev server: the blocking one, and the asyncio one with
each subscription reader (``"thread"``, its default, and ``"aio"``, the triggers' choice).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient


class AsyncAsSync:
    """Blocking view of an AsyncLiftbridgeClient: coroutines run on a dedicated loop thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.inner: AsyncLiftbridgeClient = self._call(self._make(args, kwargs))

    @staticmethod
    async def _make(args: Any, kwargs: Any) -> AsyncLiftbridgeClient:
        return AsyncLiftbridgeClient(*args, **kwargs)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(120)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("subscribe", "subscribe_columns"):
            return lambda *a, **k: self._iterate(attr(*a, **k))
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self._call(attr(*a, **k))
        return attr

    def _iterate(self, agen: Any) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._call(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._call(agen.aclose())

    def close(self) -> None:
        self._call(self.inner.close())

    def shutdown(self) -> None:
        """Close the client and stop the loop thread."""
        if self._loop.is_running():
            self._call(self.inner.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> AsyncAsSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


@pytest.fixture(params=["sync", "async", "async-aio"])
def make_client(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory of clients of the parametrised kind; all are closed after the test."""
    made: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        if request.param == "sync":
            c: Any = LiftbridgeClient(*args, **kwargs)
        elif request.param == "async":
            c = AsyncAsSync(*args, **kwargs)
        else:
            c = AsyncAsSync(*args, subscription_reader="aio", **kwargs)
        made.append(c)
        return c

    yield make
    for c in made:
        getattr(c, "shutdown", c.close)()


@pytest.fixture
def client(make_client: Any, lb_address: str) -> Any:
    """A client of the session dev server (sync or async, see module doc)."""
    return make_client(lb_address, timeout=5.0)
