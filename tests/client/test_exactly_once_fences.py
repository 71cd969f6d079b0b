"""Exactly-once against the two writers it cannot see (issue 24 points 1 and 2, ADR 8), driven
step by step on a virtual clock like ``test_exactly_once_scripted.py``:

- **a stopped leader delivering late**: records sent to a partition leader that is then stopped
  (SIGSTOP) sit unread in its socket; it is replaced, and when it wakes it forwards them to the
  new leader, after the client gave up on them (``liftbridge-semantics.md``, last entries);
- **a zombie try**: another writer with the same producer id, still publishing while the retry
  resumes, or writing between the retry's records.

The publisher and the client are the real ones; the partition is the model of
``test_exactly_once_scripted.Partition`` plus a leader, an ISR and real listening sockets for the
brokers' ports (a stopped broker's port accepts connections, a dead one's refuses them). Each
case failed on the code before ADR 8: the record was sent again and stored twice, or the retry
wrote beside the zombie and reported success.
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import AckTimeoutError, LiftbridgeClient, PublishError, Record
from airflow_provider_liftbridge.client.effects import RpcFailure
from airflow_provider_liftbridge.client.exactly_once import (
    PRODUCER_HEADER,
    SEQ_HEADER,
    ConcurrentProducerError,
    ExactlyOncePublisher,
    SilentBrokerError,
)
from airflow_provider_liftbridge.client.publishing.options import PublishOptions

from .scripted import scripted_client
from .test_exactly_once_scripted import TIMEOUT, Clock, Partition, Sender


@pytest.fixture
def ports() -> Iterator[dict[str, socket.socket]]:
    """A listening socket per broker (b1, b2, b3) that never answers: a stopped broker's port."""
    socks = {}
    for name in ("b1", "b2", "b3"):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(4096)
        socks[name] = sock
    yield socks
    for sock in socks.values():
        sock.close()


class Cluster(Partition):
    """The partition with a leader that can be stopped: what is sent to it meanwhile is held;
    ``replaced_at`` another broker leads (and the stopped one leaves the ISR); ``wakes_at`` it
    forwards what it held to the leader and rejoins the ISR; killing it drops what it held."""

    def __init__(self, clock: Clock, ports: dict[str, socket.socket], *, occ: bool = False) -> None:
        super().__init__(clock, occ=occ)
        self.ports = ports
        self.leader = "b1"
        self.isr = ["b1", "b2", "b3"]
        self.stopped: str | None = None
        self.held: list[Record] = []
        self.replaced_at = float("inf")
        self.wakes_at = float("inf")
        self.writers: list[Callable[[], None]] = []  # other writers, run on every tick

    def stop_leader(self, *, replaced_after: float, wakes_after: float = float("inf")) -> None:
        self.stopped = self.leader
        self.replaced_at = self.clock.now + replaced_after
        self.wakes_at = self.clock.now + wakes_after

    def kill_stopped(self) -> None:
        assert self.stopped is not None
        self.ports.pop(self.stopped).close()  # nothing listens there any more
        self.held.clear()
        self.wakes_at = float("inf")

    def tick(self) -> None:
        super().tick()
        if self.stopped is not None and self.clock.now >= self.replaced_at and self.leader == self.stopped:
            self.leader = "b2"
            self.isr = [b for b in self.isr if b != self.stopped]
        if self.stopped is not None and self.clock.now >= self.wakes_at:
            woke, self.stopped = self.stopped, None
            for record in self.held:  # forwarded to the leader, long after the client gave up
                if not self.occ or record.expected_offset == self.newest + 1:  # OCC refuses a late copy
                    self.append(record)
            self.held.clear()
            self.isr.append(woke)
        for writer in list(self.writers):
            writer()

    def leader_stopped(self) -> bool:
        return self.stopped is not None and self.leader == self.stopped

    def _unary(self, method: str, request: Any) -> Any:
        if method == "FetchMetadata":
            brokers = [
                api_pb2.Broker(id=name, host="127.0.0.1", port=sock.getsockname()[1])
                for name, sock in sorted(self.ports.items())
            ]
            part = api_pb2.PartitionMetadata(id=0, leader=self.leader, replicas=["b1", "b2", "b3"], isr=self.isr)
            return api_pb2.FetchMetadataResponse(
                brokers=brokers, streamMetadata=[api_pb2.StreamMetadata(name="s", subject="s", partitions={0: part})]
            )
        if method == "FetchPartitionMetadata":
            if self.leader_stopped():  # only the leader answers, and it is stopped
                self.clock.sleep(TIMEOUT)
                raise RpcFailure(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return api_pb2.FetchPartitionMetadataResponse(
                metadata=api_pb2.PartitionMetadata(
                    id=0, leader=self.leader, isr=self.isr, highWatermark=self.hw, newestOffset=self.newest
                )
            )
        return super()._unary(method, request)


class LeaderSender(Sender):
    """Sends to the partition's leader: a stopped leader holds the records and sends no ack."""

    def __init__(self, part: Cluster) -> None:
        super().__init__(part)
        self.cluster = part

    def send(self, records: list[Record]) -> Any:
        part = self.cluster
        part.tick()
        if part.leader_stopped():
            self.sent.extend(records)
            part.held.extend(records)
            part.clock.sleep(TIMEOUT)
            raise PublishError(
                "no ack", acks=[None] * len(records), index=0, errors={0: AckTimeoutError("no ack within 2 s")}
            )
        return super().send(records)


def _setup(ports: dict[str, socket.socket], occ: bool = False) -> tuple[Clock, Cluster, LeaderSender, LiftbridgeClient]:
    clock = Clock()
    part = Cluster(clock, ports, occ=occ)
    return clock, part, LeaderSender(part), scripted_client(part.answer, timeout=TIMEOUT, max_retries=2)


def _publisher(client: LiftbridgeClient, sender: Sender, clock: Clock, **kw: Any) -> ExactlyOncePublisher:
    bounds: dict[str, Any] = {"tail_wait": 30.0, "quiet": 1.0} | kw
    options = PublishOptions(timeout=TIMEOUT)
    publisher = ExactlyOncePublisher(client, "s", "p", publisher=sender, options=options, **bounds)
    publisher.timer.now, publisher.timer.sleep = clock, clock.sleep
    return publisher


def _ours(part: Partition) -> Counter[int]:
    return Counter(int(m.headers[SEQ_HEADER]) for m in part.log if m.headers.get(PRODUCER_HEADER) == b"p")


# -- a stopped leader that delivers late ------------------------------------------------------


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
def test_records_held_by_a_stopped_leader_are_waited_for_not_sent_again(
    ports: dict[str, socket.socket], occ: bool
) -> None:
    # r1 and r2 go to b1, which stops; b2 leads after 5 s; b1 wakes after 12 s and forwards them.
    clock, part, sender, client = _setup(ports, occ)
    publisher = _publisher(client, sender, clock)
    publisher.publish([b"r0"])
    part.stop_leader(replaced_after=5.0, wakes_after=12.0)
    result = publisher.publish([b"r1", b"r2"])
    assert _ours(part) == {0: 1, 1: 1, 2: 1}
    assert [r.value for r in sender.sent] == [b"r0", b"r1", b"r2"]  # nothing sent a second time
    assert (result.written, result.skipped) == (2, 0)
    assert clock.now >= 12.0  # it waited for the stopped broker rather than for the new leader
    # The client's routing cache names the new leader, so the next batch goes there.
    assert client._core.route("s", 0) == f"127.0.0.1:{ports['b2'].getsockname()[1]}"


def test_a_stopped_broker_that_stays_silent_stops_the_publish_loudly_and_a_retry_resumes(
    ports: dict[str, socket.socket],
) -> None:
    clock, part, sender, client = _setup(ports)
    publisher = _publisher(client, sender, clock, tail_wait=20.0)
    publisher.publish([b"r0"])
    part.stop_leader(replaced_after=5.0)  # replaced, and never wakes while we wait
    with pytest.raises(SilentBrokerError, match="broker 'b1'.*may still be stored") as info:
        publisher.publish([b"r1", b"r2"])
    assert (info.value.broker, info.value.partition) == ("b1", 0)
    assert [r.value for r in sender.sent] == [b"r0", b"r1", b"r2"]  # held, not sent again
    assert _ours(part) == {0: 1}

    # The task is retried while b1 is still stopped (out of the ISR): the retry waits for it too.
    part.wakes_at = clock.now + 8.0
    result = _publisher(client, sender, clock).publish([b"r0", b"r1", b"r2"])
    assert _ours(part) == {0: 1, 1: 1, 2: 1}
    assert (result.written, result.skipped) == (0, 3)
    assert [r.value for r in sender.sent] == [b"r0", b"r1", b"r2"]


def test_records_held_by_a_leader_that_died_are_sent_again_once(ports: dict[str, socket.socket]) -> None:
    clock, part, sender, client = _setup(ports)
    publisher = _publisher(client, sender, clock)
    publisher.publish([b"r0"])
    part.stop_leader(replaced_after=5.0)
    part.kill_stopped()  # its port refuses connections: what it held is gone with it
    result = publisher.publish([b"r1"])
    assert _ours(part) == {0: 1, 1: 1}
    assert [r.value for r in sender.sent] == [b"r0", b"r1", b"r1"]
    assert result.written == 1
    assert clock.now < 20.0  # no wait for a broker that cannot come back with the records


# -- a zombie try of the same producer --------------------------------------------------------


def _zombie(part: Cluster, clock: Clock, seqs: range, every: float, start: float = 0.0) -> None:
    """Another try of producer ``p`` writing ``seqs``, one record per ``every`` seconds."""
    todo = list(seqs)

    def write() -> None:
        while todo and clock.now >= start + every * (len(seqs) - len(todo)):
            seq = todo.pop(0)
            part.log.append(
                api_pb2.Message(
                    offset=len(part.log),
                    value=b"r%d" % seq,
                    headers={PRODUCER_HEADER: b"p", SEQ_HEADER: b"%d" % seq},
                )
            )
            if not part.stalled:
                part.hw = part.newest

    part.writers.append(write)


def test_a_retry_waits_for_a_zombie_try_to_stop_then_skips_what_it_wrote(
    ports: dict[str, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    clock, part, sender, client = _setup(ports)
    part.cursors["lb-producer:p"] = 0
    _zombie(part, clock, range(40), every=0.25)  # writes for 10 s
    clock.sleep(1.0)
    with caplog.at_level(logging.WARNING, logger="airflow_provider_liftbridge.client.exactly_once"):
        result = _publisher(client, sender, clock).publish([b"r%d" % i for i in range(50)])
    assert _ours(part) == dict.fromkeys(range(50), 1)
    assert [r.value for r in sender.sent] == [b"r%d" % i for i in range(40, 50)]
    assert (result.written, result.skipped) == (10, 40)
    assert clock.now >= 10.0
    # The wait is said once, at WARNING, with the producer, the partition and its bounds (issue 36).
    waits = [r.getMessage() for r in caplog.records if "from another writer" in r.getMessage()]
    assert len(waits) == 1 and "Producer 'p'" in waits[0] and "partition 0" in waits[0], waits
    assert "zombie_wait" in waits[0]


def test_a_zombie_that_does_not_stop_fails_the_retry_before_it_writes(ports: dict[str, socket.socket]) -> None:
    clock, part, sender, client = _setup(ports)
    part.cursors["lb-producer:p"] = 0
    _zombie(part, clock, range(10_000), every=0.1)
    clock.sleep(0.5)
    with pytest.raises(ConcurrentProducerError, match="zombie try .* nothing was written beside them") as info:
        _publisher(client, sender, clock, zombie_wait=15.0).publish([b"r%d" % i for i in range(10_000)])
    assert info.value.duplicates == 0
    assert sender.sent == []
    assert 15.0 <= clock.now < 30.0


def test_a_zombie_writing_between_the_retrys_records_fails_it_instead_of_a_silent_success(
    ports: dict[str, socket.socket],
) -> None:
    # The zombie was silent when the retry started; then, while the retry sends, it writes two
    # records the retry writes too. The stream has them twice: the call must not succeed.
    clock, part, sender, client = _setup(ports)
    appended = part.append

    def append(record: Record) -> int:
        if record.headers and record.headers.get(SEQ_HEADER) == b"3":
            for seq in (1, 4):
                appended(Record(b"zombie", headers={PRODUCER_HEADER: b"p", SEQ_HEADER: b"%d" % seq}))
        return appended(record)

    part.append = append  # type: ignore[method-assign]
    with pytest.raises(ConcurrentProducerError, match="2 of its sequence numbers are now in the stream twice") as info:
        _publisher(client, sender, clock).publish([b"r%d" % i for i in range(8)])
    assert info.value.duplicates == 2
    assert _ours(part) == {0: 1, 1: 2, 2: 1, 3: 1, 4: 2, 5: 1, 6: 1, 7: 1}
