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
headers. Both also run on an external cluster (``LIFTBRIDGE_TEST_BROKERS``); freezing one of its
brokers takes the command templates of ``freezing.py``.
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

from .freezing import DevFreezable, FreezableCluster
from .scenarios import Figures, _hw, _in_thread, _joined, _partition, _wait_until, count, read_stream, values

#: The roles a frozen broker can have, for :func:`frozen_broker`.
ROLES = ("follower", "metadata leader", "first broker", "partition leader")


#: The dev cluster of :func:`frozen_broker`: a frozen partition leader is replaced after 1.5 s.
DEV_TIMINGS = ClusterTimings.fast(replica_max_lag_time=6.0, replica_max_leader_timeout=1.5)


def _new_stream(client: LiftbridgeClient, ids: list[str], avoid: int | None, occ: bool) -> list[str]:
    """New three-replica streams until one is not led by broker ``avoid`` (the dev server, like
    Liftbridge, gives a new partition to a broker leading few, so each one led by ``avoid`` makes
    the next one likelier elsewhere): all of them, the one to use last."""
    made: list[str] = []
    for _ in range(6):
        made.append(f"frozen-{uuid.uuid4().hex[:8]}")
        client.create_stream(made[-1], made[-1], replication_factor=3, optimistic_concurrency_control=occ)
        if avoid is None or _partition(client, made[-1]).leader != ids[avoid]:
            return made
    raise AssertionError(f"every new stream is led by {ids[avoid]}")


def frozen_and_first(role: str, meta: int | None, leader: int, replicas: Sequence[int]) -> tuple[int, int]:
    """``(broker to freeze, client's first broker)`` for ``role``, by index. With the metadata
    leader known (``meta``), the client's first broker is the metadata leader (as ``rc-1`` in the
    issue) except when the metadata leader is frozen; unknown, it is a follower.

    :raises ValueError: the role needs the metadata leader and ``meta`` is ``None``.
    """
    followers = [i for i in replicas if i != leader]
    if meta is None:
        if role in ("metadata leader", "first broker"):
            raise ValueError(f"freezing the {role} needs to know the metadata leader")
        return {"follower": (followers[0], followers[1]), "partition leader": (leader, followers[0])}[role]
    other = next(i for i in followers if i != meta)
    return {
        "follower": (other, meta),
        "metadata leader": (meta, other),
        "first broker": (meta, meta),
        "partition leader": (leader, meta),
    }[role]


def frozen_broker(
    role: str, occ: bool, n: int = 400, stall: float = 3.0, cluster: FreezableCluster | None = None
) -> Figures:
    """An exactly-once publish over gRPC (ack policy ALL, ack timeout 1 s) while one broker of
    three is frozen for ``stall`` seconds, then thawed, on ``cluster`` (default: a dev cluster of
    its own with :data:`DEV_TIMINGS`, whose frozen partition leader is replaced after 1.5 s and
    comes back as a follower)."""
    if cluster is None:
        with DevServer(brokers=3, timings=DEV_TIMINGS) as server:
            return _frozen_broker(DevFreezable(server), role, occ, n, stall)
    return _frozen_broker(cluster, role, occ, n, stall)


def _frozen_broker(cluster: FreezableCluster, role: str, occ: bool, n: int, stall: float) -> Figures:
    started = time.monotonic()
    ids, addresses, meta = cluster.broker_ids, cluster.addresses, cluster.metadata_leader
    admin = LiftbridgeClient(addresses, timeout=5.0, max_retries=6)
    made = _new_stream(admin, ids, meta, occ)
    stream = made[-1]
    part = _partition(admin, stream)
    frozen, first = frozen_and_first(role, meta, ids.index(part.leader), [ids.index(r) for r in part.replicas])
    order = [first] + [i for i in range(len(addresses)) if i != first]
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
    _wait_until(lambda: bool(failure) or _hw(admin, stream) >= n // 4, 60, "a quarter of the records")
    if failure:
        raise failure[0]  # the publisher gave up before the fault: no need to wait any longer
    cluster.freeze(frozen)
    try:
        time.sleep(stall)
    finally:
        cluster.thaw(frozen)
    done = _joined(thread, result, failure, 120)
    _wait_until(lambda: len(set(_partition(admin, stream).isr)) == 3, 30, "the thawed broker back in the ISR")
    time.sleep(0.5)  # anything the thawed broker still held has been carried out by now
    in_stream, lost, dup = count(records, read_stream(admin, stream))
    for name in made:
        admin.delete_stream(name)  # an external cluster keeps no litter
    client.close()
    admin.close()
    where = "external cluster" if cluster.external else "cluster"
    return Figures(
        f"{where}: {role} frozen mid-publish (exactly-once, gRPC, {'OCC' if occ else 'no OCC'})",
        f"1 broker (of {len(addresses)}) frozen {stall:g} s, ack ALL, ack timeout 1 s",
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


def overlapping_tries(occ: bool = False, n: int = 2000, addresses: list[str] | None = None) -> Figures:
    """Try 1 of an exactly-once task (producer ``dag/task/run``) publishes ``n`` records slowly;
    try 2 starts when a quarter is in the stream. Try 2 must not write beside try 1: it waits
    until try 1's records stop arriving, then skips them (or fails naming the other writer).
    Runs on the cluster of ``addresses`` (default: a dev server of its own)."""
    if addresses is None:
        with DevServer() as server:
            return _overlapping_tries(occ, n, [server.address])
    return _overlapping_tries(occ, n, addresses)


def _overlapping_tries(occ: bool, n: int, addresses: list[str]) -> Figures:
    started = time.monotonic()
    client = LiftbridgeClient(addresses, timeout=5.0)
    stream = f"zombie-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream, optimistic_concurrency_control=occ)
    records = values(n)
    producer = "dag/publish/manual__2024-06-01"
    inner = client.batch_publisher(stream, PublishOptions(path="grpc", window=32, timeout=2.0, resend=NO_RESEND))
    zombie = ExactlyOncePublisher(
        client, stream, producer, publisher=_Orphan(inner, 0.03), batch=25, options=PublishOptions(timeout=2.0)
    )
    thread, result, failure = _in_thread(lambda: zombie.publish(records))
    _wait_until(lambda: bool(failure) or _hw(client, stream) >= n // 4, 60, "a quarter of try 1's records")
    if failure:
        raise failure[0]
    retry_client = LiftbridgeClient(addresses, timeout=5.0)
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
    client.delete_stream(stream)
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
