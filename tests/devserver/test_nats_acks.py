"""Acks and edge cases of the NATS ingest's fast path, over a real nats-server.

Acks are built from byte templates (see ``nats_ingest``): every ack received here is checked to be
byte for byte what the codec writes for the same ``Ack``. The fast path goes through the nats-py
adapter shared with the client (``nats_adapter.py``, tested further in
``tests/client/test_nats_direct_fast.py``); its fallback through nats-py's public API (used when the
internals do not match) is run against a server of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import encode_ack, new_message, unmarshal_ack
from airflow_provider_liftbridge.devserver import DevServer, nats_ingest

from .helpers import create, partition_meta, subscribe

Stub = api_pb2_grpc.APIStub


def _all(stub: Stub, stream: str, partition: int = 0) -> list[pb.Message]:
    req = pb.SubscribeRequest(
        stream=stream, partition=partition, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST
    )
    return subscribe(stub, req).data


#: Bound of a wait for an ack that normally comes in milliseconds: generous, as the suite loads
#: both cores (5 s ran out once for the invalid-inbox test under load).
_ACK_WAIT = 30.0


async def _acks(sub: Subscription, n: int) -> list[bytes]:
    return [(await sub.next_msg(timeout=_ACK_WAIT)).data for _ in range(n)]


def test_the_installed_nats_py_takes_the_fast_path() -> None:
    # If a nats-py upgrade changes the internals the fast path uses, the ingest silently falls
    # back to the slower public API; this says so loudly instead.
    assert nats_adapter.internals_usable(), f"the dev server's ingest lost its fast path: {nats_adapter._PROBLEM}"
    assert nats_ingest.NatsIngest("nats://127.0.0.1:1").fast
    assert not nats_ingest.NatsIngest("nats://127.0.0.1:1", fast=False).fast


async def test_acks_are_exactly_the_codecs_bytes(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name, partitions=2)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    # Offsets past one and two varint bytes, empty and long correlation ids, both ack policies.
    cids = ["", "c" * 300, *(f"id-{i}" for i in range(198))]
    for i, cid in enumerate(cids):
        policy = pb.ALL if i % 2 else pb.LEADER
        await nc.publish(
            f"{stream_name}.1", new_message(b"v%d" % i, ack_inbox=inbox, correlation_id=cid, ack_policy=policy)
        )
    raw = await _acks(sub, len(cids))
    acks = [unmarshal_ack(data) for data in raw]
    assert [a.offset for a in acks] == list(range(len(cids)))
    assert [a.correlationId for a in acks] == cids
    assert [a.ackPolicy for a in acks] == [pb.ALL if i % 2 else pb.LEADER for i in range(len(cids))]
    for ack, data in zip(acks, raw, strict=True):
        assert (ack.stream, ack.partitionSubject, ack.msgSubject) == (stream_name, stream_name, f"{stream_name}.1")
        assert (ack.ackInbox, ack.ackError) == (inbox, pb.Ack.OK)
        assert ack.commitTimestamp >= ack.receptionTimestamp > 0
        assert data == encode_ack(ack)  # canonical: fields in order, zero values left out


async def test_nats_headers_are_not_stored(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    await nc.publish(stream_name, b"plain", headers={"X-Trace": "1"})
    await nc.publish(stream_name, new_message(b"env", headers={"h": b"v"}), headers={"X-Trace": "2"})
    await nc.publish(stream_name, b"no headers")  # stored after the two above
    await nc.flush()
    for _ in range(200):
        if partition_meta(stub, stream_name).newestOffset >= 2:
            break
        await asyncio.sleep(0.01)
    plain, env, last = _all(stub, stream_name)
    assert (plain.value, dict(plain.headers)) == (b"plain", {"subject": stream_name.encode(), "reply": b""})
    assert (env.value, env.headers["h"], "X-Trace" in env.headers) == (b"env", b"v", False)
    assert last.value == b"no headers"


async def test_an_invalid_ack_inbox_does_not_stop_other_acks(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(stream_name, new_message(b"bad", ack_inbox="not a subject", correlation_id="bad"))
    await nc.publish(stream_name, new_message(b"good", ack_inbox=inbox, correlation_id="good"))
    (ack,) = [unmarshal_ack(d) for d in await _acks(sub, 1)]
    assert (ack.correlationId, ack.offset) == ("good", 1)
    assert [m.value for m in _all(stub, stream_name)] == [b"bad", b"good"]  # stored all the same


async def test_large_messages_are_stored_and_acked(stub: Stub, nc: Client, stream_name: str) -> None:
    create(stub, stream_name)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    big = bytes(range(256)) * 3000  # 768 kB: many socket reads for one message
    for i in range(3):
        await nc.publish(stream_name, new_message(big, ack_inbox=inbox, correlation_id=str(i)))
    acks = [unmarshal_ack(d) for d in await _acks(sub, 3)]
    assert [(a.offset, a.correlationId) for a in acks] == [(0, "0"), (1, "1"), (2, "2")]
    assert [m.value == big for m in _all(stub, stream_name)] == [True] * 3


async def test_the_fallback_through_nats_py_public_api_behaves_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As with a nats-py whose internals do not match (the adapter's shape check failed).
    monkeypatch.setattr(nats_adapter, "_PROBLEM", "nats-py (9, 9) is outside the checked range")
    adapters: list[nats_adapter.FastNats] = []

    class Spy(nats_adapter.FastNats):
        def __init__(self, nc: Client, *, internals: bool) -> None:
            super().__init__(nc, internals=internals)
            adapters.append(self)

    monkeypatch.setattr(nats_ingest, "FastNats", Spy)
    with DevServer(data_dir=tmp_path) as srv, grpc.insecure_channel(srv.address) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        create(stub, "fb", subject="fb")
        client = await nats_adapter.connect(srv.nats_url)
        try:
            inbox = client.new_inbox()
            sub = await client.subscribe(inbox)
            await client.publish("fb", b"plain")
            for i in range(300):
                await client.publish("fb", new_message(b"e%d" % i, ack_inbox=inbox, correlation_id=str(i)))
            raw = await _acks(sub, 300)
        finally:
            await client.close()
        acks = [unmarshal_ack(d) for d in raw]
        assert [(a.offset, a.correlationId) for a in acks] == [(i + 1, str(i)) for i in range(300)]
        assert all(d == encode_ack(a) for a, d in zip(acks, raw, strict=True))
        values = [m.value for m in _all(stub, "fb")]
        assert values == [b"plain", *(b"e%d" % i for i in range(300))]
        # The server really ran on the fallback: nats-py's own receive path counted the messages.
        assert [a.internals for a in adapters] == [False]
        assert adapters[0].nc.stats["in_msgs"] == 301
