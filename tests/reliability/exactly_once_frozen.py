"""Exactly-once scenarios of issue 24 points 1 and 2 (ADR 8), each returning its figures like
``scenarios.py``:

- **a broker frozen mid-publish** (SIGSTOP-like, then thawed), in each role in turn: a follower,
  the metadata leader, the client's first broker (also the metadata leader, as ``rc-1`` in the
  issue), the partition leader; with and without optimistic concurrency control. A frozen broker
  carries out what it received when it wakes, even after the client gave up on it (the dev
  server's cluster models that, see docs/devserver.md), so a record re-sent meanwhile would be
  stored twice;
- **two overlapping tries** of one exactly-once task: the first still writing (an orphaned task
  process) when the retry starts.

The stream is read back record by record (values ``rec-000123``), not through the publisher's own
headers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from airflow_provider_liftbridge.client import AckPolicy, BatchPublisher, LiftbridgeClient, Record
from airflow_provider_liftbridge.client.exactly_once import ConcurrentProducerError, ExactlyOncePublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND
from airflow_provider_liftbridge.client.types import Ack
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer

from .scenarios import Figures, _hw, _in_thread, _joined, _partition, _wait_until, count, read_stream, values

#: The roles a frozen broker can have, for :func:`frozen_broker`.
ROLES = ("follower", "metadata leader", "first broker", "partition leader")


def _stream_not_led_by(client: LiftbridgeClient, broker_id: str, occ: bool) -> str:
    """A new three-replica stream whose partition leader is not ``broker_id`` (the dev server
    gives a new partition to the broker leading the fewest)."""
    for _ in range(4):
        stream = f"frozen-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, replication_factor=3, optimistic_concurrency_control=occ)
        if _partition(client, stream).leader != broker_id:
            return stream
    raise AssertionError(f"every new stream is led by {broker_id}")


def frozen_broker(role: str, occ: bool, n: int = 400, stall: float = 3.0) -> Figures:
    """An exactly-once publish over gRPC (ack policy ALL, ack timeout 1 s) while one broker of
    three is frozen for ``stall`` seconds, then thawed. A frozen partition leader is replaced
    after 1.5 s and comes back as a follower."""
    started = time.monotonic()
    timings = ClusterTimings.fast(replica_max_lag_time=6.0, replica_max_leader_timeout=1.5)
    with DevServer(brokers=3, timings=timings) as cluster:
        ids, addresses = cluster.broker_ids, cluster.addresses
        meta = cluster.metadata_leader  # broker 0 when the cluster starts
        admin = LiftbridgeClient(addresses, timeout=5.0, max_retries=6)
        stream = _stream_not_led_by(admin, ids[meta], occ)
        leader = ids.index(_partition(admin, stream).leader)
        other = next(i for i in range(3) if i not in (meta, leader))
        frozen, first = {
            "follower": (other, meta),
            "metadata leader": (meta, other),
            "first broker": (meta, meta),
            "partition leader": (leader, meta),
        }[role]
        order = [first] + [i for i in range(3) if i != first]
        client = LiftbridgeClient([addresses[i] for i in order], timeout=2.0, max_retries=6)
        # The publisher is another task: it learns the stream from metadata once its first broker
        # lists it. A new stream reaches the brokers other than the metadata leader and the
        # partition leader a moment later, and a client that never saw a stream believes "no such
        # stream" at once (client/presence.py), so publishing within that moment would fail loudly.
        _wait_until(lambda: stream in client.fetch_metadata([stream]).streams, 10, "the stream on the first broker")
        records = values(n)
        publisher = ExactlyOncePublisher(
            client,
            stream,
            f"frozen-{role}",
            batch=40,
            max_resumes=16,
            tail_wait=20.0,
            options=PublishOptions(path="grpc", ack_policy=AckPolicy.ALL, window=16, timeout=1.0),
        )
        thread, result, failure = _in_thread(lambda: publisher.publish(records))
        _wait_until(lambda: _hw(admin, stream) >= n // 4, 60, "a quarter of the records")
        cluster.stall_broker(frozen)
        time.sleep(stall)
        cluster.resume_broker(frozen)
        done = _joined(thread, result, failure, 120)
        _wait_until(lambda: len(set(_partition(admin, stream).isr)) == 3, 30, "the thawed broker back in the ISR")
        time.sleep(0.5)  # anything the thawed broker still held has been carried out by now
        in_stream, lost, dup = count(records, read_stream(admin, stream))
        client.close()
        admin.close()
    return Figures(
        f"cluster: {role} frozen mid-publish (exactly-once, gRPC, {'OCC' if occ else 'no OCC'})",
        f"1 broker (of 3) frozen {stall:g} s, ack ALL, ack timeout 1 s",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"written {done.written}, resumes {done.resumes}, duplicates seen {publisher.duplicates_seen}",
    )


class _Orphan:
    """The publisher of an orphaned task process: the real batch publisher, slowed to one batch
    every ``pause`` seconds so that it is still writing when the retry starts."""

    def __init__(self, inner: BatchPublisher, pause: float) -> None:
        self.inner = inner
        self.pause = pause

    def send(self, records: Sequence[Record]) -> Sequence[Ack]:
        time.sleep(self.pause)
        return self.inner.send(records)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


def overlapping_tries(occ: bool = False, n: int = 2000) -> Figures:
    """Try 1 of an exactly-once task (producer ``dag/task/run``) publishes ``n`` records slowly;
    try 2 starts when a quarter is in the stream. Try 2 must not write beside try 1: it waits
    until try 1's records stop arriving, then skips them (or fails naming the other writer)."""
    started = time.monotonic()
    with DevServer() as server:
        client = LiftbridgeClient(server.address, timeout=5.0)
        stream = f"zombie-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream, optimistic_concurrency_control=occ)
        records = values(n)
        producer = "dag/publish/manual__2024-06-01"
        inner = client.batch_publisher(stream, PublishOptions(path="grpc", window=32, timeout=2.0, resend=NO_RESEND))
        zombie = ExactlyOncePublisher(
            client, stream, producer, publisher=_Orphan(inner, 0.03), batch=25, options=PublishOptions(timeout=2.0)
        )
        thread, result, failure = _in_thread(lambda: zombie.publish(records))
        _wait_until(lambda: _hw(client, stream) >= n // 4, 60, "a quarter of try 1's records")
        retry_client = LiftbridgeClient(server.address, timeout=5.0)
        retry = ExactlyOncePublisher(
            retry_client, stream, producer, batch=500, zombie_wait=60.0, options=PublishOptions(timeout=2.0)
        )
        try:
            outcome = retry.publish(records)
            note = f"retry wrote {outcome.written}, skipped {outcome.skipped}"
        except ConcurrentProducerError as exc:
            note = f"retry failed: {type(exc).__name__} (duplicates {exc.duplicates})"
        first = _joined(thread, result, failure, 120)
        in_stream, lost, dup = count(records, read_stream(client, stream))
        retry_client.close()
        client.close()
    return Figures(
        f"two overlapping tries of one exactly-once task ({'OCC' if occ else 'no OCC'})",
        "try 2 starts while try 1 (an orphan) is still writing",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"try 1 wrote {first.written}; {note}",
    )
