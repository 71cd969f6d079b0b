"""The bulk engine (``send_over_nats``) against a stand-in broker on the dev server's real
nats-server: frames on the wire, acks matched under reordering, duplicates, junk and late acks,
re-sends and the window — with nats-py's internals (the fast path) and without (its public API).

The stand-in broker is a nats-py subscriber that answers the envelopes it receives with acks in
whatever order and number a test wants: the dev server always acks once, in order, so it cannot
exercise the matching. Everything else is real: nats-server, nats-py, the codec.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import nats
import pytest
from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge import codec, nats_adapter
from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import NO_RESEND, AckPolicy, InvalidArgumentError, PublishError, Record
from airflow_provider_liftbridge.client.publishing.columns import RecordColumns
from airflow_provider_liftbridge.client.publishing.correlation import CorrelationIds, correlation_ids
from airflow_provider_liftbridge.client.publishing.nats_engine import (
    _Frames,
    send_over_nats,
)
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions


@pytest.fixture(params=[True, False], ids=["internals", "public-api"])
def internals(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Run the test with the fast path, then with nats-py's public API only."""
    monkeypatch.setattr(nats_adapter, "USE_INTERNALS", request.param)
    yield request.param


@dataclass
class StandIn:
    """A stand-in broker: records every frame received on ``subject`` and answers them through
    ``answer(frames) -> acks`` once ``batch`` frames (or a pause of 20 ms) have come in."""

    nc: NatsClient
    subject: str
    batch: int
    answer: Callable[[list[api_pb2.Message]], list[tuple[str, bytes]]]
    frames: list[bytes] = field(default_factory=list)
    pending: list[api_pb2.Message] = field(default_factory=list)
    outstanding: int = 0
    max_outstanding: int = 0
    next_offset: int = 0

    async def on_frame(self, msg: nats.aio.msg.Msg) -> None:
        self.frames.append(msg.data)
        self.pending.append(codec.unmarshal_message(msg.data))
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        if len(self.pending) >= self.batch:
            await self.flush()

    async def flush(self) -> None:
        batch, self.pending = self.pending, []
        self.outstanding -= len(batch)
        for inbox, frame in self.answer(batch):
            await self.nc.publish(inbox, frame)

    def ack(
        self, sent: api_pb2.Message, error: int = api_pb2.Ack.OK, cid: str | None = None, offset: int | None = None
    ) -> tuple[str, bytes]:
        """The ack a broker sends for ``sent`` (at ``offset``, else the next one), as
        ``(inbox, frame)``."""
        if offset is None:
            offset = self.next_offset
            self.next_offset += 1
        pb = api_pb2.Ack(
            stream=self.subject,
            partitionSubject=self.subject,
            msgSubject=self.subject,
            offset=offset,
            ackInbox=sent.ackInbox,
            correlationId=sent.correlationId if cid is None else cid,
            ackPolicy=sent.ackPolicy,
            receptionTimestamp=10 + offset,
            commitTimestamp=20 + offset,
            ackError=error,  # type: ignore[arg-type]
        )
        return sent.ackInbox, codec.encode_ack(pb)


@pytest.fixture
async def stand_in(nats_url: str) -> AsyncIterator[Callable[..., asyncio.Future[StandIn]]]:
    conns: list[NatsClient] = []
    tasks: list[asyncio.Task[None]] = []

    async def start(
        answer: Callable[[StandIn, list[api_pb2.Message]], list[tuple[str, bytes]]], batch: int = 1
    ) -> StandIn:
        nc = await nats_adapter.connect(nats_url)
        conns.append(nc)
        subject = f"standin-{uuid.uuid4().hex[:10]}"
        broker = StandIn(nc, subject, batch, lambda b: answer(broker, b))
        await nc.subscribe(subject, cb=broker.on_frame)
        await nats_adapter.flush(nc)  # nc.flush() can overtake the SUB

        async def idle_flush() -> None:  # a partial batch is answered after a 20 ms pause
            while True:
                before = len(broker.frames)
                await asyncio.sleep(0.02)
                if broker.pending and len(broker.frames) == before:
                    await broker.flush()

        tasks.append(asyncio.ensure_future(idle_flush()))
        return broker

    yield start  # type: ignore[misc]
    for t in tasks:
        t.cancel()
    for nc in conns:
        await nc.close()


async def publisher(nats_url: str) -> NatsClient:
    return await nats_adapter.connect(nats_url)


@pytest.mark.parametrize("crc", [True, False], ids=["crc", "no-crc"])
async def test_frames_on_the_wire_are_new_message_bytes(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool, crc: bool
) -> None:
    broker = await stand_in(lambda b, batch: [b.ack(m) for m in batch])
    records: list[Record | bytes] = [
        b"plain",
        b"",
        Record(b"keyed", key=b"k"),
        Record(b"empty key", key=b""),
        Record(b"with header", headers={"h": b"1"}),
        Record(b"empty header", headers={"empty": b""}),
        Record(b"own id", correlation_id="mine"),
        Record(b"occ", expected_offset=7),
        b"v" * 300,
    ]
    ids = correlation_ids(records)
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(
            nc,
            [broker.subject] * len(records),
            records,
            ids,
            PublishOptions(window=3, ack_policy=AckPolicy.ALL),
            crc=crc,
        )
    finally:
        await nc.close()
    assert out.acked == len(records) and not out.errors
    assert len(broker.frames) == len(records)
    inbox = codec.unmarshal_message(broker.frames[0]).ackInbox
    assert inbox.startswith("_INBOX.")
    for i, (rec, frame) in enumerate(zip(records, broker.frames, strict=True)):
        r = rec if isinstance(rec, Record) else Record(rec)
        expected = codec.new_message(
            r.value,
            key=r.key or b"",
            headers=r.headers,
            ack_inbox=inbox,
            correlation_id=ids[i],
            ack_policy=api_pb2.ALL,
            expected_offset=-1 if r.expected_offset is None else r.expected_offset,
            crc=crc,
        )
        assert frame == expected, f"record {i}"
    assert ids[6] == "mine" and ids[0] != ids[1]


def _columns() -> RecordColumns:
    """An exactly-once-like batch: values, two partitions, encoded headers, expected offsets, some keys."""
    values = [b"v0", b"", b"v" * 300, b"v3"]
    wires = [codec.header_field("lb-producer", b"p") + codec.header_field("lb-seq", b"%d" % i) for i in range(4)]
    wires[1] = b""  # a record without headers
    return RecordColumns(values, [0, 1, 0, 1], wires, [5, -1, 6, 0], [None, b"k1", None, b""])


async def test_columns_frame_as_their_records_do(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool
) -> None:
    """A column batch (an exactly-once batch) goes out framed byte for byte as the same records
    given as Record objects: headers, keys and expected offsets kept."""
    columns = _columns()
    encoder = codec.PublishEncoder(ack_inbox="_INBOX.same", ack_policy=api_pb2.LEADER)
    ids = CorrelationIds(4, {}, prefix="fixed-")
    refused: dict[int, Exception] = {}
    as_columns = _Frames(columns, ids, encoder, 1 << 20, refused.__setitem__).burst(0, 4)
    as_records = _Frames(list(columns), ids, encoder, 1 << 20, refused.__setitem__).burst(0, 4)
    assert not refused
    assert as_columns == as_records and len(as_columns) == 4

    broker = await stand_in(lambda b, batch: [b.ack(m) for m in batch])
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(nc, [broker.subject] * 4, columns, CorrelationIds(4, {}), PublishOptions(window=8))
    finally:
        await nc.close()
    assert out.acked == 4 and not out.errors
    sent = [codec.unmarshal_message(f) for f in broker.frames]
    assert [m.value for m in sent] == columns.values
    assert [m.offset for m in sent] == [5, -1, 6, 0]
    assert [m.key for m in sent] == [b"", b"k1", b"", b""]
    assert dict(sent[2].headers) == {"lb-producer": b"p", "lb-seq": b"2"} and not sent[1].headers


def test_columns_are_a_sequence_of_the_records_they_hold() -> None:
    columns = _columns()
    assert len(columns) == 4
    assert columns[0] == Record(b"v0", None, {"lb-producer": b"p", "lb-seq": b"0"}, 0, 5)
    assert columns[1] == Record(b"", b"k1", None, 1, -1)
    assert columns[-1] == Record(b"v3", b"", {"lb-producer": b"p", "lb-seq": b"3"}, 1, 0)
    tail = columns[2:]
    assert isinstance(tail, RecordColumns) and list(tail) == list(columns)[2:]
    assert list(columns.take([3, 0])) == [columns[3], columns[0]]
    plain = RecordColumns([b"x"], [2], [b""])
    assert plain[0] == Record(b"x", None, None, 2, None)
    with pytest.raises(ValueError, match="every column must hold 2 entries"):
        RecordColumns([b"a", b"b"], [0], [b"", b""])


async def test_acks_matched_under_reordering_duplicates_and_junk(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool
) -> None:
    rng = random.Random(7)

    def answer(b: StandIn, batch: list[api_pb2.Message]) -> list[tuple[str, bytes]]:
        acks = [b.ack(m) for m in batch]  # offsets in arrival order
        inbox = batch[0].ackInbox
        noise = [
            (inbox, b"not an envelope"),
            b.ack(batch[0], cid="someone-else", offset=-5),
            b.ack(batch[0], cid=batch[0].correlationId.rsplit("-", 1)[0] + "-999999", offset=-5),  # no such record
        ]
        answers = acks + acks[: len(acks) // 2] + noise  # half of them twice
        rng.shuffle(answers)
        return answers

    broker = await stand_in(answer, batch=8)
    values = [b"r%d" % i for i in range(100)]
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(
            nc, [broker.subject] * 100, values, correlation_ids(values), PublishOptions(window=8)
        )
        in_msgs = nc.stats["in_msgs"]
    finally:
        await nc.close()
    assert out.acked == 100 and not out.errors and not out.timed_out and out.resent == 0
    sent = [codec.unmarshal_message(f) for f in broker.frames]
    assert [m.value for m in sent] == values
    offset_of = {m.correlationId: i for i, m in enumerate(sent)}  # the stand-in numbers in arrival order
    for i, ack in enumerate(out.acks):
        assert ack is not None and ack.correlation_id == sent[i].correlationId
        assert ack.offset == offset_of[ack.correlation_id]
        assert (ack.reception_timestamp, ack.commit_timestamp) == (10 + ack.offset, 20 + ack.offset)
    assert broker.max_outstanding <= 8 and out.peak_in_flight <= 8
    # The fast path hands acks to the engine before nats-py counts them; the public path counts
    # every ack, copy and junk frame.
    assert (in_msgs == 0) if internals else (in_msgs > 100)


async def test_late_ack_counts_and_resent_records_take_the_first_ack(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool
) -> None:
    """Record 0's only ack comes after its deadline (the policy does not re-send it): it still
    counts, since records 1-3 are still in flight. Records 1-3 get no ack for their first copy
    and are re-sent; the second copy is acked twice and the first of those acks wins.

    The broker answers when the third re-sent copy is in, an event, not a timer: the copies are
    re-sent once the deadlines passed, so record 0's is over, and they are unacked, so in flight.
    (Timers of 0.8 s for record 0's ack against a 0.6 s deadline failed a busy run: the re-sent
    copies came after 0.8 s, and the offsets went to the acks in another order.)"""
    seen: dict[str, int] = {}
    late: list[api_pb2.Message] = []
    resent: list[api_pb2.Message] = []

    def answer(b: StandIn, batch: list[api_pb2.Message]) -> list[tuple[str, bytes]]:
        for m in batch:
            seen[m.correlationId] = seen.get(m.correlationId, 0) + 1
            if m.value == b"late":
                late.append(m)
            elif seen[m.correlationId] >= 2:
                resent.append(m)
        if len(resent) < 3:
            return []
        # Record 0's late ack (offset 0) first, then two acks for each re-sent copy (1-2, 3-4, 5-6).
        return [b.ack(late[0])] + [ack for m in resent for ack in (b.ack(m), b.ack(m))]

    class AllButFirst:
        def should_resend(self, index: int, attempt: int) -> bool:
            return index != 0 and attempt <= 3

    broker = await stand_in(answer, batch=1)
    records = [b"late", b"a", b"b", b"c"]
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(
            nc,
            [broker.subject] * 4,
            records,
            correlation_ids(records),
            PublishOptions(window=4, timeout=0.6, resend=AllButFirst()),
        )
    finally:
        await nc.close()
    assert out.timed_out == [] and not out.errors
    assert out.acked == 4 and out.resent == 3
    assert [seen[a.correlation_id] for a in out.acks if a is not None] == [1, 2, 2, 2]
    acks = [a for a in out.acks if a is not None]
    # Each re-sent record got two acks (offsets n, n+1): the first one, the odd one, is kept.
    assert [a.offset for a in acks] == [0, 1, 3, 5]


async def test_no_resend_times_out_and_stops_new_sends(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool
) -> None:
    """Only the "ok" records are acked: the window fills with unacknowledged records, they time
    out together, and nothing after them is sent."""

    def answer(b: StandIn, batch: list[api_pb2.Message]) -> list[tuple[str, bytes]]:
        return [b.ack(m) for m in batch if m.value.startswith(b"ok")]

    broker = await stand_in(answer)
    records = [b"ok0", b"lost", b"ok2", b"ok3"] + [b"unacked%d" % i for i in range(20)]
    async with NatsPublisher(await publisher(nats_url)) as pub:
        with pytest.raises(PublishError) as caught:
            await pub.publish_many(broker.subject, records, PublishOptions(window=4, timeout=0.3, resend=NO_RESEND))
    err = caught.value
    assert err.index == 1 and err.acked == 3
    # Every record without an ack is named: the window's timed out, the rest never sent.
    assert {i: type(e).__name__ for i, e in err.errors.items()} == dict.fromkeys(
        [1, 4, 5, 6], "AckTimeoutError"
    ) | dict.fromkeys(range(7, 24), "NotSentError")
    assert len(broker.frames) == 7  # the window of 4 held lost + 3 more; nothing was sent after them


async def test_ack_errors_are_typed_in_the_outcome(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool
) -> None:
    errors = {b"occ": api_pb2.Ack.INCORRECT_OFFSET, b"big": api_pb2.Ack.TOO_LARGE, b"enc": api_pb2.Ack.ENCRYPTION}

    def answer(b: StandIn, batch: list[api_pb2.Message]) -> list[tuple[str, bytes]]:
        return [b.ack(m, error=errors.get(m.value, api_pb2.Ack.OK)) for m in reversed(batch)]

    broker = await stand_in(answer, batch=4)
    records = [b"fine", b"occ", b"big", b"enc"]
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(
            nc, [broker.subject] * 4, records, correlation_ids(records), PublishOptions(window=4)
        )
    finally:
        await nc.close()
    assert out.acks[0] is not None and out.acks[1:] == [None, None, None]
    assert {i: type(e).__name__ for i, e in out.errors.items()} == {
        1: "IncorrectOffsetError",
        2: "MessageTooLargeError",
        3: "EncryptionError",
    }


@pytest.mark.parametrize("as_columns", [False, True], ids=["values", "columns"])
async def test_too_large_record_inside_a_burst_is_named_and_ends_the_burst(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool, as_columns: bool
) -> None:
    broker = await stand_in(lambda b, batch: [b.ack(m) for m in batch])
    big = b"z" * (2 * 1024 * 1024)  # over nats-server's default max_payload of 1 MiB
    values = [b"a", b"b", big, b"after"]
    # Columns (an exactly-once batch) take their own bulk framing; the check is the same.
    records = RecordColumns(values, [0] * 4, [b""] * 4, [-1] * 4) if as_columns else values
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(
            nc, [broker.subject] * 4, records, correlation_ids(records), PublishOptions(window=8)
        )
    finally:
        await nc.close()
    assert list(out.errors) == [2] and type(out.errors[2]).__name__ == "MessageTooLargeError"
    assert "record 2" in str(out.errors[2]) and "max_payload" in str(out.errors[2])
    assert out.sent == 2 and [codec.unmarshal_message(f).value for f in broker.frames] == [b"a", b"b"]


async def test_publisher_input_forms(stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str) -> None:
    broker = await stand_in(lambda b, batch: [b.ack(m) for m in batch])
    async with NatsPublisher(await publisher(nats_url)) as pub:
        assert await pub.publish_many(broker.subject, []) == []
        acks = await pub.publish_many(broker.subject, [b"b", bytearray(b"ba"), memoryview(b"mv"), Record(b"r")])
        assert len(acks) == 4
        with pytest.raises(InvalidArgumentError, match="record 1 is a str"):
            await pub.publish_many(broker.subject, [b"ok", "text"])  # type: ignore[list-item]
    assert [codec.unmarshal_message(f).value for f in broker.frames] == [b"b", b"ba", b"mv", b"r"]


async def test_acks_after_the_call_returned_change_nothing(
    stand_in: Callable[..., asyncio.Future[StandIn]], nats_url: str, internals: bool
) -> None:
    loop = asyncio.get_running_loop()

    def answer(b: StandIn, batch: list[api_pb2.Message]) -> list[tuple[str, bytes]]:
        late = [b.ack(m, error=api_pb2.Ack.TOO_LARGE, offset=99) for m in batch]
        loop.call_later(0.05, lambda: [asyncio.ensure_future(b.nc.publish(*a)) for a in late])
        return [b.ack(m) for m in batch]

    broker = await stand_in(answer, batch=3)
    records = [b"a", b"b", b"c"]
    nc = await publisher(nats_url)
    try:
        out = await send_over_nats(
            nc, [broker.subject] * 3, records, correlation_ids(records), PublishOptions(window=3)
        )
        before = list(out.acks)
        await asyncio.sleep(0.2)  # the second, contradicting acks arrive on the (still open) connection
    finally:
        await nc.close()
    assert out.acks == before and [a.offset for a in out.acks if a is not None] == [0, 1, 2]
    assert not out.errors
