"""Shared fixtures (docs/contracts.md): a real dev server with a real nats-server child.

- ``devserver`` (session): one single-broker in-process :class:`DevServer` for the whole run.
- ``lb_address`` / ``nats_url``: its gRPC address (``host:port``) and NATS URL.
- ``stream_name``: a fresh, unique stream name per test (use it as the subject too).
- ``cluster``: a 3-broker :class:`DevServer` per test, torn down afterwards.
- ``fast_cluster``: the same with test time-outs (``ClusterTimings.fast()``: a follower leaves the
  ISR and a dead leader is replaced after 0.5 s, the restart window is a tenth of the real one),
  for the fault hooks (``stall_broker``, ``kill_broker``, ``restart_cluster``, ...).

Teardown is robust: servers stop in ``finally`` blocks, ``DevServer`` also registers an
``atexit`` stop, and the nats-server child is started with a parent-death signal
(``setpriv --pdeathsig``), so it goes away even when the test process is killed.
"""

from __future__ import annotations

from tests.airflow_support import configure_airflow

# Airflow reads AIRFLOW_HOME once, at first import: point every test folder (Spark included)
# at a throw-away home before anything imports Airflow.
configure_airflow()

import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer  # noqa: E402

# The Spark cluster, Spark Connect server and SparkSession: session fixtures shared by tests/spark
# and tests/dags (one SparkContext per process), defined once.
pytest_plugins = ["tests.spark_fixtures"]


@pytest.fixture(scope="session")
def devserver() -> Iterator[DevServer]:
    """A single-broker dev server shared by the whole test session."""
    server = DevServer(brokers=1)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def lb_address(devserver: DevServer) -> str:
    """``host:port`` of the session dev server's broker."""
    return devserver.address


@pytest.fixture(scope="session")
def nats_url(devserver: DevServer) -> str:
    """NATS URL of the session dev server."""
    return devserver.nats_url


@pytest.fixture
def stream_name() -> str:
    """A stream name no other test uses (valid as a NATS subject too)."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cluster() -> Iterator[DevServer]:
    """A fresh 3-broker dev server for one test."""
    server = DevServer(brokers=3)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fast_cluster() -> Iterator[DevServer]:
    """A fresh 3-broker dev server with test time-outs (``ClusterTimings.fast()``) for one test."""
    server = DevServer(brokers=3, timings=ClusterTimings.fast())
    server.start()
    try:
        yield server
    finally:
        server.stop()
