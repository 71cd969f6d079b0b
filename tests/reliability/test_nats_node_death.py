"""At-least-once publishing when a NATS server dies (issue 24 point 3): a 3-node cluster of real
``nats-server`` processes; the node the client and the brokers use is SIGKILLed in the middle of a
publish, over NATS (bulk) and over gRPC. Both reconnect to a surviving node and go on.

What must hold: nothing is lost; a record the partition certainly does not hold is sent again,
one it may hold is sent again only as the last resort; and every re-send is counted in the write
statistics and logged at WARNING, so that a duplicate never comes silently. (Before this, the bulk
path re-sent every unacknowledged frame without looking and reported plain success.)

Needs processes of its own: skipped against an external cluster (no node to kill there).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess

from .scenarios import count, read_stream, values

pytestmark = [pytest.mark.timeout(120)]


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@pytest.fixture
def nats_cluster() -> Iterator[list[NatsServerProcess]]:
    """Three ``nats-server`` processes routed to each other (one NATS cluster)."""
    ports = _free_ports(6)
    client_ports, route_ports = ports[:3], ports[3:]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in route_ports)
    nodes = [
        NatsServerProcess(
            port=client_ports[i],
            extra_args=["--cluster_name", "t", "--cluster", f"nats://127.0.0.1:{route_ports[i]}", "--routes", routes],
        )
        for i in range(3)
    ]
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.mark.parametrize("path", ["nats", "grpc"])
def test_the_nats_node_of_the_client_and_the_brokers_killed_mid_publish(
    nats_cluster: list[NatsServerProcess], caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """The node both the client and the brokers use dies; both reconnect to another one. The
    followers, as Liftbridge's, fetch again only ``replica_max_idle_wait`` (3 s here, 10 s on
    Liftbridge) later, so ALL acks stall: the default wait for them outlasts that, so nothing
    times out. The client's own timeout is 2 s, which the former default would have used."""
    n = 20000 if path == "nats" else 3000
    records = values(n)
    stream = f"nats-kill-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger="airflow_provider_liftbridge.client")
    timings = ClusterTimings.fast(replica_max_idle_wait=3.0, replica_max_lag_time=15.0, replica_max_leader_timeout=15.0)
    urls = [node.url for node in nats_cluster]
    with DevServer(brokers=3, nats_url=urls[0], timings=timings) as server:
        with LiftbridgeClient(server.addresses, nats_servers=urls, timeout=2.0) as client:
            client.create_stream(stream, stream, replication_factor=3)
            # Over NATS a batch sent while the brokers reconnect is dropped and waits out its ack
            # time-out before the check re-sends it: 5 s here, not the 20 s default, for the suite's time.
            wait = 5.0 if path == "nats" else None
            options = PublishOptions(ack_policy=AckPolicy.ALL, path=path, timeout=wait)
            publisher = client.batch_publisher(stream, options, write_stats=True)
            stats = publisher.stats
            assert stats is not None
            failure: list[BaseException] = []

            def publish() -> None:
                try:
                    publisher.publish(records, batch=n // 10)
                except BaseException as exc:  # reported below
                    failure.append(exc)

            thread = threading.Thread(target=publish)
            thread.start()
            deadline = time.monotonic() + 60
            while stats.acks < n // 4 and thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            acked_at_kill = stats.acks
            nats_cluster[0].kill()
            thread.join(90)
            assert not thread.is_alive(), "the publish did not finish"
            if failure:
                raise failure[0]
            in_stream, lost, duplicated = count(records, read_stream(client, stream))
    assert acked_at_kill < n, "the node was killed after the publish"
    assert lost == 0
    # Every copy beyond one is a counted, logged re-send; nothing is duplicated silently.
    assert duplicated <= stats.resent
    warned = [r for r in caplog.records if "re-sen" in r.getMessage()]
    assert bool(warned) == (stats.resent > 0), (stats.resent, [r.getMessage() for r in warned])
    assert stats.summary()["resent"] == stats.resent
