"""Publishing when a NATS server dies (issue 24 point 3): a 3-node cluster of real ``nats-server``
processes; the node the client and the brokers use is SIGKILLed in the middle of a publish, over
NATS (bulk) and over gRPC, at least once and exactly once. Both reconnect to a surviving node and
go on.

What must hold: nothing is lost; a record the partition certainly does not hold is sent again,
one it may hold is sent again only as the last resort; and every re-send is counted in the write
statistics and logged at WARNING, so that a duplicate never comes silently. (Before this, the bulk
path re-sent every unacknowledged frame without looking and reported plain success.) Exactly once,
every record is in the stream once: the publish succeeds, or fails with a typed error after which
a retry with the same producer id completes.

Needs processes of its own: skipped against an external cluster (no node to kill there).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import AckPolicy, LiftbridgeClient, LiftbridgeError, PublishOptions
from airflow_provider_liftbridge.client.exactly_once import (
    ExactlyOncePublisher,
    ExactlyOncePublishError,
    ExactlyOnceResult,
)
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from tests import processes
from tests.margins import bounded

from .scenarios import count, read_stream, values

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def nats_cluster() -> Iterator[list[NatsServerProcess]]:
    """Three ``nats-server`` processes routed to each other (one NATS cluster)."""
    nodes = processes.nats_cluster(3)
    try:
        for node in nodes:
            node.start()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


#: Timings of the brokers: as Liftbridge's, a follower that lost its NATS node fetches again only
#: ``replica_max_idle_wait`` later (3 s here, 10 s on Liftbridge), so ALL acks stall that long.
_TIMINGS = ClusterTimings.fast(replica_max_idle_wait=3.0, replica_max_lag_time=15.0, replica_max_leader_timeout=15.0)


def _kill_mid_publish(
    nats_cluster: list[NatsServerProcess], publish: Callable[[], Any], reached: Callable[[], bool]
) -> tuple[Any, BaseException | None]:
    """Run ``publish`` on a thread, SIGKILL the NATS node the client and the brokers use once
    ``reached()`` holds (checked every 10 ms), and wait for the publish to end.

    :returns: what ``publish`` returned (None if it raised) and what it raised (None if nothing).
    """
    outcome: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(publish())
        except BaseException as exc:  # reported to the caller
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    with bounded("the publish got under way", 60):
        deadline = time.monotonic() + 60
        while not reached() and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
    assert thread.is_alive(), "the publish ended before the node was killed"
    nats_cluster[0].kill()
    thread.join(90)
    assert not thread.is_alive(), "the publish did not finish"
    return (outcome[0] if outcome else None), (failure[0] if failure else None)


@pytest.mark.parametrize("path", ["nats", "grpc"])
def test_the_nats_node_of_the_client_and_the_brokers_killed_mid_publish(
    nats_cluster: list[NatsServerProcess], caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """The node both the client and the brokers use dies; both reconnect to another one. The
    followers' fetches stall (see ``_TIMINGS``), so ALL acks stall: the default wait for them
    outlasts that, so nothing times out. The client's own timeout is 2 s, which the former
    default would have used."""
    n = 20000 if path == "nats" else 3000
    records = values(n)
    stream = f"nats-kill-{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger="airflow_provider_liftbridge.client")
    urls = [node.url for node in nats_cluster]
    with DevServer(brokers=3, nats_url=urls[0], timings=_TIMINGS) as server:
        with LiftbridgeClient(server.addresses, nats_servers=urls, timeout=2.0) as client:
            client.create_stream(stream, stream, replication_factor=3)
            # Over NATS a batch sent while the brokers reconnect is dropped and waits out its ack
            # time-out before the check re-sends it: 5 s here, not the 20 s default, for the suite's time.
            wait = 5.0 if path == "nats" else None
            options = PublishOptions(ack_policy=AckPolicy.ALL, path=path, timeout=wait)
            publisher = client.batch_publisher(stream, options, write_stats=True)
            # At the end of the third batch of ten: acks of one batch and records of the next are
            # in flight, so acks of stored records are lost with the node (found by reading, not
            # re-sent) as often as records themselves (re-sent).
            kill_at = 3 * (n // 10) - 10
            stats = publisher.stats
            assert stats is not None
            _, failure = _kill_mid_publish(
                nats_cluster, lambda: publisher.send_all(records, batch=n // 10), lambda: stats.acks >= kill_at
            )
            if failure is not None:
                raise failure
            in_stream, lost, duplicated = count(records, read_stream(client, stream))
    assert lost == 0
    # Every copy beyond one is a counted, logged re-send; nothing is duplicated silently.
    assert duplicated <= stats.resent
    warned = [r for r in caplog.records if "re-sen" in r.getMessage()]
    assert bool(warned) == (stats.resent > 0), (stats.resent, [r.getMessage() for r in warned])
    assert stats.summary()["resent"] == stats.resent


@pytest.mark.parametrize("max_resumes", [8, 0], ids=["resumed", "retried"])
@pytest.mark.parametrize("path", ["nats", "grpc"])
def test_exactly_once_with_the_nats_node_of_the_client_and_the_brokers_killed_mid_publish(
    nats_cluster: list[NatsServerProcess], path: str, max_resumes: int
) -> None:
    """The same death under an exactly-once publish (ADRs 2 and 8): every record ends up in the
    stream once. The ack timeout (1 s) is shorter than the commit stall, so a send fails for sure.
    With resumptions allowed the publisher resumes (waits for the tail, reads, sends what is
    missing) and succeeds; with none it fails loudly with an :class:`ExactlyOncePublishError`,
    and a retry with the same producer id completes, writing only what is missing."""
    n = 2000
    records = values(n)
    stream = f"nats-kill-eo-{uuid.uuid4().hex[:8]}"
    producer = f"dag/publish/nats-kill-{path}"
    urls = [node.url for node in nats_cluster]
    with DevServer(brokers=3, nats_url=urls[0], timings=_TIMINGS) as server:
        with (
            LiftbridgeClient(server.addresses, nats_servers=urls, timeout=2.0) as client,
            LiftbridgeClient(server.addresses, timeout=2.0) as watcher,
        ):
            client.create_stream(stream, stream, replication_factor=3)
            options = PublishOptions(ack_policy=AckPolicy.ALL, path=path, timeout=1.0)

            def exactly_once(resumes: int) -> ExactlyOnceResult:
                return ExactlyOncePublisher(
                    client, stream, producer, batch=100, max_resumes=resumes, tail_wait=20.0, options=options
                ).publish(records)

            def quarter_committed() -> bool:
                try:
                    return watcher.fetch_partition_metadata(stream, 0).high_watermark >= n // 4
                except LiftbridgeError:  # the leader is reconnecting
                    return False

            done, failure = _kill_mid_publish(nats_cluster, lambda: exactly_once(max_resumes), quarter_committed)
            if max_resumes:
                assert failure is None, repr(failure)
                assert done.resumes >= 1, done  # the death was felt
                assert done.written + done.skipped == n, done
            else:
                # Loudly, typed, with what was done so far; the retry resumes without duplicates.
                assert isinstance(failure, ExactlyOncePublishError), repr(failure)
                retried = exactly_once(8)
                assert retried.written + retried.skipped == n, retried
                # What the failed try had acknowledged is skipped, not written again (so are the
                # records it stored without an ack).
                assert retried.skipped >= failure.result.written, (failure.result, retried)
            in_stream, lost, duplicated = count(records, read_stream(watcher, stream))
    assert (lost, duplicated) == (0, 0), (in_stream, lost, duplicated, failure)
    assert in_stream == n
