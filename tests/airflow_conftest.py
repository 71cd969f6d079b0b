"""Fixtures shared by the Airflow-layer test folders (hooks, operators, sensors, triggers, dags).

Each of those folders' ``conftest.py`` does ``from tests.airflow_conftest import *`` so Airflow is
configured before its tests import it, and they all see the same fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.airflow_support import configure_airflow, conn_env_name, init_db, liftbridge_conn_json

configure_airflow()

from airflow_provider_liftbridge.triggers.event import HAS_ACK_MODE  # noqa: E402 - after configure_airflow()

#: Tests of the event trigger's ack mode on Airflow's shared stream (``airflow.triggers.shared_stream``:
#: the cursor moves once events are stored, back-pressure): Airflow 3.3+ only.
needs_ack_mode = pytest.mark.skipif(
    not HAS_ACK_MODE, reason="needs Airflow 3.3+: airflow.triggers.shared_stream (the event trigger's ack mode)"
)

__all__ = ["airflow_db", "liftbridge_conn", "liftbridge_client"]


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """A migrated SQLite metadata database (needed by ``dag.test()``)."""
    init_db()


@pytest.fixture
def liftbridge_conn(monkeypatch: pytest.MonkeyPatch, lb_address: str, nats_url: str) -> str:
    """``liftbridge_default`` pointing at the session dev server, with its NATS server; returns the id."""
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(lb_address, nats_url=nats_url))
    return "liftbridge_default"


@pytest.fixture
def liftbridge_client(lb_address: str) -> Iterator[object]:
    """A plain client of the dev server, for setting up and checking what the Airflow layer did."""
    from airflow_provider_liftbridge.client import LiftbridgeClient

    with LiftbridgeClient(lb_address) as client:
        yield client
