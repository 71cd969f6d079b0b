"""The set-up shared by the tests that cut a partition leader off on a three-broker dev cluster
(devserver/isolation.py's fault hook): the cluster, a stream replicated on all three brokers with
the leader it got, and the wait for the majority to elect another one."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServerProcess
from tests import margins

from .campaign import replica_of

#: How long the majority may take to elect a new leader once the old one is cut off: the leader
#: timeout of any cluster here, many times over.
ELECTION_WAIT = 30.0


@contextmanager
def three_brokers(prefix: str, timings: ClusterTimings) -> Iterator[DevServerProcess]:
    """A three-broker dev cluster with ``timings``, in a process of its own, its data in a
    temporary directory named after ``prefix``; stopped and removed at the end."""
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as data,
        DevServerProcess(Path(data), brokers=3, timings=timings) as server,
    ):
        yield server


def replicated_stream(cluster: DevServerProcess, stream: str) -> tuple[int, list[str]]:
    """Create ``stream`` (one partition) replicated on all three brokers; return the index of its
    leader in ``cluster.addresses`` and the addresses of the other two, the majority."""
    addresses = cluster.addresses
    with LiftbridgeClient(addresses, timeout=5.0, max_retries=8) as admin:
        admin.create_stream(stream, stream, replication_factor=3)
    leader = cluster.broker_ids.index(replica_of(addresses, stream, 0, "leader"))
    return leader, [a for i, a in enumerate(addresses) if i != leader]


def wait_for_new_leader(cluster: DevServerProcess, majority: list[str], stream: str, leader: int) -> None:
    """Wait until the majority names another broker than ``leader`` (an index) the leader of
    partition 0 of ``stream``."""
    margins.wait_until(
        lambda: replica_of(majority, stream, 0, "leader") != cluster.broker_ids[leader],
        ELECTION_WAIT,
        "the majority elected a new leader",
        interval=0.1,
    )
