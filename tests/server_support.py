"""Starting a dev server for a test or a module: one context manager, so every fixture that needs a
server of its own (cursors off, NATS with TLS or credentials, a cluster) starts and stops it alike."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from airflow_provider_liftbridge.devserver import DevServer


@contextlib.contextmanager
def running_devserver(**options: Any) -> Iterator[DevServer]:
    """A started :class:`DevServer` with ``options``, stopped on exit (also when the test fails)."""
    server = DevServer(**options)
    server.start()
    try:
        yield server
    finally:
        server.stop()
