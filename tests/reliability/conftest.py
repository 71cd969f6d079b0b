"""Fault-injection suite: every test here carries the ``reliability`` marker. Airflow is
configured (temporary home, SQLite) as for the Airflow-layer folders.

``fault_cluster``: the brokers a scenario marked ``external_cluster`` runs against: the cluster of
``LIFTBRIDGE_TEST_BROKERS`` (and ``LIFTBRIDGE_TEST_NATS``) when set, else a three-broker dev cluster
whose metadata leader is not the client's first broker (as after a re-election) and whose new
streams reach the other brokers 0.05 s late (the propagation delay seen on a real cluster).

``freezable``: for the frozen-broker scenarios, the external cluster with its freeze and thaw
command templates (``--freeze-cmd`` / ``--thaw-cmd``, see ``freezing.py``), or ``None`` for a dev
cluster of the scenario's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from tests.airflow_conftest import *  # noqa: F403
from tests.conftest import EXTERNAL_BROKERS, EXTERNAL_NATS

from .freezing import ExternalFreezable, FreezableCluster, find_broker, match_brokers

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
def freezable(request: pytest.FixtureRequest) -> FreezableCluster | None:
    """The external cluster with its freeze and thaw commands (``freezing.py``), or ``None`` for a
    dev cluster the scenario starts itself. Skips with the reason when the commands are missing."""
    if not EXTERNAL_BROKERS:
        return None
    freeze, thaw = request.config.getoption("--freeze-cmd"), request.config.getoption("--thaw-cmd")
    if not (freeze and thaw):
        pytest.skip(
            "freezing a broker of the external cluster needs --freeze-cmd and --thaw-cmd (or LIFTBRIDGE_TEST_FREEZE_CMD"
            " and LIFTBRIDGE_TEST_THAW_CMD): shell command templates with {index} {id} {address} {host} {port}, e.g."
            " 'docker pause liftbridge-{index}' and 'docker unpause liftbridge-{index}' (tests/reliability/freezing.py)"
        )
    addresses = [a.strip() for a in EXTERNAL_BROKERS.split(",")]
    with LiftbridgeClient(addresses, timeout=5.0) as client:
        brokers = match_brokers(addresses, client.fetch_metadata().brokers)
    if len(brokers) < 3:
        pytest.skip(
            f"freezing one broker of three needs at least 3 brokers in LIFTBRIDGE_TEST_BROKERS, got {len(brokers)}"
        )
    leader = request.config.getoption("--metadata-leader")
    leader_cmd = request.config.getoption("--metadata-leader-cmd")
    return ExternalFreezable(brokers, freeze, thaw, find_broker(leader, brokers) if leader else None, leader_cmd)


@pytest.fixture
def fault_cluster() -> Iterator[FaultCluster]:
    if EXTERNAL_BROKERS:
        yield FaultCluster([a.strip() for a in EXTERNAL_BROKERS.split(",")], EXTERNAL_NATS, external=True)
        return
    with DevServer(brokers=3, timings=ClusterTimings.fast(stream_propagation=0.05)) as server:
        server.move_metadata_leader(2)
        yield FaultCluster(server.addresses, server.nats_url, external=False)
