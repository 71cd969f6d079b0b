"""Every client method against the real dev server (gRPC + nats-server), sync and async."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_liftbridge.client import (
    AckPolicy,
    AckTimeoutError,
    ClientClosedError,
    IncorrectOffsetError,
    InvalidArgumentError,
    KeyPartitioner,
    LiftbridgeClient,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
    PublishError,
    ReadonlyPartitionError,
    Record,
    RoundRobinPartitioner,
    StartPosition,
    StopPosition,
    StreamExistsError,
    UnavailableError,
    partition_for_key,
)
from tests import margins
from tests.exact_retention import ONE_MESSAGE_SEGMENTS, publish_each, wait_for_earliest


def values(msgs: list[Any]) -> list[bytes]:
    return [m.value for m in msgs]


# --- streams -----------------------------------------------------------------------------------


def test_create_delete_and_their_errors(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2, retention_max_age=timedelta(hours=1))
    with pytest.raises(StreamExistsError, match=stream_name) as exc:
        client.create_stream(stream_name, stream_name)
    assert exc.value.__cause__ is not None  # the transport error is kept, not shown
    md = client.fetch_metadata([stream_name])
    assert sorted(md.streams[stream_name].partitions) == [0, 1]
    client.delete_stream(stream_name)
    with pytest.raises(NoSuchStreamError, match=stream_name):
        client.delete_stream(stream_name)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "__cursors"}, "refused an argument"),
        ({"replication_factor": 3}, "refused an argument"),
        ({"subject": ""}, "subject must be a non-empty"),
    ],
)
def test_create_stream_invalid_arguments(client: Any, stream_name: str, kwargs: dict[str, Any], match: str) -> None:
    args = {"subject": stream_name, "name": stream_name, **kwargs}
    with pytest.raises(InvalidArgumentError, match=match):
        client.create_stream(args.pop("subject"), args.pop("name"), **args)


def test_pause_and_readonly(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    client.pause_stream(stream_name, partitions=[1])
    with pytest.raises(PartitionPausedError, match="paused"):
        client.fetch_partition_metadata(stream_name, 1)
    assert client.fetch_partition_metadata(stream_name, 0).paused is False
    client.publish(stream_name, b"wake", partition=1)  # publishing resumes the partition
    assert client.fetch_partition_metadata(stream_name, 1).newest_offset == 0

    client.set_stream_readonly(stream_name, partitions=[0])
    assert client.fetch_partition_metadata(stream_name, 0).readonly is True
    with pytest.raises(ReadonlyPartitionError, match="read-only"):
        client.publish(stream_name, b"x", partition=0)
    client.set_stream_readonly(stream_name, partitions=[0], readonly=False)
    assert client.publish(stream_name, b"x", partition=0).offset == 0
    with pytest.raises(NoSuchStreamError):
        client.pause_stream(f"{stream_name}-missing")


# --- publish -----------------------------------------------------------------------------------


def test_publish_returns_a_complete_ack(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=3)
    ack = client.publish(
        stream_name, b"v", key=b"k", headers={"h": b"1"}, partition=2, correlation_id="cid-1", ack_policy=AckPolicy.ALL
    )
    assert (ack.stream, ack.partition, ack.offset, ack.correlation_id) == (stream_name, 2, 0, "cid-1")
    assert (ack.partition_subject, ack.msg_subject, ack.ack_policy) == (stream_name, f"{stream_name}.2", AckPolicy.ALL)
    assert ack.commit_timestamp >= ack.reception_timestamp > 0
    [msg] = list(client.subscribe(stream_name, partition=2, stop_at=0))
    assert (msg.key, msg.value, msg.headers["h"], msg.offset, msg.partition) == (b"k", b"v", b"1", 0, 2)


def test_publish_with_ack_policy_none_returns_none_and_stores(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    assert client.publish(stream_name, b"fire", ack_policy=AckPolicy.NONE) is None
    margins.wait_until(
        lambda: client.fetch_partition_metadata(stream_name).newest_offset >= 0, 5, "the message stored", interval=0.05
    )
    assert values(list(client.subscribe(stream_name, stop_at=0))) == [b"fire"]


def test_partitioners_and_explicit_partition(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=4)
    for key in (b"alpha", b"beta", b"gamma", None):
        ack = client.publish(stream_name, b"v", key=key, partitioner=KeyPartitioner())
        assert ack.partition == partition_for_key(key, 4)
    rr = RoundRobinPartitioner()
    assert [client.publish(stream_name, b"v", partitioner=rr).partition for _ in range(5)] == [0, 1, 2, 3, 0]
    assert client.publish(stream_name, b"v", partition=3, partitioner=KeyPartitioner()).partition == 3
    assert client.publish(stream_name, b"v", partitioner=lambda s, k, v, n: n - 1).partition == 3
    with pytest.raises(InvalidArgumentError, match="returned 9"):
        client.publish(stream_name, b"v", partitioner=lambda s, k, v, n: 9)


def test_publish_to_missing_targets(client: Any, stream_name: str) -> None:
    with pytest.raises(NoSuchStreamError, match=stream_name):
        client.publish(stream_name, b"v")
    with pytest.raises(NoSuchStreamError, match=stream_name):
        client.publish(stream_name, b"v", partitioner=KeyPartitioner())
    client.create_stream(stream_name, stream_name)
    with pytest.raises(NoSuchPartitionError, match="partition 5"):
        client.publish(stream_name, b"v", partition=5)


def test_optimistic_concurrency(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    assert client.publish(stream_name, b"a", expected_offset=0).offset == 0
    with pytest.raises(IncorrectOffsetError, match="newest_offset"):
        client.publish(stream_name, b"b", expected_offset=5)
    with pytest.raises(PublishError) as exc:
        client.publish_many(
            stream_name, [Record(b"b", expected_offset=1), Record(b"c", expected_offset=7), Record(b"d")], window=1
        )
    err = exc.value
    assert (err.index, err.acked) == (1, 1) and err.acks[0] is not None and err.acks[0].offset == 1
    assert isinstance(err.errors[1], IncorrectOffsetError) and isinstance(err.__cause__, IncorrectOffsetError)
    assert err.acks[2] is None  # never sent once a record failed


def test_publish_many_acks_in_input_order(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=3)
    records = [Record(b"v%d" % i, key=b"k%d" % i, correlation_id=f"c{i}") for i in range(40)]
    acks = client.publish_many(stream_name, records, partitioner=KeyPartitioner(), window=4)
    assert [a.correlation_id for a in acks] == [f"c{i}" for i in range(40)]
    assert [a.partition for a in acks] == [partition_for_key(b"k%d" % i, 3) for i in range(40)]
    for p in range(3):
        offsets = [a.offset for a in acks if a.partition == p]
        assert offsets == list(range(len(offsets)))  # in order, no gap, within each partition
    plain = client.publish_many(stream_name, [b"x", b"y"], partition=2)
    assert [a.partition for a in plain] == [2, 2]
    assert client.publish_many(stream_name, []) == []


def test_publish_many_with_ack_policy_none(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    assert client.publish_many(stream_name, [b"%d" % i for i in range(50)], ack_policy=AckPolicy.NONE) == []
    assert values(list(client.subscribe(stream_name, stop_at=49))) == [b"%d" % i for i in range(50)]


def test_publish_many_refusals(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    client.set_stream_readonly(stream_name, partitions=[1])
    with pytest.raises(PublishError) as exc:
        client.publish_many(stream_name, [Record(b"a", partition=0), Record(b"b", partition=1)], window=1)
    assert (exc.value.acked, exc.value.index) == (1, 1)
    assert isinstance(exc.value.errors[1], ReadonlyPartitionError)
    with pytest.raises(InvalidArgumentError, match="unique"):
        client.publish_many(stream_name, [Record(b"a", correlation_id="x"), Record(b"b", correlation_id="x")])
    with pytest.raises(InvalidArgumentError, match="window"):
        client.publish_many(stream_name, [b"a"], window=0)
    with pytest.raises(PublishError) as missing:
        client.publish_many(stream_name, [Record(b"a", partition=7)])
    assert isinstance(missing.value.errors[0], NoSuchPartitionError)


def test_publish_to_subject(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name, partitions=2)
    ack = client.publish_to_subject(f"{stream_name}.1", b"v", key=b"k", correlation_id="c")
    assert (ack.stream, ack.partition, ack.offset, ack.correlation_id) == (stream_name, 1, 0, "c")
    assert client.publish_to_subject(stream_name, b"w", ack_policy=AckPolicy.NONE) is None
    with pytest.raises(AckTimeoutError, match="ack"):
        client.publish_to_subject(f"{stream_name}.nobody", b"v", timeout=0.5)


# --- subscribe ---------------------------------------------------------------------------------


def _fill(client: Any, stream: str, n: int) -> list[Any]:
    return client.publish_many(stream, [b"m%d" % i for i in range(n)])


def _utc(ns: int, *, round_up: bool = False) -> datetime:
    """A datetime (microsecond resolution) at or before / after a nanosecond timestamp."""
    us = -(-ns // 1000) if round_up else ns // 1000
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)


def test_subscribe_start_and_stop_positions(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    acks = []
    for i in range(5):  # apart in time, so timestamps select exactly one message
        acks.append(client.publish(stream_name, b"m%d" % i))
        time.sleep(0.005)
    sub = client.subscribe
    assert [m.offset for m in sub(stream_name, stop_at=StopPosition.LATEST)] == [0, 1, 2, 3, 4]
    assert [m.offset for m in sub(stream_name, start_at=StartPosition.LATEST, stop_at=4)] == [4]
    assert [m.offset for m in sub(stream_name, start_at=2, stop_at=3)] == [2, 3]
    at = _utc(acks[3].reception_timestamp)
    assert [m.offset for m in sub(stream_name, start_at=at, stop_at=4)] == [3, 4]
    assert [m.offset for m in sub(stream_name, start_at=timedelta(hours=1), stop_at=1)] == [0, 1]
    stop_ts = _utc(acks[1].reception_timestamp, round_up=True)
    assert [m.offset for m in sub(stream_name, stop_at=stop_ts)] == [0, 1]
    with pytest.raises(InvalidArgumentError):
        list(sub(stream_name, start_at=4, stop_at=1))


def test_subscribe_new_only_and_live_messages(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    _fill(client, stream_name, 3)
    it = client.subscribe(stream_name, start_at=StartPosition.NEW_ONLY)
    got: list[Any] = []

    def read() -> None:
        for m in it:
            got.append(m)
            if len(got) == 2:
                break

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)  # let the subscription start before publishing
    client.publish(stream_name, b"new1")
    client.publish(stream_name, b"new2")
    reader.join(10)
    assert [(m.offset, m.value) for m in got] == [(3, b"new1"), (4, b"new2")]


def test_subscribe_ends_cleanly_at_the_end_of_a_readonly_partition(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    _fill(client, stream_name, 3)
    client.set_stream_readonly(stream_name)
    assert [m.offset for m in client.subscribe(stream_name)] == [0, 1, 2]


def test_a_range_that_retention_removed_ends_at_the_first_message_past_it(client: Any, stream_name: str) -> None:
    """Retention kept offsets 7-11. Liftbridge starts a reader below the oldest offset there and
    ends a subscription only on the stop offset itself, so for ``[2, 4]`` it sends 7, 8, ... and
    never ends: the client ends at 7 without handing it over, by message and by columns."""
    client.create_stream(stream_name, stream_name, retention_max_messages=5, **ONE_MESSAGE_SEGMENTS)
    publish_each(client, stream_name, [b"m%d" % i for i in range(12)])
    wait_for_earliest(client, stream_name, 7)
    assert list(client.subscribe(stream_name, start_at=2, stop_at=4)) == []
    assert list(client.subscribe_columns(stream_name, start_at=2, stop_at=4)) == []
    assert [m.offset for m in client.subscribe(stream_name, start_at=2, stop_at=8)] == [7, 8]
    assert [b.offsets for b in client.subscribe_columns(stream_name, start_at=2, stop_at=8)] == [[7, 8]]


def test_subscribe_stop_latest_on_empty_partition_yields_nothing(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    assert list(client.subscribe(stream_name, stop_at=StopPosition.LATEST)) == []


def test_subscribe_errors(client: Any, stream_name: str) -> None:
    with pytest.raises(NoSuchStreamError, match=stream_name):
        list(client.subscribe(stream_name))
    client.create_stream(stream_name, stream_name)
    with pytest.raises(NoSuchPartitionError, match="no partition 3"):
        list(client.subscribe(stream_name, partition=3))
    _fill(client, stream_name, 2)
    client.pause_stream(stream_name)
    with pytest.raises(PartitionPausedError, match="resume=True"):
        list(client.subscribe(stream_name, stop_at=1))
    assert [m.offset for m in client.subscribe(stream_name, stop_at=1, resume=True)] == [0, 1]


def test_pause_under_a_subscription_ends_it_with_the_paused_error(client: Any, stream_name: str) -> None:
    # The other form: paused while reading, the server ends the stream with FAILED_PRECONDITION
    # after the handshake (subscribing to a paused partition fails before it: test_subscribe_errors).
    client.create_stream(stream_name, stream_name)
    _fill(client, stream_name, 1)
    got = []
    with pytest.raises(PartitionPausedError, match="resume=True"):
        for message in client.subscribe(stream_name):
            got.append(message.offset)
            client.pause_stream(stream_name)
    assert got == [0]


def test_subscribe_read_isr_replica(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    _fill(client, stream_name, 2)
    assert [m.value for m in client.subscribe(stream_name, stop_at=1, read_isr_replica=True)] == [b"m0", b"m1"]


def test_subscribe_ends_with_an_error_when_the_stream_is_deleted(make_client: Any, lb_address: str,
                                                                 stream_name: str) -> None:  # fmt: skip
    c = make_client(lb_address, timeout=5.0, resubscribe_wait=1.0, max_retries=1)
    c.create_stream(stream_name, stream_name)
    _fill(c, stream_name, 1)
    it = c.subscribe(stream_name)
    assert next(it).offset == 0
    threading.Timer(0.3, lambda: c.delete_stream(stream_name)).start()
    with pytest.raises(NoSuchStreamError):
        next(it)


def test_subscribe_delivers_a_burst_in_order_and_stops_inside_it(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    client.publish_many(stream_name, [b"v%d" % i for i in range(2000)])
    got = list(client.subscribe(stream_name, start_at=100, stop_at=1499))
    assert [m.offset for m in got] == list(range(100, 1500))
    assert {(m.stream, m.partition) for m in got} == {(stream_name, 0)}
    assert [m.value for m in got[:2]] == [b"v100", b"v101"] and got[-1].value == b"v1499"


def test_subscribed_messages_carry_key_headers_and_subject(client: Any, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    client.publish(stream_name, b"v", key=b"k", headers={"h": b"1", "e": b""})
    [first] = list(client.subscribe(stream_name, stop_at=0))
    [again] = list(client.subscribe(stream_name, stop_at=0))
    assert (first.key, first.value, first.subject, first.timestamp > 0) == (b"k", b"v", stream_name, True)
    assert (first.headers["h"], first.headers.get("e"), first.headers.get("absent")) == (b"1", b"", None)
    assert first == again  # headers compare by content
    assert {"h": b"1", "e": b""}.items() <= dict(first.headers).items()


def test_closing_the_sync_client_from_another_thread_ends_a_waiting_subscription(
    lb_address: str, stream_name: str
) -> None:
    # The sync client reads a subscription on the caller's thread (gRPC's single-threaded
    # server-streaming mode); closing the client from elsewhere must still wake it.
    with LiftbridgeClient(lb_address, timeout=5.0) as c:
        c.create_stream(stream_name, stream_name)
        _fill(c, stream_name, 1)
        it = c.subscribe(stream_name)
        assert next(it).offset == 0
        threading.Timer(0.3, c.close).start()
        started = time.monotonic()
        with pytest.raises(ClientClosedError):
            next(it)  # waits for offset 1, which never comes
        assert time.monotonic() - started < 5


# --- metadata and cursors ---------------------------------------------------------------------


def test_metadata(client: Any, stream_name: str) -> None:
    client.create_stream(f"{stream_name}.subj", stream_name, partitions=2)
    md = client.fetch_metadata([stream_name, f"{stream_name}-absent"])
    assert list(md.streams) == [stream_name]
    info = md.streams[stream_name]
    assert info.subject == f"{stream_name}.subj" and info.creation_timestamp > 0
    assert len(md.brokers) == 1 and md.brokers[0].port > 0
    assert stream_name in client.fetch_metadata().streams
    part = client.fetch_partition_metadata(stream_name, 1)
    assert (part.high_watermark, part.newest_offset, part.id) == (-1, -1, 1)
    _fill(client, stream_name, 3)
    part = client.fetch_partition_metadata(stream_name, 0)
    assert (part.high_watermark, part.newest_offset) == (2, 2)
    assert part.leader == md.brokers[0].id and part.isr == (part.leader,)
    with pytest.raises(NoSuchPartitionError):
        client.fetch_partition_metadata(stream_name, 9)
    with pytest.raises(NoSuchStreamError):
        client.fetch_partition_metadata(f"{stream_name}-absent", 0)


def test_cursors(client: Any, stream_name: str) -> None:
    assert client.fetch_cursor("c1", stream_name, 0) == -1
    client.set_cursor("c1", stream_name, 0, 41)
    client.set_cursor("c1", stream_name, 0, 42)
    assert client.fetch_cursor("c1", stream_name, 0) == 42
    assert client.fetch_cursor("c1", stream_name, 1) == -1
    with pytest.raises(InvalidArgumentError, match="cursor_id"):
        client.set_cursor("", stream_name, 0, 1)


# --- connection -------------------------------------------------------------------------------


def test_unreachable_brokers_raise_unavailable(make_client: Any) -> None:
    c = make_client(["127.0.0.1:1", "127.0.0.1:2"], max_retries=2, backoff_base=0.01)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="127.0.0.1:1, 127.0.0.1:2") as exc:
        c.fetch_metadata()
    assert time.monotonic() - started < 5
    assert exc.value.__cause__ is not None and isinstance(exc.value, LiftbridgeError)


def test_dead_seed_broker_is_skipped(make_client: Any, lb_address: str, stream_name: str) -> None:
    c = make_client(["127.0.0.1:1", lb_address], max_retries=3, backoff_base=0.01)
    c.create_stream(stream_name, stream_name)
    assert c.publish(stream_name, b"v").offset == 0
    assert lb_address in c.brokers


def test_close_is_idempotent_and_final(make_client: Any, lb_address: str) -> None:
    c = make_client(lb_address)
    c.fetch_metadata()
    c.close()
    c.close()
    with pytest.raises(LiftbridgeError, match="closed"):
        c.fetch_metadata()
