"""Exactly-once publishing (ADR 2) against the dev server: resume after a crash, lost acks,
interleaving writers, optimistic concurrency control, partitioners, both send paths.

Faults are injected with senders that wrap the real one: they publish for real and then fail the
way a crashing process or a lost connection would. Nothing here mocks the server.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from airflow_provider_liftbridge.client import (
    NO_RESEND,
    Ack,
    AckPolicy,
    AckTimeoutError,
    BatchPublisher,
    InvalidArgumentError,
    KeyPartitioner,
    LiftbridgeClient,
    Message,
    NoSuchStreamError,
    PublishError,
    ReadonlyPartitionError,
    Record,
    RoundRobinPartitioner,
    StartPosition,
    StopPosition,
    partition_for_key,
)
from airflow_provider_liftbridge.client.effects import NatsCall, OpenStream, Unary
from airflow_provider_liftbridge.client.exactly_once import (
    PRODUCER_HEADER,
    SEQ_HEADER,
    ExactlyOncePublisher,
    ExactlyOncePublishError,
    SeqSet,
    producer_cursor_id,
    producer_id_for,
)
from airflow_provider_liftbridge.client.publishing.columns import RecordColumns
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.codec import EncodedHeaders, header_field
from tests.raw_read import stored_messages


class _Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing in the publisher catches it."""


@pytest.fixture
def client(lb_address: str) -> LiftbridgeClient:
    with LiftbridgeClient(lb_address, timeout=5.0) as c:
        yield c


def _read(client: LiftbridgeClient, stream: str, partition: int = 0) -> list[Message]:
    if client.fetch_partition_metadata(stream, partition).high_watermark < 0:
        return []
    return list(
        client.subscribe(stream, partition=partition, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
    )


def _seqs(messages: Sequence[Message], producer: str) -> list[int]:
    return [int(m.headers[SEQ_HEADER]) for m in messages if m.headers.get(PRODUCER_HEADER) == producer.encode()]


def _values(n: int) -> list[bytes]:
    return [f"v{i}".encode() for i in range(n)]


class _CrashAfter:
    """Publishes the first ``k`` records of the stream of batches for real, then 'dies'."""

    def __init__(self, inner: BatchPublisher, k: int) -> None:
        self.inner, self.left = inner, k

    def send(self, records: list[Record]) -> Sequence[Ack]:
        if len(records) <= self.left:
            self.left -= len(records)
            return self.inner.send(records)
        self.inner.send(records[: self.left])
        raise _Crash()

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


class _LoseAcksOnce:
    """Publishes for real but reports every ack of the first batch as missing (a lost connection)."""

    def __init__(self, inner: BatchPublisher) -> None:
        self.inner, self.calls = inner, 0

    def send(self, records: list[Record]) -> Sequence[Ack]:
        self.calls += 1
        acks = self.inner.send(records)
        if self.calls == 1:
            raise PublishError("lost", acks=[None] * len(acks), index=0, errors={0: AckTimeoutError("no ack")})
        return acks

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


class _Intruder:
    """Writes a record of another producer right before each of the first ``times`` sends."""

    def __init__(self, inner: BatchPublisher, client: LiftbridgeClient, stream: str, times: int) -> None:
        self.inner, self.client, self.stream, self.times = inner, client, stream, times

    def send(self, records: list[Record]) -> Sequence[Ack]:
        if self.times > 0:
            self.times -= 1
            self.client.publish(self.stream, b"intruder", partition=records[0].partition, expected_offset=-1)
        return self.inner.send(records)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


def _grpc(client: LiftbridgeClient, stream: str) -> BatchPublisher:
    return client.batch_publisher(
        stream, PublishOptions(path="grpc", ack_policy=AckPolicy.LEADER, window=64, timeout=5.0, resend=NO_RESEND)
    )


def test_first_publish_writes_every_record_with_producer_headers(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    client.publish(stream_name, b"before")  # the scan start must be after what was there
    result = ExactlyOncePublisher(client, stream_name, "p1", batch=16).publish(_values(40))
    assert (result.written, result.skipped, result.resumes) == (40, 0, 0)
    assert result.partitions[0].first_offset == 1 and result.partitions[0].last_offset == 40
    messages = _read(client, stream_name)
    assert [m.value for m in messages[1:]] == _values(40)
    assert _seqs(messages, "p1") == list(range(40))
    assert client.fetch_cursor(producer_cursor_id("p1"), stream_name, 0) == 1


def test_a_second_attempt_skips_everything_and_writes_nothing(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    ExactlyOncePublisher(client, stream_name, "p1").publish(_values(25))
    again = ExactlyOncePublisher(client, stream_name, "p1").publish(_values(25))
    assert (again.written, again.skipped) == (0, 25)
    assert _seqs(_read(client, stream_name), "p1") == list(range(25))


def test_crash_mid_publish_then_retry_writes_the_rest_once(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    first = ExactlyOncePublisher(
        client, stream_name, "crashy", batch=10, publisher=_CrashAfter(_grpc(client, stream_name), 23)
    )
    with pytest.raises(_Crash):
        first.publish(_values(60))
    assert _seqs(_read(client, stream_name), "crashy") == list(range(23))
    client.publish(stream_name, b"someone else")  # another writer between the attempts
    retry = ExactlyOncePublisher(client, stream_name, "crashy", batch=10).publish(_values(60))
    assert (retry.written, retry.skipped) == (37, 23)
    messages = _read(client, stream_name)
    assert _seqs(messages, "crashy") == list(range(60))
    assert len(messages) == 61


def test_lost_acks_are_found_by_scanning_not_sent_again(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    sender = _LoseAcksOnce(_grpc(client, stream_name))
    publisher = ExactlyOncePublisher(client, stream_name, "lossy", batch=8, publisher=sender, backoff=0.01, settle=0.01)
    result = publisher.publish(_values(20))
    assert (result.written, result.skipped, result.resumes) == (20, 0, 1)
    assert _seqs(_read(client, stream_name), "lossy") == list(range(20))
    assert publisher.duplicates_seen == 0


def test_partial_acks_of_a_failed_batch_are_not_taken_for_duplicates(
    client: LiftbridgeClient, stream_name: str
) -> None:
    client.create_stream(stream_name, stream_name)

    class HalfAcked(_LoseAcksOnce):
        def send(self, records: list[Record]) -> Sequence[Ack]:
            self.calls += 1
            acks = list(self.inner.send(records))
            if self.calls == 1:
                half: list[Ack | None] = [*acks[:3], *([None] * (len(acks) - 3))]
                raise PublishError("half", acks=half, index=3, errors={3: AckTimeoutError("no ack")})
            return acks

    publisher = ExactlyOncePublisher(
        client, stream_name, "half", batch=8, publisher=HalfAcked(_grpc(client, stream_name)), backoff=0.01, settle=0.01
    )
    result = publisher.publish(_values(8))
    assert (result.written, result.resumes, publisher.duplicates_seen) == (8, 1, 0)
    assert _seqs(_read(client, stream_name), "half") == list(range(8))


def test_sequence_numbers_continue_across_calls(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    publisher = ExactlyOncePublisher(client, stream_name, "files")
    publisher.publish(_values(5))
    publisher.publish(_values(7))
    assert publisher.total.written == 12
    assert _seqs(_read(client, stream_name), "files") == list(range(12))
    retry = ExactlyOncePublisher(client, stream_name, "files")
    assert retry.publish(_values(5)).skipped == 5
    tail = retry.publish(_values(8))  # one more record than the first attempt had
    assert (tail.written, tail.skipped) == (1, 7)


def test_occ_refusal_from_another_writer_is_resumed_without_interleaving(
    client: LiftbridgeClient, stream_name: str
) -> None:
    client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    sender = _Intruder(_grpc(client, stream_name), client, stream_name, times=1)
    result = ExactlyOncePublisher(client, stream_name, "occ", batch=50, publisher=sender, backoff=0.01).publish(
        _values(30)
    )
    assert (result.written, result.resumes) == (30, 1)
    messages = _read(client, stream_name)
    assert messages[0].value == b"intruder"
    # Record 0 was refused; the pipelined records behind it matched their offsets (the intruder
    # took exactly one), so record 0 lands last: each record once, order disturbed (documented).
    assert _seqs(messages, "occ") == [*range(1, 30), 0]
    assert [m.offset for m in messages] == list(range(31))


def test_occ_fences_a_zombie_attempt_of_the_same_producer(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    zombie = ExactlyOncePublisher(client, stream_name, "same", backoff=0.01)
    live = ExactlyOncePublisher(client, stream_name, "same")
    zombie.publish([])  # resumed while nothing was written
    live.publish(_values(10))
    late = zombie.publish(_values(10))
    assert late.written == 0 and late.count == 10
    assert _seqs(_read(client, stream_name), "same") == list(range(10))


def test_persistent_occ_contention_fails_loudly(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    sender = _Intruder(_grpc(client, stream_name), client, stream_name, times=3)
    publisher = ExactlyOncePublisher(client, stream_name, "lose", publisher=sender, max_resumes=2, backoff=0.01)
    with pytest.raises(ExactlyOncePublishError, match="Another writer kept moving the partition") as info:
        publisher.publish(_values(3))
    # Records 1 and 2 matched their offsets behind the refused record 0 (pipelining); 0 never did.
    assert (info.value.result.written, info.value.result.resumes) == (2, 2)
    assert sorted(_seqs(_read(client, stream_name), "lose")) == [1, 2]
    retry = ExactlyOncePublisher(client, stream_name, "lose").publish(_values(3))  # the intruder has stopped
    assert (retry.written, retry.skipped) == (1, 2)
    assert sorted(_seqs(_read(client, stream_name), "lose")) == [0, 1, 2]


def test_key_partitioning_across_attempts(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=3)
    records = [Record(f"v{i}".encode(), key=f"k{i % 7}".encode()) for i in range(50)]
    crash = _CrashAfter(_grpc(client, stream_name), 17)
    with pytest.raises(_Crash):
        ExactlyOncePublisher(
            client, stream_name, "keys", batch=10, publisher=crash, options=PublishOptions(partitioner=KeyPartitioner())
        ).publish(records)
    retry = ExactlyOncePublisher(
        client, stream_name, "keys", batch=10, options=PublishOptions(partitioner=KeyPartitioner())
    ).publish(records)
    assert (retry.written, retry.skipped) == (33, 17)
    everything = [m for p in range(3) for m in _read(client, stream_name, p)]
    assert sorted(_seqs(everything, "keys")) == list(range(50))
    for m in everything:  # each record on its key's partition
        assert KeyPartitioner()(stream_name, m.key, m.value, 3) == m.partition


def test_round_robin_that_differs_between_attempts_still_skips(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    crash = _CrashAfter(_grpc(client, stream_name), 9)
    with pytest.raises(_Crash):
        ExactlyOncePublisher(
            client,
            stream_name,
            "rr",
            batch=4,
            publisher=crash,
            options=PublishOptions(partitioner=RoundRobinPartitioner()),
        ).publish(_values(20))
    rr = RoundRobinPartitioner()
    rr(stream_name, None, b"", 2)  # shift the second attempt's round robin by one
    retry = ExactlyOncePublisher(client, stream_name, "rr", batch=4, options=PublishOptions(partitioner=rr)).publish(
        _values(20)
    )
    assert (retry.written, retry.skipped) == (11, 9)
    everything = [m for p in range(2) for m in _read(client, stream_name, p)]
    assert Counter(_seqs(everything, "rr")) == Counter(range(20))


def test_nats_direct_path(client: LiftbridgeClient, stream_name: str, lb_address: str, nats_url: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    records = [Record(f"v{i}".encode(), partition=i % 2) for i in range(40)]
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as over_nats:
        publisher = ExactlyOncePublisher(over_nats, stream_name, "nats", options=PublishOptions(path="nats"))
        first = publisher.publish(records[:25])
        assert first.written == 25
        retry = ExactlyOncePublisher(over_nats, stream_name, "nats").publish(records)
    assert (retry.written, retry.skipped) == (15, 25)
    everything = [m for p in range(2) for m in _read(client, stream_name, p)]
    assert sorted(_seqs(everything, "nats")) == list(range(40))


def test_columns_with_keys_and_partitions_stay_columns_and_resume(
    client: LiftbridgeClient, stream_name: str, lb_address: str, nats_url: str
) -> None:
    # What a Spark executor passes: values, keys and partitions as columns, no headers of their own.
    client.create_stream(stream_name, stream_name, partitions=2)
    keys = [f"k{i % 5}".encode() for i in range(30)]
    columns = RecordColumns(_values(30), [partition_for_key(k, 2) for k in keys], [b""] * 30, keys=keys)
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as over_nats:
        first = ExactlyOncePublisher(over_nats, stream_name, "cols", batch=8).publish(columns[:12])
        retry = ExactlyOncePublisher(over_nats, stream_name, "cols", batch=8).publish(columns)
    assert (first.written, retry.written, retry.skipped) == (12, 18, 12)
    everything = [m for p in range(2) for m in _read(client, stream_name, p)]
    assert sorted(_seqs(everything, "cols")) == list(range(30))
    for m in everything:
        seq = int(m.headers[SEQ_HEADER])
        assert (m.value, m.key, m.partition) == (f"v{seq}".encode(), keys[seq], partition_for_key(keys[seq], 2))


def test_columns_with_a_partition_out_of_range_are_refused(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    columns = RecordColumns(_values(3), [0, 2, 1], [b""] * 3)
    with pytest.raises(InvalidArgumentError, match=r"record 1 goes to partition 2, but stream .* has 2 partition"):
        ExactlyOncePublisher(client, stream_name, "bad").publish(columns)
    assert [client.fetch_partition_metadata(stream_name, p).newest_offset for p in (0, 1)] == [-1, -1]


@pytest.mark.parametrize("path", ["nats", "grpc"])
def test_own_keys_and_headers_travel_beside_the_producer_headers(
    client: LiftbridgeClient, stream_name: str, lb_address: str, nats_url: str, path: str
) -> None:
    """Records of every form in one batch (bytes, keyed, with own headers, one whose own header
    clashes with ours) are stored with their keys and headers, ours winning a clash."""
    client.create_stream(stream_name, stream_name)
    records: list[Record | bytes] = [
        b"plain",
        Record(b"keyed", key=b"k1"),
        Record(b"headed", headers={"trace": b"t-1"}),
        Record(b"clash", key=b"k3", headers={SEQ_HEADER: b"999", "x": b"y"}),
        bytearray(b"bytearray"),
    ]
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as c:
        result = ExactlyOncePublisher(c, stream_name, "forms", options=PublishOptions(path=path)).publish(records)  # type: ignore[arg-type]
    assert (result.written, result.skipped) == (5, 0)
    stored = _read(client, stream_name)
    assert [m.value for m in stored] == [b"plain", b"keyed", b"headed", b"clash", b"bytearray"]
    assert [m.key for m in stored] == [None, b"k1", None, b"k3", None]
    assert _seqs(stored, "forms") == [0, 1, 2, 3, 4]
    assert stored[2].headers["trace"] == b"t-1"
    assert stored[3].headers["x"] == b"y" and stored[3].headers[SEQ_HEADER] == b"3"


def test_readonly_partition_fails_without_resuming(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    client.set_stream_readonly(stream_name)
    publisher = ExactlyOncePublisher(client, stream_name, "ro", backoff=0.01)
    with pytest.raises(ExactlyOncePublishError, match="read-only") as info:
        publisher.publish(_values(3))
    assert isinstance(info.value.__cause__, ReadonlyPartitionError)
    assert info.value.result.resumes == 0


def test_unknown_stream_is_reported(client: LiftbridgeClient) -> None:
    with pytest.raises(ExactlyOncePublishError, match="does not exist") as info:
        ExactlyOncePublisher(client, "no-such-stream-eo", "p").publish(_values(1))
    assert isinstance(info.value.__cause__, NoSuchStreamError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"producer_id": ""}, "producer_id must be a non-empty string"),
        ({"producer_id": "x" * 600}, "keep it under"),
        ({"options": PublishOptions(ack_policy=AckPolicy.NONE)}, "needs acknowledgements"),
        ({"batch": 0}, "batch must be positive"),
        ({"tail_wait": 0}, "tail_wait must be positive"),
    ],
)
def test_bad_arguments(client: LiftbridgeClient, kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"producer_id": "p"} | kwargs
    with pytest.raises(InvalidArgumentError, match=message):
        ExactlyOncePublisher(client, "s", **args)  # type: ignore[arg-type]


def test_partition_out_of_range(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    with pytest.raises(InvalidArgumentError, match="has 1 partition"):
        ExactlyOncePublisher(client, stream_name, "p").publish([Record(b"x", partition=4)])
    # Plain values take a faster way to their partition; the same check applies, before anything is sent.
    with pytest.raises(InvalidArgumentError, match=r"record 0 goes to partition 2, but stream .* has 1 partition"):
        ExactlyOncePublisher(client, stream_name, "p", options=PublishOptions(partition=2)).publish([b"x", b"y"])
    assert client.fetch_partition_metadata(stream_name, 0).newest_offset == -1


def test_plain_values_go_to_the_partition_asked_for(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=3)
    result = ExactlyOncePublisher(client, stream_name, "p2", batch=7, options=PublishOptions(partition=2)).publish(
        _values(20)
    )
    assert (result.written, list(result.partitions)) == (20, [2])
    assert _seqs(_read(client, stream_name, 2), "p2") == list(range(20))
    assert _read(client, stream_name, 0) == [] and _read(client, stream_name, 1) == []


def test_producer_id_for() -> None:
    assert producer_id_for("d", "t", "manual__1") == "d/t/manual__1"
    assert producer_id_for("d", "t", "r", 3) == "d/t/r/3"
    assert producer_id_for("d", "t", "r", -1) == "d/t/r"
    with pytest.raises(InvalidArgumentError):
        producer_id_for("d", "", "r")


def test_seq_set_merges_runs() -> None:
    s = SeqSet([5, 1, 2, 3, 7])
    assert s.runs() == [(1, 3), (5, 5), (7, 7)]
    assert s.add(6) and s.runs() == [(1, 3), (5, 7)]
    assert not s.add(6)
    assert s.add(4) and s.runs() == [(1, 7)]
    assert len(s) == 7 and 4 in s and 0 not in s and 8 not in s and "x" not in s
    assert s.top() == 7 and SeqSet().top() == -1
    s.add_run_above(8, 10)  # joins the last run
    s.add_run_above(12, 12)
    assert s.runs() == [(1, 10), (12, 12)] and len(s) == 11 and s.top() == 12
    with pytest.raises(ValueError, match="not above 12"):
        s.add_run_above(12, 20)


def test_a_record_of_read_only_headers_is_the_constructors_record_with_its_headers_kept() -> None:
    headers = EncodedHeaders({"lb-seq": b"7"}, header_field("lb-seq", b"7"))
    record = Record.of_read_only(b"v", b"k", headers, 2, 7)
    assert record == Record(b"v", b"k", {"lb-seq": b"7"}, 2, 7)
    assert record.headers is headers  # not copied: the encoding travels with it


@pytest.mark.parametrize("path", ["grpc", "nats"])
def test_a_fresh_producer_makes_only_the_round_trips_its_scan_start_needs(
    path: str, lb_address: str, nats_url: str, stream_name: str
) -> None:
    """No faults, a new producer: besides sending the records, exactly-once publishing only reads
    the stream's metadata, asks each partition for a cursor (once its cursors partition has
    settled: docs/reading-positions.md), and stores the scan start of each partition it writes to.
    Counted on the client's own transport (a spy: every call is real)."""
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=5.0) as c:
        c.create_stream(stream_name, stream_name, partitions=2)
        c.fetch_cursor("warm-up", stream_name, 0)  # the cursor routing's own lookup, made once per client
        calls: list[str] = []
        execute = c._transport.execute

        def spy(effect: Any) -> Any:
            if isinstance(effect, Unary | OpenStream):
                calls.append(effect.method)
            elif isinstance(effect, NatsCall):
                calls.append("NATS batch")
            return execute(effect)

        c._transport.execute = spy  # type: ignore[method-assign]
        records = [Record(f"v{i}".encode(), partition=i % 2) for i in range(100)]
        result = ExactlyOncePublisher(c, stream_name, "lean", options=PublishOptions(path=path)).publish(records)
    assert result.written == 100
    send = ["NATS batch"] if path == "nats" else ["PublishAsync"]
    assert calls == [
        "FetchMetadata",  # partitions and subject
        "FetchPartitionMetadata",  # the cursor's __cursors partition has committed what it holds...
        "FetchCursor",  # ...so partition 0's cursor is current: resuming? no
        "FetchPartitionMetadata",
        "FetchCursor",  # partition 1: no
        "FetchPartitionMetadata",  # partition 0: its high watermark...
        "SetCursor",  # ...stored as the scan start
        "FetchPartitionMetadata",
        "SetCursor",
        *send,  # every record, one batch
    ]


@pytest.mark.parametrize("codec", ["gzip", "zstd"])
def test_compressed_values_resume_after_a_partial_publish(
    client: LiftbridgeClient, stream_name: str, lb_address: str, codec: str
) -> None:
    """Compression changes values only: the scan recognises records by their producer and sequence
    headers, so a retry skips exactly what the crashed attempt stored, and reads give back the originals."""
    if codec == "zstd":
        pytest.importorskip("zstandard")
    client.create_stream(stream_name, stream_name)
    values = [b'{"row": %d, "note": "%s"}' % (i, b"fragile " * 20) for i in range(40)]
    crashing = client.batch_publisher(stream_name, PublishOptions(path="grpc", resend=NO_RESEND, compression=codec))
    first = ExactlyOncePublisher(client, stream_name, "zipped", batch=10, publisher=_CrashAfter(crashing, 17))
    with pytest.raises(_Crash):
        first.publish(values)
    retry = ExactlyOncePublisher(
        client, stream_name, "zipped", batch=10, options=PublishOptions(path="grpc", compression=codec)
    )
    result = retry.publish(values)
    assert (result.written, result.skipped, retry.duplicates_seen) == (23, 17, 0)
    messages = _read(client, stream_name)
    assert _seqs(messages, "zipped") == list(range(40))  # nothing lost, nothing twice
    assert [m.value for m in messages] == values  # decompressed by the subscription
    assert all("content-encoding" not in m.headers for m in messages)
    # Stored compressed, both attempts' records: a read that does not decompress sees the codec.
    stored = stored_messages(lb_address, stream_name)
    assert [int(m.headers[SEQ_HEADER]) for m in stored] == list(range(40))
    assert all(m.headers["content-encoding"] == codec.encode() and len(m.value) < len(values[0]) for m in stored)


def test_compression_is_checked(client: LiftbridgeClient) -> None:
    with pytest.raises(InvalidArgumentError, match="'gzip', 'zstd' or None"):
        ExactlyOncePublisher(client, "s", "p", options=PublishOptions(compression="lz4"))  # type: ignore[arg-type]
