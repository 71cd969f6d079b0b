"""The pieces under the bulk engine: the nats-py adapter (``nats_adapter.py``, shared with the
dev server's ingest) against the dev server's real nats-server, correlation ids, and the ack builder.

The first test is the tripwire for nats-py upgrades: it fails, naming what changed, when the
internals the adapter relies on no longer have the shape it was written for (the adapter itself
then falls back to the public API, and the bulk path and the dev server get slower, not wrong).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import select
import signal
import socket
import time
import uuid
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import AckPolicy, InvalidArgumentError, Record
from airflow_provider_liftbridge.client.conversion import ack_from_pb
from airflow_provider_liftbridge.client.publishing import ack_inbox, nats_engine
from airflow_provider_liftbridge.client.publishing.correlation import CorrelationIds, correlation_ids
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.types import Ack
from airflow_provider_liftbridge.codec import encode_ack, unmarshal_message
from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from tests import margins
from tests.margins import bounded
from tests.processes import sigstop


def test_nats_py_internals_have_the_expected_shape() -> None:
    assert nats_adapter.internals_usable(), f"the bulk path lost its fast path: {nats_adapter._PROBLEM}"


async def test_subscription_messages_go_straight_to_the_handler(nats_url: str) -> None:
    nc = await nats_adapter.connect(nats_url)
    try:
        fast = nats_adapter.fast_nats(nc)
        assert fast.internals and nats_adapter.fast_nats(nc) is fast  # one per client
        got: list[bytes] = []
        subject = f"fast-{uuid.uuid4().hex}"
        sub = await fast.subscribe(subject, got.extend, pending_msgs=1000, pending_bytes=1 << 20)
        await fast.publish_burst([subject] * 3, [b"a", b"b", b"c"])
        await nats_adapter.flush(nc)  # nc.flush() can overtake the SUB
        await _until(lambda: len(got) == 3)
        assert got == [b"a", b"b", b"c"] and nc.stats["in_msgs"] == 0  # nats-py's processing skipped
        assert nc.stats["out_msgs"] == 3
        # A message with NATS headers is routed the same way: its payload, without the headers.
        await nc.publish(subject, b"with headers", headers={"h": "1"})
        await _until(lambda: len(got) == 4)
        assert got[3] == b"with headers" and nc.stats["in_msgs"] == 0
        # After forget(), nats-py's own path delivers again.
        fast.forget(sub)
        await nc.publish(subject, b"d")
        await _until(lambda: len(got) == 5)
        assert got[4] == b"d" and nc.stats["in_msgs"] == 1
        await sub.unsubscribe()
    finally:
        await nc.close()


@pytest.mark.parametrize("internals", [True, False], ids=["internals", "public-api"])
async def test_routes_get_subject_reply_and_payload_in_order(nats_url: str, internals: bool) -> None:
    nc = await nats_adapter.connect(nats_url)
    sender = await nats_adapter.connect(nats_url)
    try:
        fast = nats_adapter.FastNats(nc, internals=internals)
        assert fast.internals is internals
        got: list[tuple[bytes, bytes, bytes]] = []
        prefix = f"route-{uuid.uuid4().hex[:10]}"
        await fast.route(prefix + ".>", lambda *m: got.append(m), queue="q", pending_msgs=10_000, pending_bytes=1 << 24)
        await nats_adapter.flush(nc)  # nc.flush() can overtake the SUB
        for i in range(600):  # past the public path's yield every 256 messages
            await sender.publish(f"{prefix}.{i % 3}", b"%d" % i, reply="r" if i % 2 else "")
        await sender.publish(prefix + ".h", b"last", headers={"X": "1"})
        await sender.flush()
        await _until(lambda: len(got) == 601)
        assert got[:600] == [(f"{prefix}.{i % 3}".encode(), b"r" if i % 2 else b"", b"%d" % i) for i in range(600)]
        assert got[600] == (f"{prefix}.h".encode(), b"", b"last")
        assert nc.stats["in_msgs"] == (0 if internals else 601)
    finally:
        await sender.close()
        await nc.close()


async def test_flush_returns_after_the_server_took_the_commands_before_it() -> None:
    # A nats-server of its own, tracing: it logs every command it reads from a client, in order.
    server = NatsServerProcess(extra_args=["-V"])
    nc = await nats_adapter.connect(await server.start_async())
    try:
        await nc.subscribe("by-nats-py")
        await nc.flush()
        await nc.subscribe("by-the-adapter")
        await nats_adapter.flush(nc)
        await nc.close()
        await asyncio.sleep(0.2)  # the trace is written by the server's goroutines
        trace = re.findall(r"<<- \[(SUB [\w-]+|PING)", server._log_path.read_text())  # type: ignore[union-attr]
    finally:
        await nc.close()
        server.stop()
    handshake = trace.index("PING")  # connect()'s own
    after = trace[handshake + 1 :]
    # The adapter's flush: the SUB made just before reached the server before its PING.
    assert after[-2:] == ["SUB by-the-adapter", "PING"], trace
    # nats-py's own flush() (2.16) writes its PING ahead of the SUB still queued for the flusher
    # task: the reason nats_adapter.flush exists (a message published by another connection just
    # after it returned went undelivered, 1 run in ~130). If this fails, nats-py keeps the order
    # now and nats_adapter.flush can become nc.flush().
    assert after[:2] == ["PING", "SUB by-nats-py"], trace


async def test_connect_makes_again_a_connection_the_handshake_left_half_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The server's first keepalive PING comes ~200 ms after accept (2 s by default); the client's
    # first handshake is held up before its CONNECT, as a stalled process would be, until that PING
    # is in its socket (peeked, not read: nats-py reads it next). ping_max: the server never closes
    # the stalled client as stale (after 2 unanswered PINGs by default, 0.6 s here, which a loaded
    # machine outlasted: "Connection lost" in the handshake).
    conf = tmp_path / "nats.conf"
    conf.write_text('ping_interval: "200ms"\nping_max: 1000\n')
    server = NatsServerProcess(extra_args=["-c", str(conf)])
    url = await server.start_async()
    slow_once = [True]
    connect_command = NatsClient._connect_command

    def stalled(self: NatsClient) -> bytes:
        if slow_once and slow_once.pop():
            _until_a_ping_is_buffered(self)
        return connect_command(self)

    monkeypatch.setattr(NatsClient, "_connect_command", stalled)
    plain = await nats.connect(url, allow_reconnect=False)
    try:
        # nats-py took the PING for its PONG: left CONNECTING, its flusher gone, flush() a no-op.
        await _until(lambda: plain._flusher_task.done())  # type: ignore[union-attr]  # its first turn
        assert plain.is_connecting
    finally:
        await plain.close()
    slow_once.append(True)
    nc = await nats_adapter.connect(url, allow_reconnect=False)
    sender = await nats_adapter.connect(url, allow_reconnect=False)
    try:
        assert nc.is_connected and "half-open" in caplog.text
        got: list[bytes] = []

        async def take(msg: nats.aio.msg.Msg) -> None:
            got.append(msg.data)

        await nc.subscribe("after-the-race", cb=take)
        await nats_adapter.flush(nc)
        await sender.publish("after-the-race", b"delivered")
        await nats_adapter.flush(sender)
        await _until(lambda: got == [b"delivered"])
    finally:
        await sender.close()
        await nc.close()
        server.stop()


async def test_flush_against_a_stopped_server_times_out_and_can_be_cancelled() -> None:
    server = NatsServerProcess()
    nc = await nats_adapter.connect(await server.start_async(), allow_reconnect=False)
    sigstop(server.pid)  # type: ignore[arg-type]
    try:
        with pytest.raises(nats.errors.FlushTimeoutError):
            await nats_adapter.flush(nc, timeout=1)

        # Fill the socket until nats-py's flusher blocks in drain(): the adapter's flush then waits
        # for the flusher; its time-out and a cancel both end that wait.
        async def fill() -> None:
            for _ in range(200):
                await nc.publish("fill", b"x" * (512 << 10))

        stuck = asyncio.create_task(fill())
        await asyncio.sleep(0.5)
        assert not stuck.done()  # its publish() waits for the flusher, which is blocked in drain()
        with pytest.raises(nats.errors.FlushTimeoutError):
            await nats_adapter.flush(nc, timeout=1)
        flushing = asyncio.create_task(nats_adapter.flush(nc, timeout=60))
        await asyncio.sleep(0.5)
        assert not flushing.done()
        flushing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(flushing, 5)
        stuck.cancel()
    finally:
        os.kill(server.pid, signal.SIGCONT)  # type: ignore[arg-type]
        await nc.close()
        server.stop()


async def test_messages_arriving_before_the_route_is_registered_keep_their_order(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SUB can reach nats-server before ``route()`` registers the route (nats-py's flush may
    await), and what the parser hands over in that window goes to nats-py's queue. The window is
    made certain here: nats-py's ``_send_subscribe`` is wrapped so that, after the real SUB went
    out, three messages go through ``nc._process_msg`` exactly as the parser passes them (a socket
    read cannot be timed into the window). They must reach the route before ``route()`` returns,
    once each, and before the later messages, which the parser hands over directly."""
    nc = await nats_adapter.connect(nats_url)
    sender = await nats_adapter.connect(nats_url)
    try:
        fast = nats_adapter.fast_nats(nc)
        assert fast.internals
        subject = f"early-{uuid.uuid4().hex[:10]}"
        real_send_subscribe = nc._send_subscribe

        async def send_subscribe_then_receive(sub: nats.aio.subscription.Subscription) -> None:
            await real_send_subscribe(sub)
            for payload in (b"e1", b"e2", b"e3"):
                await nc._process_msg(sub._id, subject.encode(), b"", payload, None)  # type: ignore[arg-type]

        monkeypatch.setattr(nc, "_send_subscribe", send_subscribe_then_receive)
        got: list[bytes] = []
        sub = await fast.route(subject, lambda s, r, d: got.append(d), pending_msgs=100, pending_bytes=1 << 20)
        # Handed over by route() itself, not by the callback task (which has not run since).
        assert got == [b"e1", b"e2", b"e3"] and nc.stats["in_msgs"] == 3
        assert sub.pending_msgs == 0 and sub.pending_bytes == 0
        await nats_adapter.flush(nc)  # nc.flush() can overtake the SUB
        for payload in (b"l1", b"l2"):
            await sender.publish(subject, payload)
        await sender.flush()
        await _until(lambda: len(got) == 5)
        await asyncio.sleep(0.05)  # nothing further (a message handled twice) comes
        assert got == [b"e1", b"e2", b"e3", b"l1", b"l2"] and nc.stats["in_msgs"] == 3
    finally:
        await sender.close()
        await nc.close()


async def test_a_failing_handler_does_not_end_the_connection(nats_url: str, caplog: pytest.LogCaptureFixture) -> None:
    nc = await nats_adapter.connect(nats_url)
    try:
        fast = nats_adapter.fast_nats(nc)
        subject = f"fast-{uuid.uuid4().hex}"

        def broken(payloads: list[bytes]) -> None:
            raise ValueError("handler bug")

        await fast.subscribe(subject, broken, pending_msgs=10, pending_bytes=1 << 16)
        got: list[bytes] = []
        await fast.subscribe(subject + ".ok", got.extend, pending_msgs=10, pending_bytes=1 << 16)
        await fast.publish_burst([subject, subject + ".ok"], [b"x", b"y"])
        await _until(lambda: got == [b"y"])
        assert "handler of" in caplog.text and "handler bug" in caplog.text and nc.is_connected
    finally:
        await nc.close()


async def test_public_api_fallback_behaves_the_same(nats_url: str) -> None:
    nc = await nats_adapter.connect(nats_url)
    try:
        fast = nats_adapter.FastNats(nc, internals=False)
        got: list[bytes] = []
        subject = f"slow-{uuid.uuid4().hex}"
        await fast.subscribe(subject, got.extend, pending_msgs=10, pending_bytes=1 << 16)
        await fast.publish_burst([subject, subject], [b"1", b"2"])
        await _until(lambda: len(got) == 2)
        assert got == [b"1", b"2"] and nc.stats["in_msgs"] == 2
    finally:
        await nc.close()


async def test_unknown_internals_mean_the_public_api(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nats_adapter, "_PROBLEM", "nats-py (9, 9) is outside the checked range")
    assert not nats_adapter.internals_usable()
    nc = await nats_adapter.connect(nats_url)
    try:
        assert not nats_adapter.fast_nats(nc).internals
        subject = f"fallback-{uuid.uuid4().hex[:10]}"
        responder = await nats_adapter.connect(nats_url)

        async def answer(msg: nats.aio.msg.Msg) -> None:
            m = unmarshal_message(msg.data)
            ack = api_pb2.Ack(stream="s", partitionSubject=subject, msgSubject=subject, correlationId=m.correlationId)
            await responder.publish(m.ackInbox, encode_ack(ack))

        await responder.subscribe(subject, cb=answer)
        await nats_adapter.flush(responder)  # nc.flush() can overtake the SUB
        records = [b"a", b"b", b"c"]
        out = await nats_engine.send_over_nats(nc, [subject] * 3, records, correlation_ids(records))
        await responder.close()
        assert out.acked == 3 and nc.stats["in_msgs"] == 3  # through nats-py's own receive path
    finally:
        await nc.close()


async def test_burst_on_a_closed_connection_raises_what_publish_raises(nats_url: str) -> None:
    nc = await nats_adapter.connect(nats_url)
    fast = nats_adapter.fast_nats(nc)
    await nc.close()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await fast.publish_burst(["s"], [b"x"])


def _until_a_ping_is_buffered(nc: NatsClient, timeout: float = 30.0) -> None:
    """Block (the event loop too, as a stalled process) until the server's ``PING`` waits unread in
    ``nc``'s socket. A bound for a wait that normally ends in 200 ms."""
    fd = nc._transport._io_writer.get_extra_info("socket").fileno()  # type: ignore[union-attr]
    with socket.socket(fileno=os.dup(fd)) as sock:
        # poll, not select: a long-lived test worker can hold over 1024 descriptors, and select()
        # refuses any numbered 1024 or more ("filedescriptor out of range", seen in CI).
        readable = select.poll()
        readable.register(sock, select.POLLIN)
        with bounded("a PING from the server", timeout):
            deadline = time.monotonic() + timeout
            while b"PING" not in (sock.recv(4096, socket.MSG_PEEK) if readable.poll(10) else b""):
                assert time.monotonic() < deadline, "no PING from the server"


async def _until(cond: object, timeout: float = 30.0) -> None:
    # A bound for a wait that normally ends in milliseconds. (The routing test's time-outs, 1 run
    # in ~130, were messages never delivered: nc.flush() had returned before the SUB reached the
    # server; see test_flush_returns_after_the_server_took_the_commands_before_it.)
    await margins.until(cond, timeout, "condition", interval=0.005, where=margins.caller())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Correlation ids
# ---------------------------------------------------------------------------------------------


def test_generated_ids_are_unique_per_call_and_map_back_to_their_index() -> None:
    a, b = correlation_ids([b"x"] * 1000), correlation_ids([b"x"] * 1000)
    assert len(set(a) | set(b)) == 2000
    assert all(a.index_of(cid) == i for i, cid in enumerate(a))
    assert a.index_of(b[5]) == -1 and a.index_of("nonsense") == -1
    assert a.index_of(a.prefix + "1000") == -1 and a.index_of(a.prefix + "-1") == -1
    assert a[-1] == a[999] and list(a)[:2] == [a[0], a[1]]
    with pytest.raises(IndexError):
        a[1000]


def test_own_ids_win_and_duplicates_are_refused() -> None:
    ids = correlation_ids([b"x", Record(b"y", correlation_id="mine"), Record(b"z")])
    assert ids[1] == "mine" and ids.index_of("mine") == 1
    assert ids.index_of(ids.prefix + "1") == -1  # record 1 never carried the generated id
    assert ids.index_of(ids[2]) == 2
    with pytest.raises(InvalidArgumentError, match="unique"):
        correlation_ids([Record(b"a", correlation_id="c"), Record(b"b", correlation_id="c")])
    with pytest.raises(InvalidArgumentError, match="unique"):
        CorrelationIds(3, {0: "p-2"}, prefix="p-")  # an own id equal to record 2's generated one
    assert CorrelationIds.of(["x", "y"]).index_of("y") == 1


# ---------------------------------------------------------------------------------------------
# Acks built by the engine
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("unfreeze", [True, False], ids=["class-swap", "ack_from_pb"])
async def test_engine_acks_equal_ack_from_pb(nats_url: str, monkeypatch: pytest.MonkeyPatch, unfreeze: bool) -> None:
    """A stand-in broker answers with acks of every shape (partition 0 and N, a subject with no
    partition number, each ack policy, large offsets); the engine's Ack objects equal what
    ``ack_from_pb`` makes of the same frames, whichever way they were built."""
    assert ack_inbox._UNFREEZE_WORKS  # else the fast build is never used
    monkeypatch.setattr(ack_inbox, "_UNFREEZE_WORKS", unfreeze)
    subject = f"acks-{uuid.uuid4().hex[:10]}"
    shapes = [("s", 3, api_pb2.LEADER), ("s.4", 2**40, api_pb2.ALL), ("s.x", 0, api_pb2.NONE), ("s.4", 9, 7)]
    sent_acks: dict[str, api_pb2.Ack] = {}
    responder = await nats_adapter.connect(nats_url)

    async def answer(msg: nats.aio.msg.Msg) -> None:
        m = unmarshal_message(msg.data)
        ms, offset, policy = shapes[int(m.value)]
        pb = api_pb2.Ack(
            stream="s",
            partitionSubject="s",
            msgSubject=ms,
            offset=offset,
            ackInbox=m.ackInbox,
            correlationId=m.correlationId,
            ackPolicy=policy,  # type: ignore[arg-type]
            receptionTimestamp=5,
            commitTimestamp=6,
        )
        sent_acks[m.correlationId] = pb
        await responder.publish(m.ackInbox, encode_ack(pb))

    await responder.subscribe(subject, cb=answer)
    await nats_adapter.flush(responder)  # nc.flush() can overtake the SUB
    records = [b"%d" % (i % len(shapes)) for i in range(8)]
    nc = await nats_adapter.connect(nats_url)
    try:
        out = await nats_engine.send_over_nats(
            nc, [subject] * 8, records, correlation_ids(records), PublishOptions(window=8)
        )
    finally:
        await nc.close()
        await responder.close()
    assert out.acked == 8
    for ack in out.acks:
        assert ack is not None
        reference = ack_from_pb(sent_acks[ack.correlation_id])
        assert type(ack) is Ack and ack == reference and hash(ack) == hash(reference)
        assert dataclasses.astuple(ack) == dataclasses.astuple(reference)
        with pytest.raises(dataclasses.FrozenInstanceError):
            ack.offset = 1  # type: ignore[misc]
    assert [(a.partition, a.ack_policy) for a in out.acks[:4] if a is not None] == [
        (0, AckPolicy.LEADER),
        (4, AckPolicy.ALL),
        (0, AckPolicy.NONE),
        (4, AckPolicy.LEADER),  # an unknown policy value reads as LEADER, as ack_from_pb has it
    ]
