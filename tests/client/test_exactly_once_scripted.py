"""Exactly-once resumption under an uncommitted tail, driven step by step on a virtual clock.

The publisher and the client are the real ones; the network is a script (``scripted.py``) that
answers from a model of one partition as its leader sees it: a log, a high watermark below the
newest offset while a follower is stalled, optimistic concurrency control checked against the
log's end, and a leader change that truncates what was never committed. Time is virtual, so a
7-second stall takes no time and every reading is deterministic. The same cases run against the
dev server's cluster in ``tests/reliability``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import (
    Ack,
    AckPolicy,
    AckTimeoutError,
    IncorrectOffsetError,
    LiftbridgeClient,
    NoSuchStreamError,
    PublishError,
    Record,
)
from airflow_provider_liftbridge.client.effects import Cancel, OpenStream, Read, RpcFailure, Sleep, Unary
from airflow_provider_liftbridge.client.exactly_once import (
    PRODUCER_HEADER,
    SEQ_HEADER,
    ExactlyOncePublisher,
    ExactlyOncePublishError,
    UncommittedTailError,
)
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.types import AckError

from .scripted import scripted_client

TIMEOUT = 2.0  # the publisher's ack timeout, as in the reproduction


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Partition:
    """Partition 0 of stream ``s`` on a three-broker cluster, as its leader sees it."""

    def __init__(self, clock: Clock, *, occ: bool = False) -> None:
        self.clock = clock
        self.occ = occ
        self.log: list[api_pb2.Message] = []
        self.hw = -1
        self.cursors: dict[str, int] = {}
        self.stalled_until: float | None = None  # a follower is stopped until then (None: never stalled)
        self.stalled = False
        self.truncate_at: float | None = None  # a new leader, without the uncommitted tail, takes over then
        self.restarted_at: float | None = None  # the whole cluster was (re)started then
        self.deleted = False  # stream s was deleted (stream o is still there)

    def restart(self) -> None:
        """A full-cluster restart now, with the window observed on a real cluster: metadata
        without streams for 0.3 s, no leaders (and "no such stream" on publish) until 1.5 s, high
        watermarks reading -1 (nothing commits) until 9 s."""
        self.restarted_at = self.clock.now

    def _since_restart(self) -> float:
        return float("inf") if self.restarted_at is None else self.clock.now - self.restarted_at

    @property
    def newest(self) -> int:
        return len(self.log) - 1

    def stall(self, until: float = float("inf"), truncate_at: float | None = None) -> None:
        self.stalled, self.stalled_until, self.truncate_at = True, until, truncate_at

    def tick(self) -> None:
        if self.truncate_at is not None and self.clock.now >= self.truncate_at:
            del self.log[self.hw + 1 :]
            self.truncate_at, self.stalled = None, False
        if self.stalled and self.stalled_until is not None and self.clock.now >= self.stalled_until:
            self.stalled = False
        if not self.stalled and self._since_restart() >= 9.0:
            self.hw = self.newest

    def append(self, record: Record) -> int:
        self.log.append(api_pb2.Message(offset=len(self.log), value=record.value, headers=dict(record.headers or {})))
        self.tick()
        return self.newest

    def values(self) -> list[bytes]:
        return [m.value for m in self.log]

    # -- the script: answers to the client's effects -------------------------------------------
    def answer(self, effect: Any) -> Any:
        self.tick()
        if isinstance(effect, Sleep):
            self.clock.sleep(effect.seconds)
            return None
        if isinstance(effect, Unary):
            return self._unary(effect.method, effect.request)
        if isinstance(effect, OpenStream):  # Subscribe: the handshake, committed messages, the stop
            if self._since_restart() < 1.5:
                return iter([RpcFailure(grpc.StatusCode.NOT_FOUND, "No such partition")])
            start, stop = effect.request.startOffset, min(effect.request.stopOffset, self.hw)
            return iter([api_pb2.Message(), *self.log[start : stop + 1],
                         RpcFailure(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")])  # fmt: skip
        if isinstance(effect, Read):
            item = next(effect.handle)
            if isinstance(item, RpcFailure):
                raise item
            return item
        if isinstance(effect, Cancel):
            return None
        raise AssertionError(f"unexpected effect {effect!r}")

    def _unary(self, method: str, request: Any) -> Any:
        since = self._since_restart()
        if method == "FetchMetadata":
            brokers = [api_pb2.Broker(id="b1", host="a", port=1)]
            if since < 0.3:
                return api_pb2.FetchMetadataResponse(brokers=brokers)
            if self.deleted:
                other = api_pb2.PartitionMetadata(id=0, leader="b1")
                return api_pb2.FetchMetadataResponse(
                    brokers=brokers,
                    streamMetadata=[api_pb2.StreamMetadata(name="o", subject="o", partitions={0: other})],
                )
            leader = "b1" if since >= 1.5 else ""
            part = api_pb2.PartitionMetadata(id=0, leader=leader, replicas=["b1", "b2", "b3"], isr=["b1", "b2", "b3"])
            return api_pb2.FetchMetadataResponse(
                brokers=brokers, streamMetadata=[api_pb2.StreamMetadata(name="s", subject="s", partitions={0: part})]
            )
        if method == "FetchPartitionMetadata":
            if since < 1.5:
                raise RpcFailure(grpc.StatusCode.NOT_FOUND, "partition not found")
            hw = self.hw if since >= 9.0 else -1
            return api_pb2.FetchPartitionMetadataResponse(
                metadata=api_pb2.PartitionMetadata(id=0, leader="b1", highWatermark=hw, newestOffset=self.newest)
            )
        if method == "FetchCursor":
            return api_pb2.FetchCursorResponse(offset=self.cursors.get(request.cursorId, -1))
        if method == "SetCursor":
            self.cursors[request.cursorId] = request.offset
            return api_pb2.SetCursorResponse()
        raise AssertionError(f"unexpected call {method}")


class Sender:
    """The publisher's sender, against the model: the leader appends what it receives (checking
    the expected offset with OCC); while a follower is stalled no ack comes (ack policy ALL), and
    the ack timeout passes on the virtual clock."""

    def __init__(self, part: Partition) -> None:
        self.part = part
        self.sent: list[Record] = []

    def send(self, records: list[Record]) -> Sequence[Ack]:
        part, acks = self.part, []
        for i, record in enumerate(records):
            self.sent.append(record)
            part.tick()
            if part._since_restart() < 1.5 or part.deleted:
                error = NoSuchStreamError("stream 's' does not exist (server said: \"no such stream: s\")")
                raise PublishError("refused", acks=acks + [None] * (len(records) - i), index=i, errors={i: error})
            if part.occ and record.expected_offset != part.newest + 1:
                error = IncorrectOffsetError(f"expected {record.expected_offset}, next is {part.newest + 1}")
                raise PublishError("refused", acks=acks + [None] * (len(records) - i), index=i, errors={i: error})
            offset = part.append(record)
            if part.stalled or part._since_restart() < 9.0:
                part.clock.sleep(TIMEOUT)
                raise PublishError(
                    "no ack", acks=acks + [None] * (len(records) - i), index=i, errors={i: AckTimeoutError("no ack")}
                )
            acks.append(Ack("s", 0, "s", "s", offset, "", "", AckPolicy.ALL, 0, 0, AckError.OK))
        return acks

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def _setup(occ: bool = False) -> tuple[Clock, Partition, Sender, LiftbridgeClient]:
    clock = Clock()
    part = Partition(clock, occ=occ)
    return clock, part, Sender(part), scripted_client(part.answer, timeout=TIMEOUT)


def _publisher(client: LiftbridgeClient, sender: Sender, clock: Clock, **kw: Any) -> ExactlyOncePublisher:
    publisher = ExactlyOncePublisher(
        client, "s", "p", publisher=sender, **kw, options=PublishOptions(timeout=TIMEOUT, ack_policy=AckPolicy.ALL)
    )
    publisher.timer.now, publisher.timer.sleep = clock, clock.sleep
    return publisher


def _ours(part: Partition) -> Counter[int]:
    return Counter(int(m.headers[SEQ_HEADER]) for m in part.log if m.headers.get(PRODUCER_HEADER) == b"p")


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
def test_a_stalled_follower_is_waited_out_and_nothing_is_written_twice(occ: bool) -> None:
    # The reproduction: record 0 committed; a follower stops; record 1 is appended by the
    # leader but not committed, its ack times out; the follower comes back after 7 s.
    clock, part, sender, client = _setup(occ)
    publisher = _publisher(client, sender, clock)
    publisher.publish([b"r0"])
    part.stall(until=clock.now + 7.0)
    result = publisher.publish([b"r1"])
    assert _ours(part) == {0: 1, 1: 1}
    assert [r.value for r in sender.sent] == [b"r0", b"r1"]  # nothing sent while the tail was uncommitted
    assert (result.written, result.skipped, result.resumes) == (1, 0, 1)
    assert clock.now >= 7.0  # it waited for the commit rather than scanning at once
    publisher.publish([b"r2"])
    assert _ours(part) == {0: 1, 1: 1, 2: 1}
    assert [r.expected_offset for r in sender.sent] == [0, 1, 2]


def test_a_tail_that_does_not_settle_in_time_stops_cleanly_and_a_retry_resumes_without_duplicates() -> None:
    clock, part, sender, client = _setup()
    _publisher(client, sender, clock).publish([b"r0"])
    part.stall()
    with pytest.raises(UncommittedTailError, match="resumes without duplicates") as info:
        _publisher(client, sender, clock, tail_wait=5.0).publish([b"r0", b"r1", b"r2"])
    error = info.value
    assert (error.partition, error.high_watermark, error.newest_offset) == (0, 0, 1)
    assert (error.result.written, error.result.skipped) == (0, 1)
    assert "1 record(s) above its high watermark" in str(error) and "0 record(s) written and 1 skipped" in str(error)
    assert [r.value for r in sender.sent] == [b"r0", b"r1"]  # r1 once; r2 never sent

    # The task is retried while the follower is still stopped; it comes back 3 s later.
    part.stall(until=clock.now + 3.0)
    result = _publisher(client, sender, clock, tail_wait=5.0).publish([b"r0", b"r1", b"r2"])
    assert (result.written, result.skipped) == (1, 2)
    assert _ours(part) == {0: 1, 1: 1, 2: 1}


def test_a_new_leader_truncating_the_tail_makes_the_record_be_sent_again_once() -> None:
    clock, part, sender, client = _setup(occ=True)
    publisher = _publisher(client, sender, clock)
    publisher.publish([b"r0"])
    part.stall(truncate_at=clock.now + 4.0)  # the leader dies; its successor never had record 1
    result = publisher.publish([b"r1"])
    assert _ours(part) == {0: 1, 1: 1}
    assert [(r.value, r.expected_offset) for r in sender.sent] == [(b"r0", 0), (b"r1", 1), (b"r1", 1)]
    assert (result.written, result.resumes) == (1, 1)


def test_with_occ_the_expected_offset_never_passes_what_the_scan_has_seen() -> None:
    # Another producer's record sits uncommitted at offset 1 when this producer starts: the first
    # send expects offset 1 (the scan saw up to 0) and is refused; the publisher waits for the tail
    # to commit, reads it, and only then expects offset 2.
    clock, part, sender, client = _setup(occ=True)
    part.append(Record(b"other-0"))
    part.stall(until=5.0)
    part.append(Record(b"other-1"))
    result = _publisher(client, sender, clock).publish([b"r0"])
    assert part.values() == [b"other-0", b"other-1", b"r0"]
    assert [r.expected_offset for r in sender.sent] == [1, 2]
    assert (result.written, result.resumes) == (1, 1)


def test_no_such_stream_right_after_a_full_cluster_restart_is_resumed_for_a_stream_seen_before() -> None:
    clock, part, sender, client = _setup()
    publisher = _publisher(client, sender, clock)
    publisher.publish([b"r0"])
    part.restart()
    result = publisher.publish([b"r1", b"r2"])
    assert _ours(part) == {0: 1, 1: 1, 2: 1}
    # At least one resume: the client itself retries "no such stream" about a stream it has just
    # seen for a moment (presence.py), so fewer of them reach the publisher.
    assert result.written == 2 and result.resumes >= 1
    assert clock.now >= 9.0  # it waited until the cluster committed again before scanning


def test_no_such_stream_is_believed_for_a_stream_never_seen() -> None:
    clock, part, sender, client = _setup()
    part.restart()  # the publisher starts inside the window: metadata lists no streams
    with pytest.raises(ExactlyOncePublishError, match="does not exist") as info:
        _publisher(client, sender, clock).publish([b"r0"])
    assert info.value.result.resumes == 0 and not sender.sent


def test_no_such_stream_is_believed_when_a_cluster_with_leaders_does_not_list_it() -> None:
    clock, part, sender, client = _setup()
    publisher = _publisher(client, sender, clock)
    publisher.publish([b"r0"])
    part.deleted = True  # deleted; another stream still has a leader
    with pytest.raises(ExactlyOncePublishError, match="does not exist") as info:
        publisher.publish([b"r1"])
    assert info.value.result.resumes == 0
    assert [r.value for r in sender.sent] == [b"r0", b"r1"]
