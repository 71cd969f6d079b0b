"""The NATS side over a real nats-server: plain and enveloped publishes, acks to inboxes, groups, partition subjects."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.client import Client

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import MsgType, encode, encode_ack, new_message, unmarshal_ack

from .helpers import TIMEOUT, create, partition_meta, subscribe

Stub = api_pb2_grpc.APIStub


async def _wait_newest(stub: Stub, stream: str, offset: int, partition: int = 0) -> None:
    for _ in range(200):
        if partition_meta(stub, stream, partition).newestOffset >= offset:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{stream}/{partition} never reached offset {offset}")


def _all(stub: Stub, stream: str, partition: int = 0) -> list[pb.Message]:
    req = pb.SubscribeRequest(
        stream=stream, partition=partition, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST
    )
    return subscribe(stub, req).data


async def test_plain_publish_is_stored_with_reply_subject_and_no_ack(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    await nc.publish(stream_name, b"plain", reply=inbox)
    await nats_adapter.flush(nc)  # nc.flush() can overtake the SUB
    await _wait_newest(stub, stream_name, 0)
    (msg,) = _all(stub, stream_name)
    assert (msg.key, msg.value, msg.subject, msg.replySubject) == (b"", b"plain", stream_name, inbox)
    assert dict(msg.headers) == {"subject": stream_name.encode(), "reply": inbox.encode()}
    with pytest.raises(nats.errors.TimeoutError):
        await replies.next_msg(timeout=0.2)


@pytest.mark.parametrize("crc", [True, False])
async def test_enveloped_publish_is_parsed_and_acked(stub: Stub, nc: Client, stream_name: str, crc: bool) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    acks = await nc.subscribe(inbox)
    data = new_message(
        b"val", key=b"k", headers={"h": b"v"}, ack_inbox=inbox, correlation_id="c1", expected_offset=99, crc=crc
    )
    await nc.publish(stream_name, data)
    ack_msg = await acks.next_msg(timeout=TIMEOUT)
    assert ack_msg.data[:9] == bytes.fromhex("b90e43b400080001") + b"\x0a"
    assert ack_msg.reply == "" and not ack_msg.headers
    ack = unmarshal_ack(ack_msg.data)
    assert (ack.stream, ack.offset, ack.correlationId, ack.ackInbox) == (stream_name, 0, "c1", inbox)
    assert (ack.msgSubject, ack.partitionSubject, ack.ackError) == (stream_name, stream_name, pb.Ack.OK)
    assert ack.commitTimestamp >= ack.receptionTimestamp > 0
    assert ack_msg.data == encode_ack(ack)  # exactly the codec's ack framing
    (msg,) = _all(stub, stream_name)
    assert (msg.offset, msg.key, msg.value) == (0, b"k", b"val")  # the publisher's offset (99) is ignored
    assert msg.headers["h"] == b"v" and msg.headers["subject"] == stream_name.encode()


async def test_none_policy_envelope_gets_no_ack(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    acks = await nc.subscribe(inbox)
    await nc.publish(stream_name, new_message(b"v", ack_inbox=inbox, ack_policy=pb.NONE))
    await _wait_newest(stub, stream_name, 0)
    with pytest.raises(nats.errors.TimeoutError):
        await acks.next_msg(timeout=0.2)


async def test_bad_crc_and_non_publish_envelopes_are_stored_raw(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    acks = await nc.subscribe(inbox)
    good = bytearray(new_message(b"v", ack_inbox=inbox))
    good[-1] ^= 0x01  # breaks the CRC-32C
    bad_crc = bytes(good)
    ack_typed = encode(pb.Message(value=b"v", ackInbox=inbox).SerializeToString(), MsgType.ACK)
    await nc.publish(stream_name, bad_crc)
    await nc.publish(stream_name, ack_typed)
    await _wait_newest(stub, stream_name, 1)
    assert [m.value for m in _all(stub, stream_name)] == [bad_crc, ack_typed]
    with pytest.raises(nats.errors.TimeoutError):
        await acks.next_msg(timeout=0.2)


async def test_partition_subjects(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name, partitions=3)
    await nc.publish(f"{stream_name}.1", b"one")
    await nc.publish(f"{stream_name}.2", b"two")
    await nc.publish(stream_name, b"zero")
    for p in range(3):
        await _wait_newest(stub, stream_name, 0, p)
    assert [[m.value for m in _all(stub, stream_name, p)] for p in range(3)] == [[b"zero"], [b"one"], [b"two"]]


async def test_group_shares_messages_and_groupless_streams_each_get_all(
    stub: Stub, nc: Client, stream_name: str
) -> None:
    subject = stream_name + ".grp"
    a, b, solo = stream_name + "-a", stream_name + "-b", stream_name + "-solo"
    create(stub, a, subject=subject, group="g1")
    create(stub, b, subject=subject, group="g1")
    create(stub, solo, subject=subject)
    for i in range(40):
        await nc.publish(subject, b"%d" % i)
    await _wait_newest(stub, solo, 39)
    for _ in range(100):
        counts = [partition_meta(stub, s).newestOffset + 1 for s in (a, b)]
        if sum(counts) == 40:
            break
        await asyncio.sleep(0.02)
    assert sum(counts) == 40, counts  # each message went to exactly one member of the group
    values = {m.value for s in (a, b) for m in _all(stub, s)}
    assert values == {b"%d" % i for i in range(40)}


async def test_occ_stream_drops_plain_messages_when_not_empty_and_acks_errors(
    stub: Stub, nc: Client, stream_name: str
) -> None:
    create(stub, stream_name, optimisticConcurrencyControl=pb.NullableBool(value=True))
    await nc.publish(stream_name, b"first")  # offset 0 matches the implied expectation (0)
    await _wait_newest(stub, stream_name, 0)
    await nc.publish(stream_name, b"dropped")
    inbox = nc.new_inbox()
    acks = await nc.subscribe(inbox)
    await nc.publish(stream_name, new_message(b"stale", ack_inbox=inbox, expected_offset=0))
    ack = unmarshal_ack((await acks.next_msg(timeout=TIMEOUT)).data)
    assert ack.ackError == pb.Ack.INCORRECT_OFFSET
    await nc.publish(stream_name, new_message(b"right", ack_inbox=inbox, expected_offset=1))
    assert unmarshal_ack((await acks.next_msg(timeout=TIMEOUT)).data).offset == 1
    assert [m.value for m in _all(stub, stream_name)] == [b"first", b"right"]


async def test_paused_and_readonly_partitions_drop_nats_messages(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    stub.PauseStream(pb.PauseStreamRequest(name=stream_name, partitions=[0]), timeout=TIMEOUT)
    stub.SetStreamReadonly(
        pb.SetStreamReadonlyRequest(name=stream_name, partitions=[1], readonly=True), timeout=TIMEOUT
    )
    await nc.publish(stream_name, b"to-paused")
    await nc.publish(f"{stream_name}.1", b"to-readonly")
    await nats_adapter.flush(nc)  # both reached NATS (nc.flush() can overtake PUBs still queued)
    await asyncio.sleep(0.2)
    stub.SetStreamReadonly(
        pb.SetStreamReadonlyRequest(name=stream_name, partitions=[1], readonly=False), timeout=TIMEOUT
    )
    assert partition_meta(stub, stream_name, 1).newestOffset == -1
    sub = subscribe(
        stub, pb.SubscribeRequest(stream=stream_name, resume=True, startPosition=pb.EARLIEST), count=1, timeout=0.5
    )
    assert sub.data == []  # nothing was stored while paused


async def test_grpc_publish_with_own_ack_inbox_also_acks_on_nats(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    acks = await nc.subscribe(inbox)
    await nats_adapter.flush(nc)  # nc.flush() can overtake the SUB
    resp = stub.Publish(
        pb.PublishRequest(stream=stream_name, value=b"v", ackInbox=inbox, correlationId="g1"), timeout=TIMEOUT
    )
    nats_ack = unmarshal_ack((await acks.next_msg(timeout=TIMEOUT)).data)
    assert nats_ack == resp.ack and nats_ack.correlationId == "g1"
