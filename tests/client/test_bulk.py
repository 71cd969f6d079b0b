"""The bulk publish path (``publish_many`` over NATS) against the dev server and its real
nats-server: acks in order, partition routing, path choice and fallback, typed errors."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import nats
import pytest

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import (
    AckPolicy,
    AsyncLiftbridgeClient,
    IncorrectOffsetError,
    InvalidArgumentError,
    KeyPartitioner,
    LiftbridgeClient,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
    PublishError,
    ReadonlyPartitionError,
    Record,
    StopPosition,
    partition_for_key,
)
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.codec import encode_ack, unmarshal_message

CLIENT_LOG = "airflow_provider_liftbridge.client"


@pytest.fixture
def bulk_client(lb_address: str, nats_url: str) -> Iterator[LiftbridgeClient]:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url], timeout=10.0) as client:
        yield client


def read_all(client: LiftbridgeClient, stream: str, partition: int = 0) -> list[bytes]:
    return [m.value for m in client.subscribe(stream, partition=partition, stop_at=StopPosition.LATEST)]


def test_every_record_acked_in_order(
    bulk_client: LiftbridgeClient, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    bulk_client.create_stream(stream_name, stream_name)
    values = [b"v%d" % i for i in range(500)]
    with caplog.at_level(logging.INFO, logger=CLIENT_LOG):
        acks = bulk_client.publish_many(stream_name, values, window=32)
    assert [a.offset for a in acks] == list(range(500))
    assert all(a.stream == stream_name and a.partition == 0 for a in acks)
    assert len({a.correlation_id for a in acks}) == 500
    assert "over NATS-direct" in caplog.text
    assert read_all(bulk_client, stream_name) == values


async def test_async_client_takes_the_same_path(lb_address: str, nats_url: str, stream_name: str) -> None:
    async with AsyncLiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        await client.create_stream(stream_name, stream_name, partitions=2)
        records = [Record(b"a%d" % i, partition=i % 2, correlation_id=f"c{i}") for i in range(40)]
        acks = await client.publish_many(stream_name, records, path="nats", window=4)
    assert [a.correlation_id for a in acks] == [f"c{i}" for i in range(40)]
    assert [a.partition for a in acks] == [i % 2 for i in range(40)]
    assert [a.offset for a in acks if a.partition == 1] == list(range(20))


def test_keyed_records_land_on_the_key_partition(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name, partitions=3)
    keys = [b"customer-%d" % i for i in range(30)]
    records = [Record(b"order-%d" % i, key=k, headers={"n": b"%d" % i}) for i, k in enumerate(keys)]
    acks = bulk_client.publish_many(stream_name, records, partitioner=KeyPartitioner(), path="nats")
    expected = [partition_for_key(k, 3) for k in keys]
    assert [a.partition for a in acks] == expected
    assert len(set(expected)) > 1  # the keys really spread over partitions
    # The gRPC path puts the same key on the same partition.
    grpc_acks = bulk_client.publish_many(stream_name, records[:6], partitioner=KeyPartitioner(), path="grpc")
    assert [a.partition for a in grpc_acks] == expected[:6]
    for p in range(3):
        stored = list(bulk_client.subscribe(stream_name, partition=p, stop_at=StopPosition.LATEST))
        nats_part = [m for m in stored if int(m.headers["n"]) < 30][: expected.count(p)]
        assert all(partition_for_key(m.key or b"", 3) == p for m in nats_part)
        assert [m.value for m in nats_part] == [b"order-%d" % i for i, e in enumerate(expected) if e == p]


def test_path_choice(lb_address: str, nats_url: str, stream_name: str, caplog: pytest.LogCaptureFixture) -> None:
    with LiftbridgeClient(lb_address) as plain:
        plain.create_stream(stream_name, stream_name)
        with caplog.at_level(logging.INFO, logger=CLIENT_LOG):
            assert [a.offset for a in plain.publish_many(stream_name, [b"g"])] == [0]
        assert "over gRPC PublishAsync" in caplog.text
        with pytest.raises(InvalidArgumentError, match="nats_servers"):
            plain.publish_many(stream_name, [b"x"], path="nats")
        with pytest.raises(InvalidArgumentError, match="path='carrier-pigeon' is not valid"):
            plain.publish_many(stream_name, [b"x"], path="carrier-pigeon")  # type: ignore[arg-type]
    with LiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        assert client.publish_many(stream_name, []) == []
        with pytest.raises(InvalidArgumentError, match="window"):
            client.publish_many(stream_name, [b"x"], window=0)
        with pytest.raises(NoSuchStreamError):
            client.publish_many("no-such-stream-" + stream_name, [b"x"], path="nats")


def test_ack_policy_none_stores_without_acks(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name)
    assert bulk_client.publish_many(stream_name, [b"n%d" % i for i in range(20)], ack_policy=AckPolicy.NONE) == []
    # Nothing confirms a NONE publish: wait for the broker to store them.
    for _ in range(100):
        if bulk_client.fetch_partition_metadata(stream_name).high_watermark == 19:
            break
        threading.Event().wait(0.05)
    assert read_all(bulk_client, stream_name) == [b"n%d" % i for i in range(20)]


def test_incorrect_offset_ack_error_is_typed(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    records = [Record(b"0", expected_offset=0), Record(b"1", expected_offset=1), Record(b"x", expected_offset=7)]
    with pytest.raises(PublishError) as caught:
        bulk_client.publish_many(stream_name, records, path="nats", window=1)
    err = caught.value
    assert (err.index, err.acked) == (2, 2)
    assert isinstance(err.errors[2], IncorrectOffsetError) and isinstance(err.__cause__, IncorrectOffsetError)
    assert [a.offset for a in err.acks[:2] if a is not None] == [0, 1]
    assert read_all(bulk_client, stream_name) == [b"0", b"1"]


def test_records_after_a_refused_one_are_not_sent(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name, optimistic_concurrency_control=True)
    records = [Record(b"bad", expected_offset=5)] + [Record(b"later%d" % i, expected_offset=-1) for i in range(50)]
    with pytest.raises(PublishError) as caught:
        bulk_client.publish_many(stream_name, records, path="nats", window=1)
    assert caught.value.index == 0 and caught.value.acked == 0
    assert bulk_client.fetch_partition_metadata(stream_name).high_watermark == -1


def test_too_large_for_nats_is_refused_before_sending(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name)
    big = b"z" * (2 * 1024 * 1024)  # over nats-server's default max_payload of 1 MiB
    with pytest.raises(PublishError) as caught:
        bulk_client.publish_many(stream_name, [b"small", big, b"after"], path="nats", window=1)
    assert caught.value.index == 1 and caught.value.acked == 1
    assert isinstance(caught.value.errors[1], MessageTooLargeError)
    assert read_all(bulk_client, stream_name) == [b"small"]


async def test_too_large_ack_error_is_typed(nats_url: str, stream_name: str) -> None:
    """The dev server never answers TOO_LARGE, so a stand-in broker on the same real nats-server
    answers the envelopes on one subject with the ack a real broker sends for an oversized message."""
    responder = await nats_adapter.connect(nats_url)

    async def answer(msg: nats.aio.msg.Msg) -> None:
        sent = unmarshal_message(msg.data)
        ack = api_pb2.Ack(
            stream=stream_name,
            partitionSubject=stream_name,
            msgSubject=msg.subject,
            correlationId=sent.correlationId,
            ackInbox=sent.ackInbox,
            ackError=api_pb2.Ack.TOO_LARGE if sent.value == b"huge" else api_pb2.Ack.OK,
        )
        await responder.publish(sent.ackInbox, encode_ack(ack))

    await responder.subscribe(stream_name, cb=answer)
    await nats_adapter.flush(responder)  # nc.flush() can overtake the SUB
    try:
        async with await NatsPublisher.connect(nats_url) as pub:
            with pytest.raises(PublishError) as caught:
                await pub.publish_many(stream_name, [b"ok", b"huge"], PublishOptions(window=1, timeout=5))
    finally:
        await responder.close()
    assert caught.value.index == 1 and caught.value.acked == 1
    assert isinstance(caught.value.errors[1], MessageTooLargeError)


def test_paused_partition_auto_falls_back_to_grpc(
    bulk_client: LiftbridgeClient, stream_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    bulk_client.create_stream(stream_name, stream_name)
    bulk_client.publish_many(stream_name, [b"before"])
    bulk_client.pause_stream(stream_name)
    # NATS-direct alone cannot publish to a paused partition (the broker drops it): refused up front.
    with pytest.raises(PublishError) as caught:
        bulk_client.publish_many(stream_name, [b"nats"], path="nats")
    assert isinstance(caught.value.errors[0], PartitionPausedError) and caught.value.acked == 0
    # "auto" takes gRPC, which resumes the partition, and says so.
    with caplog.at_level(logging.INFO, logger=CLIENT_LOG):
        acks = bulk_client.publish_many(stream_name, [b"after"])
    assert [a.offset for a in acks] == [1]
    assert "partition 0 is paused" in caplog.text and "over grpc" in caplog.text
    # Resumed now (though metadata keeps saying "paused"): NATS works again.
    assert [a.offset for a in bulk_client.publish_many(stream_name, [b"again"], path="nats")] == [2]
    assert read_all(bulk_client, stream_name) == [b"before", b"after", b"again"]


@pytest.mark.parametrize("path", ["auto", "nats"])
def test_readonly_partition_is_a_typed_error(bulk_client: LiftbridgeClient, stream_name: str, path: str) -> None:
    bulk_client.create_stream(stream_name, stream_name, partitions=2)
    bulk_client.set_stream_readonly(stream_name, partitions=[1])
    records = [Record(b"p0", partition=0), Record(b"p1", partition=1)]
    with pytest.raises(PublishError) as caught:
        bulk_client.publish_many(stream_name, records, path=path, window=1)  # type: ignore[arg-type]
    assert caught.value.index == 1
    assert isinstance(caught.value.errors[1], ReadonlyPartitionError)


def test_unknown_partition_is_refused_before_sending(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name, partitions=2)
    with pytest.raises(PublishError) as caught:
        bulk_client.publish_many(stream_name, [b"a", Record(b"b", partition=5)], path="nats")
    assert caught.value.index == 1 and isinstance(caught.value.errors[1], NoSuchPartitionError)
    assert bulk_client.fetch_partition_metadata(stream_name).high_watermark == -1


def test_threads_share_one_client(bulk_client: LiftbridgeClient, stream_name: str) -> None:
    bulk_client.create_stream(stream_name, stream_name)
    results: list[int] = []

    def publish(tag: int) -> None:
        acks = bulk_client.publish_many(stream_name, [b"t%d-%d" % (tag, i) for i in range(100)], window=16)
        results.append(len(acks))

    threads = [threading.Thread(target=publish, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [100] * 4
    assert bulk_client.fetch_partition_metadata(stream_name).high_watermark == 399


def test_close_stops_the_nats_loop(lb_address: str, nats_url: str, stream_name: str) -> None:
    with LiftbridgeClient(lb_address, nats_servers=[nats_url]) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b"x"])
        assert any(t.name == "liftbridge-nats-loop" for t in threading.enumerate())
    assert not any(t.name == "liftbridge-nats-loop" for t in threading.enumerate())


async def test_unreachable_nats_auto_falls_back(lb_address: str, stream_name: str) -> None:
    # Nothing listens on port 1: NATS cannot be reached, gRPC still can.
    async with AsyncLiftbridgeClient(lb_address, nats_servers=["nats://127.0.0.1:1"], timeout=2) as client:
        await client.create_stream(stream_name, stream_name)
        acks = await client.publish_many(stream_name, [b"a", b"b"])
        assert [a.offset for a in acks] == [0, 1]
        with pytest.raises(PublishError) as caught:
            await client.publish_many(stream_name, [b"c"], path="nats")
    assert caught.value.index is None and "NATS" in str(caught.value)
    await asyncio.sleep(0)


@pytest.mark.parametrize("path", ["nats", "grpc"])
def test_batch_publisher_streams_an_input_of_any_length_in_bounded_batches(
    bulk_client: LiftbridgeClient, stream_name: str, path: str
) -> None:
    """BatchPublisher.publish reads a generator one batch at a time (never further ahead), reports
    progress after each batch and sums the acks up; a refused record names its place in the input."""
    bulk_client.create_stream(stream_name, stream_name, partitions=2)
    pulled = [0]

    def source(n: int) -> Iterator[Record]:
        for i in range(n):
            pulled[0] += 1
            yield Record(b"v%d" % i, partition=i % 2)

    progress: list[tuple[int, int]] = []
    publisher = bulk_client.batch_publisher(stream_name, PublishOptions(path=path))  # type: ignore[arg-type]
    summary = publisher.send_all(source(2500), batch=1000, on_progress=lambda s: progress.append((s.count, pulled[0])))
    assert publisher.path == path
    # After each batch the source had been read exactly as far as that batch.
    assert progress == [(1000, 1000), (2000, 2000), (2500, 2500)]
    assert (summary.count, summary.acknowledged) == (2500, 2500)
    assert {p: (r.first_offset, r.last_offset, r.count) for p, r in summary.partitions.items()} == {
        0: (0, 1249, 1250),
        1: (0, 1249, 1250),
    }
    # A record refused in the second batch: the error says where it is in the whole input.
    bad = [Record(b"ok") for _ in range(3)] + [Record(b"late", partition=7)]
    with pytest.raises(PublishError) as info:
        publisher.send_all(iter(bad), batch=3)
    assert (info.value.start, info.value.index) == (3, 0)
    assert "record #3 of the input" in str(info.value)
