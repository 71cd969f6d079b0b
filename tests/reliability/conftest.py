"""Fault-injection suite: every test here carries the ``reliability`` marker. Airflow is
configured (temporary home, SQLite) as for the Airflow-layer folders.

``fault_cluster``: the brokers a scenario marked ``external_cluster`` runs against: the cluster of
``LIFTBRIDGE_TEST_BROKERS`` (and ``LIFTBRIDGE_TEST_NATS``) when set, else a three-broker dev cluster
whose metadata leader is not the client's first broker (as after a re-election) and whose new
streams reach the other brokers 0.05 s late (the propagation delay seen on a real cluster).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from tests.airflow_conftest import *  # noqa: F403
from tests.conftest import EXTERNAL_BROKERS, EXTERNAL_NATS

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


@dataclass(frozen=True)
class FaultCluster:
    """Where a scenario runs: broker addresses, a NATS URL ("" when unknown), and whether it is an
    external cluster (no fault hooks there)."""

    addresses: list[str]
    nats_url: str
    external: bool


@pytest.fixture
def fault_cluster() -> Iterator[FaultCluster]:
    if EXTERNAL_BROKERS:
        yield FaultCluster([a.strip() for a in EXTERNAL_BROKERS.split(",")], EXTERNAL_NATS, external=True)
        return
    with DevServer(brokers=3, timings=ClusterTimings.fast(stream_propagation=0.05)) as server:
        server.move_metadata_leader(2)
        yield FaultCluster(server.addresses, server.nats_url, external=False)
