"""Exactly-once publishing without optimistic concurrency control through a slow link (issue 59,
item 3; the campaign's seeds 59203 and 59206): the first send's publishes wait in the link, their
acks time out, and the resumption must not send again what that send still delivers.

The dev server and its nats-server sit behind a :class:`~tests.netfaults.Link`; skipped where
namespaces cannot be made. Before the fix, the publisher closed the NATS connection and re-read
at once: the kernel went on sending the closed socket's data, so the first send's records landed
after the scan and the resumption's copies beside them (each record stored twice).
"""

from __future__ import annotations

import subprocess

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher
from airflow_provider_liftbridge.client.exactly_once.identity import PRODUCER_HEADER, SEQ_HEADER
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.devserver.process import DevServerProcess
from tests.margins import wait_until
from tests.netfaults import Link, linked_devserver

__all__ = ["linked_devserver", "unsent_to"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(300)

Served = tuple[Link, DevServerProcess]

#: The link's rate towards the server: 2 KB/s, with tbf's 5 s of queue (10 KB) in front of it.
RATE = "16kbit"
#: Records of the slowed batch and their size: about 8 s of the link, several times the ack wait,
#: more than its queue holds (the rest waits in the client's kernel), and below the keepalive.
RECORDS, SIZE = 16, 1000


def unsent_to(host: str, port: int, at_least: int = 1) -> list[str]:
    """The TCP sockets of this network namespace towards ``host:port`` that still hold at least
    ``at_least`` bytes the peer has not acknowledged (``ss``'s Send-Q): closed sockets the kernel
    keeps sending included."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "all", "dst", f"{host}:{port}"], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if len(line.split()) >= 3 and int(line.split()[2]) >= at_least]


def _nats_port(server: DevServerProcess) -> int:
    return int(server.nats_url.rsplit(":", 1)[1])


def test_records_held_up_in_a_slow_link_are_stored_once(linked_devserver: Served) -> None:
    link, server = linked_devserver
    producer = "slow-link"
    values = [f"{i:04d}".encode() * (SIZE // 4) for i in range(10 + RECORDS)]
    with LiftbridgeClient(
        server.address,
        nats_servers=[server.nats_url],
        timeout=5.0,
        # Longer than the link's whole backlog: a slow link is not a lost one (docs/reliability.md).
        keepalive_time=30.0,
        keepalive_timeout=30.0,
    ) as client:
        client.create_stream("s", "s")
        options = PublishOptions(path="nats", ack_policy=AckPolicy.LEADER, timeout=1.0)
        with ExactlyOncePublisher(client, "s", producer, options=options, tail_wait=120.0) as publisher:
            first = publisher.publish(values[:10])  # the cursor stored, the NATS connection open
            assert first.written == 10
            link.slow(RATE, direction="in")
            result = publisher.publish(values[10:])
            link.heal()
        assert result.written + result.skipped == RECORDS
        assert result.resumes >= 1, "the acks came in time: the test proves nothing"
        # Whatever the client's kernel still held for NATS has arrived (or was dropped by a reset).
        wait_until(lambda: not unsent_to(link.inside, _nats_port(server)), 120, "the client's NATS sockets to drain")
        # A marker behind it: NATS has passed on what came before, so the broker stored it first.
        marker = client.publish("s", b"marker").offset
        seqs = [
            int(m.headers[SEQ_HEADER])
            for m in client.subscribe("s", start_at=0, stop_at=marker)
            if m.headers.get(PRODUCER_HEADER) == producer.encode()
        ]
    twice = sorted({s for s in seqs if seqs.count(s) > 1})
    assert not twice, f"records stored twice: {twice}"
    assert sorted(seqs) == list(range(10 + RECORDS))


def test_records_cut_off_past_the_flush_are_dropped_not_delivered_late(linked_devserver: Served) -> None:
    # The first send's NATS connection is cut off (its packets dropped, the rest of the link
    # fine), its records in the client's kernel, past the flush's bound (tail_wait): the
    # resumption sends them again on a new connection. The old connection must be reset by then,
    # so that nothing of it goes out when it is let through again after the call. Before, the
    # kernel kept the closed socket's data and delivered it then: each record twice, after a
    # call that had returned.
    link, server = linked_devserver
    producer = "held-link"
    port = _nats_port(server)
    values = [f"{i:04d}".encode() * (SIZE // 4) for i in range(10 + RECORDS)]
    with LiftbridgeClient(server.address, nats_servers=[server.nats_url], timeout=5.0) as client:
        client.create_stream("s", "s")
        options = PublishOptions(path="nats", ack_policy=AckPolicy.LEADER, timeout=1.0)
        with ExactlyOncePublisher(client, "s", producer, options=options, tail_wait=2.0) as publisher:
            assert publisher.publish(values[:10]).written == 10  # the NATS connection is open
            [connection] = unsent_to(link.inside, port, at_least=0)
            try:
                link.hold(int(connection.split()[3].rsplit(":", 1)[1]))  # its local port
            except subprocess.CalledProcessError as exc:
                pytest.skip(f"cannot drop one connection's packets here (tc htb/u32): {exc.stderr!r}")
            try:
                result = publisher.publish(values[10:])
            finally:
                link.heal()  # lets the held connection through, if it still exists
        assert result.written + result.skipped == RECORDS
        assert result.resumes >= 1, "the acks came in time: the test proves nothing"
        wait_until(lambda: not unsent_to(link.inside, port), 120, "the client's NATS sockets to drain")
        marker = client.publish("s", b"marker").offset
        seqs = [
            int(m.headers[SEQ_HEADER])
            for m in client.subscribe("s", start_at=0, stop_at=marker)
            if m.headers.get(PRODUCER_HEADER) == producer.encode()
        ]
    twice = sorted({s for s in seqs if seqs.count(s) > 1})
    assert not twice, f"records stored twice: {twice}"
    assert sorted(seqs) == list(range(10 + RECORDS))
