"""One subscriber per consumer group per partition (devserver/group_subscribers.py), over raw gRPC stubs.

Liftbridge's rule (``server/partition.go``, ``partition.Subscribe``; liftbridge-semantics.md): a
Subscribe carrying ``consumer`` replaces the group's current subscriber on the partition when its
epoch is at least that one's, and the server ends the replaced subscription (status OK); an older
epoch is refused with FAILED_PRECONDITION "Consumer is not currently assigned this partition".

Every wait here is on a condition (a handshake, a message, the end of a call), never on a pause: the
sleeps of the Go client's sequence (0.5 s between the joins, 2 s before publishing) only give its
goroutines time to subscribe, which the tests wait for instead.
"""

from __future__ import annotations

import threading
import time
import uuid

import grpc

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.devserver import DevServer
from tests import margins

from .helpers import TIMEOUT, create, known_everywhere, publish
from .test_groups import fetch, join

Stub = api_pb2_grpc.APIStub
NOT_ASSIGNED = "Consumer is not currently assigned this partition"


def _group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


def consumer(group: str, consumer_id: str, epoch: int) -> pb.Consumer:
    return pb.Consumer(groupId=group, consumerId=consumer_id, groupEpoch=epoch)


class Reader:
    """A Subscribe call read on a thread: its handshake, the values it delivered, and how it ended."""

    def __init__(
        self, stub: Stub, stream: str, partition: int = 0, member: pb.Consumer | None = None, **fields: object
    ) -> None:
        req = pb.SubscribeRequest(
            stream=stream, partition=partition, startPosition=pb.NEW_ONLY, consumer=member, **fields
        )
        self._call = stub.Subscribe(req, timeout=60)
        self._cond = threading.Condition()
        self.started = False
        self.values: list[bytes] = []
        self.ended = False
        self.code: grpc.StatusCode | None = None
        self.details = ""
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        code, details = grpc.StatusCode.OK, ""
        try:
            for msg in self._call:
                with self._cond:
                    if self.started:
                        self.values.append(msg.value)
                    else:
                        self.started = msg.ByteSize() == 0  # the handshake
                    self._cond.notify_all()
        except grpc.RpcError as err:
            code, details = err.code(), err.details() or ""
        with self._cond:
            self.ended, self.code, self.details = True, code, details
            self._cond.notify_all()

    def _wait(self, what: str, check: object) -> None:
        start, where = time.monotonic(), margins.caller(3)
        with self._cond:
            done = self._cond.wait_for(check, TIMEOUT)  # type: ignore[arg-type]
            margins.record(f"{what} ({where})", time.monotonic() - start, TIMEOUT, timed_out=not done)
            if not done:
                raise AssertionError(f"{what}: not within {TIMEOUT} s (ended={self.ended}, {self.code} {self.details})")

    def wait_started(self) -> Reader:
        """Wait for the handshake (fails if the call ended without one)."""
        self._wait("handshake", lambda: self.started or self.ended)
        assert self.started, f"refused: {self.code} {self.details}"
        return self

    def wait_values(self, n: int) -> list[bytes]:
        self._wait(f"{n} values", lambda: len(self.values) >= n or self.ended)
        assert len(self.values) >= n, f"ended after {self.values}: {self.code} {self.details}"
        return list(self.values)

    def wait_ended(self) -> tuple[grpc.StatusCode | None, str]:
        self._wait("end of the call", lambda: self.ended)
        return self.code, self.details

    def cancel(self) -> None:
        self._call.cancel()
        self.wait_ended()


def test_go_client_sequence_each_partition_reaches_one_member(stub: Stub, stream_name: str) -> None:
    """go-liftbridge's consumer-group step: ``a`` joins a group on a 3-partition stream and subscribes
    to its partitions; ``b`` joins and subscribes to the partition the rebalance gave it; two messages
    go to each partition. ``a`` has not fetched its assignments again (the Go client heartbeats every
    0.7 x the consumer timeout, 10.5 s), so only the server can stop it reading what moved to ``b``."""
    create(stub, stream_name, partitions=3)
    group = _group()
    joined_a = join(stub, group, "a", stream_name)
    assigned_a, epoch_a = fetch(stub, group, "a", joined_a.epoch)
    assert assigned_a == {stream_name: [0, 1, 2]}
    a = {p: Reader(stub, stream_name, p, consumer(group, "a", epoch_a)) for p in assigned_a[stream_name]}
    for reader in a.values():
        reader.wait_started()
    joined_b = join(stub, group, "b", stream_name)
    assigned_b, epoch_b = fetch(stub, group, "b", joined_b.epoch)
    assert assigned_b == {stream_name: [1]} and epoch_b > epoch_a  # (on Liftbridge the epoch is a Raft index)
    b = {p: Reader(stub, stream_name, p, consumer(group, "b", epoch_b)) for p in assigned_b[stream_name]}
    b[1].wait_started()
    # b's subscribe (epoch 1) ended a's subscription to partition 1 (epoch 0) on the server, with OK.
    assert a[1].wait_ended() == (grpc.StatusCode.OK, "")
    for p in (0, 1, 2):
        for i in range(2):
            publish(stub, stream_name, f"{p}-{i}".encode(), partition=p)
    got = {("a", p): a[p].wait_values(2) for p in (0, 2)} | {("b", 1): b[1].wait_values(2)}
    assert got == {("a", 0): [b"0-0", b"0-1"], ("a", 2): [b"2-0", b"2-1"], ("b", 1): [b"1-0", b"1-1"]}
    assert a[1].values == []  # ended before the publishes: partition 1's messages reached b only
    assert not (a[0].ended or a[2].ended or b[1].ended)
    for reader in (a[0], a[2], b[1]):
        reader.cancel()


def test_older_epoch_is_refused_and_equal_or_newer_replaces(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    group = _group()
    # Liftbridge does not look the group up on Subscribe: no such group, no members, no assignments.
    plain = Reader(stub, stream_name).wait_started()  # no consumer: the rule does not apply to it
    first = Reader(stub, stream_name, member=consumer(group, "a", 1)).wait_started()
    stale = Reader(stub, stream_name, member=consumer(group, "b", 0))
    assert stale.wait_ended() == (grpc.StatusCode.FAILED_PRECONDITION, NOT_ASSIGNED)
    assert not stale.started  # refused before the handshake, as Liftbridge refuses it
    publish(stub, stream_name, b"m1")
    assert first.wait_values(1) == [b"m1"]  # the refusal left the current subscriber alone
    equal = Reader(stub, stream_name, member=consumer(group, "b", 1)).wait_started()
    assert first.wait_ended() == (grpc.StatusCode.OK, "")
    other_group = Reader(stub, stream_name, member=consumer(_group(), "z", 0)).wait_started()  # groups apart
    publish(stub, stream_name, b"m2")
    assert equal.wait_values(1) == [b"m2"]
    newer = Reader(stub, stream_name, member=consumer(group, "a", 7)).wait_started()
    assert equal.wait_ended() == (grpc.StatusCode.OK, "")
    publish(stub, stream_name, b"m3")
    assert newer.wait_values(1) == [b"m3"]
    assert first.values == [b"m1"] and equal.values == [b"m2"]
    assert plain.wait_values(3) == [b"m1", b"m2", b"m3"] and other_group.wait_values(2) == [b"m2", b"m3"]
    for reader in (plain, other_group, newer):
        reader.cancel()


def test_an_ended_subscription_frees_its_group_slot(stub: Stub, stream_name: str) -> None:
    create(stub, stream_name)
    group = _group()
    held = Reader(stub, stream_name, member=consumer(group, "a", 3)).wait_started()
    held.cancel()  # the server forgets the group's subscriber once its call is gone
    older = Reader(stub, stream_name, member=consumer(group, "b", 1)).wait_started()
    older.cancel()


def test_a_consumer_replacing_itself_leaves_no_group_subscriber(stub: Stub, stream_name: str) -> None:
    """Liftbridge takes an ended subscription out of its partition by consumer id (partition.go,
    ``removeGroupSubscriber``): when a consumer's new Subscribe replaced its own old one, the old
    one's end removes the new one's record, and an older epoch is accepted afterwards."""
    create(stub, stream_name)
    group = _group()
    old = Reader(stub, stream_name, member=consumer(group, "a", 2)).wait_started()
    new = Reader(stub, stream_name, member=consumer(group, "a", 2)).wait_started()
    assert old.wait_ended() == (grpc.StatusCode.OK, "")
    late = Reader(stub, stream_name, member=consumer(group, "b", 0)).wait_started()
    publish(stub, stream_name, b"m")
    assert new.wait_values(1) == late.wait_values(1) == [b"m"]
    new.cancel()
    late.cancel()


def test_group_subscribe_without_a_consumer_id_is_refused_first(stub: Stub, stream_name: str) -> None:
    # Checked before the partition is looked up, as Liftbridge does: a missing stream answers the same.
    for stream in (stream_name, "nope-" + stream_name):
        if stream == stream_name:
            create(stub, stream)
        reader = Reader(stub, stream, member=pb.Consumer(groupId=_group()))
        assert reader.wait_ended() == (
            grpc.StatusCode.INVALID_ARGUMENT,
            "Consumer id cannot be empty when group id is provided",
        )
        assert not reader.started
    # A consumer without a group id is no group subscriber (Liftbridge looks at the group id only).
    Reader(stub, stream_name, member=pb.Consumer(consumerId="a", groupEpoch=5)).wait_started().cancel()


def test_group_subscribe_on_an_isr_replica_is_refused(cluster: DevServer, stream_name: str) -> None:
    stubs = [api_pb2_grpc.APIStub(grpc.insecure_channel(a)) for a in cluster.addresses]
    create(stubs[0], stream_name, replicationFactor=3)
    known_everywhere(stubs, stream_name)
    meta = stubs[0].FetchMetadata(pb.FetchMetadataRequest(streams=[stream_name]), timeout=TIMEOUT)
    leader = meta.streamMetadata[0].partitions[0].leader
    follower = stubs[next(i for i, b in enumerate(cluster.broker_ids) if b != leader)]
    member = consumer(_group(), "a", 0)
    refused = Reader(follower, stream_name, member=member, readISRReplica=True)
    assert refused.wait_ended() == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "Consumer groups not compatible with ReadISRReplica",
    )
    Reader(follower, stream_name, readISRReplica=True).wait_started().cancel()  # without a group: served
    # On the leader, readISRReplica changes nothing: the group rule applies as anywhere.
    leader_stub = stubs[cluster.broker_ids.index(leader)]
    Reader(leader_stub, stream_name, member=member, readISRReplica=True).wait_started().cancel()
