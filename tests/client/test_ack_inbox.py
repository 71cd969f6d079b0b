"""The NATS engine's ack reader (``read_acks``, the measured fast path) settles exactly what the
plain reader (``read_acks_plain``: the codec's ``unmarshal_ack``, ``CorrelationIds.index_of``,
``ack_from_pb``, ``check_ack``, a frame at a time) settles, for every kind of frame an ack inbox
can receive: acks of each ack policy (and an unknown one), each ack error, with and without a
CRC, of any partition subject, with correlation ids of the call, of another call and made up,
and frames that are not acks at all.

The second test does the same on the engine's own traffic: records of every shape (empty and
absent keys, headers, expected offsets, own correlation ids) published through
``send_over_nats`` to a stand-in broker on the dev server's real nats-server, which answers
with acks, refusals, copies, CRC'd frames and junk; every payload list the engine's reader got is
read by the plain reader too.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable

import nats
import pytest

from airflow_provider_liftbridge import codec, nats_adapter
from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.client import LiftbridgeError, Record
from airflow_provider_liftbridge.client.publishing import ack_inbox, nats_engine
from airflow_provider_liftbridge.client.publishing.correlation import CorrelationIds, correlation_ids
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.types import Ack, AckPolicy
from airflow_provider_liftbridge.codec.envelope import MsgType, encode

N = 12
PREFIX = "call-"
#: Ack errors on the wire: OK, the four the protocol names, and one no version of it has.
ACK_ERRORS = [api_pb2.Ack.OK, api_pb2.Ack.UNKNOWN, api_pb2.Ack.INCORRECT_OFFSET, api_pb2.Ack.TOO_LARGE]
ACK_ERRORS += [api_pb2.Ack.ENCRYPTION, 9]
#: Ack policies on the wire: the three, and an unknown value (read as LEADER).
POLICIES = [api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE, 7]
#: (partition subject, msg subject): partition 0, N, a subject with no number, and the same
#: msg subject under another partition subject (partition 0 then, not N).
SUBJECTS = [("s", "s"), ("s", "s.4"), ("s", "s.x"), ("s.4", "s.4"), ("", ""), ("s", "s.04")]
#: Correlation ids that belong to no record of the call: another call's, out of range, and strings
#: int() would take but a generated id never is (sign, space, underscore, non-ASCII digits).
FOREIGN = ["other-3", "", PREFIX, f"{PREFIX}{N}", f"{PREFIX}999999", f"{PREFIX}-1", f"{PREFIX}+3", f"{PREFIX} 3"]
FOREIGN += [f"{PREFIX}3 ", f"{PREFIX}1_0", f"{PREFIX}\u0663", f"{PREFIX}\u00b2", f"{PREFIX}3.0", "CALL-3"]

Settled = tuple[int, tuple[object, ...] | None, tuple[str, str] | None]


def _ack(cid: str, **fields: object) -> api_pb2.Ack:
    base: dict[str, object] = {
        "stream": "s",
        "partitionSubject": "s",
        "msgSubject": "s",
        "offset": 7,
        "ackInbox": "_INBOX.x",
        "correlationId": cid,
        "ackPolicy": api_pb2.LEADER,
        "receptionTimestamp": 5,
        "commitTimestamp": 6,
    }
    return api_pb2.Ack(**(base | fields))  # type: ignore[arg-type]


def _malformed() -> list[bytes]:
    good = codec.encode_ack(_ack(f"{PREFIX}1"))
    with_crc = codec.encode_ack(_ack(f"{PREFIX}1"), crc=True)
    return [
        b"",
        b"short",
        b"not an envelope at all",
        b"\x00" + good[1:],  # bad magic
        good[:4] + b"\x01" + good[5:],  # version 1
        good[:6] + b"\x02" + good[7:],  # an unknown flag
        good[:5] + b"\x0c" + good[6:],  # header length 12 without a CRC
        good[:7] + b"\x2a" + good[8:],  # message type 42
        codec.new_message(b"v", correlation_id=f"{PREFIX}1"),  # a Publish frame, not an Ack
        with_crc[:8] + b"\x00\x00\x00\x00" + with_crc[12:],  # CRC mismatch
        with_crc[:10],  # cut inside the CRC
        encode(b"\xff\xff\xff", MsgType.ACK, crc=False),  # not a protobuf
        encode(b"\xff\xff\xff", MsgType.ACK, crc=True),
        encode(b"\x0a" * 300, MsgType.ACK, crc=False, max_payload=1 << 21)[: 8 + 2],  # truncated field
        encode(b"\x00" * (codec.DEFAULT_MAX_PAYLOAD + 1), MsgType.ACK, crc=False, max_payload=1 << 21),  # too large
    ]


def _frames(ids: CorrelationIds) -> list[bytes]:
    """Every kind of frame, in an order that mixes them (and answers some records twice)."""
    frames: list[bytes] = []
    for crc in (False, True):
        for k, (ps, ms) in enumerate(SUBJECTS):
            for j, policy in enumerate(POLICIES):
                i = (k * len(POLICIES) + j) % N
                pb = _ack(ids[i], partitionSubject=ps, msgSubject=ms, ackPolicy=policy, offset=2**62 + i)
                frames.append(codec.encode_ack(pb, crc=crc))
        for e, error in enumerate(ACK_ERRORS):
            frames.append(codec.encode_ack(_ack(ids[(e + 5) % N], ackError=error, stream=f"st{e}"), crc=crc))
        for cid in FOREIGN:
            frames.append(codec.encode_ack(_ack(cid), crc=crc))
    # Empty fields, zero timestamps and a negative offset, and every field of the protobuf set.
    frames.append(codec.encode_ack(api_pb2.Ack(correlationId=ids[0])))
    frames.append(codec.encode_ack(_ack(ids[1], offset=-1, receptionTimestamp=0, commitTimestamp=2**63 - 1)))
    frames += _malformed()
    return frames


def _settled(
    ack: Ack | None, error: LiftbridgeError | None
) -> tuple[tuple[object, ...] | None, tuple[str, str] | None]:
    if ack is not None:
        assert type(ack) is Ack  # a real, frozen Ack
        with pytest.raises(dataclasses.FrozenInstanceError):
            ack.offset = 1  # type: ignore[misc]
        return (*dataclasses.astuple(ack), type(ack.ack_policy), type(ack.ack_error), hash(ack)), None
    assert error is not None
    return None, (type(error).__name__, str(error))


def _read(
    reader: Callable[[CorrelationIds, ack_inbox.Settle], nats_adapter.AckHandler],
    ids: CorrelationIds,
    batches: list[list[bytes]],
) -> list[Settled]:
    got: list[Settled] = []

    def settle(i: int, ack: Ack | None, error: LiftbridgeError | None) -> bool:
        got.append((i, *_settled(ack, error)))
        return True

    read = reader(ids, settle)
    for batch in batches:
        read(batch)
    return got


_IDS = {
    "generated": lambda: CorrelationIds(N, {}, prefix=PREFIX),
    "some own": lambda: CorrelationIds(N, {2: "mine", 5: "other-3x", 11: f"{PREFIX}x"}, prefix=PREFIX),
    "all own": lambda: CorrelationIds.of([f"{PREFIX}{i}" if i % 2 else f"own-{i}" for i in range(N)]),
}


@pytest.mark.parametrize("kind", list(_IDS))
@pytest.mark.parametrize("chunk", [1, 7, 10_000], ids=["frame by frame", "in sevens", "one list"])
def test_the_fast_reader_settles_what_the_plain_reader_settles(
    kind: str, chunk: int, caplog: pytest.LogCaptureFixture
) -> None:
    assert ack_inbox._UNFREEZE_WORKS  # else read_acks is the plain reader and this compares nothing
    ids = _IDS[kind]()
    frames = _frames(ids)
    batches = [frames[k : k + chunk] for k in range(0, len(frames), chunk)]
    with caplog.at_level(logging.WARNING, logger=ack_inbox.__name__):
        plain = _read(ack_inbox.read_acks_plain, ids, batches)
        plain_warnings = [r.getMessage() for r in caplog.records]
        caplog.clear()
        fast = _read(ack_inbox.read_acks, ids, batches)
        fast_warnings = [r.getMessage() for r in caplog.records]
    assert fast == plain
    assert fast_warnings == plain_warnings and len(plain_warnings) == len(_malformed())
    # The corpus reaches every branch: accepted acks of each policy and partition, each refusal,
    # and frames of no record passed over.
    accepted = [s for s in plain if s[1] is not None]
    refused = {s[2][0] for s in plain if s[2] is not None}
    assert {a[1][7] for a in accepted} == set(AckPolicy) and {a[1][1] for a in accepted} == {0, 4}
    assert refused == {"ServerError", "IncorrectOffsetError", "MessageTooLargeError", "EncryptionError"}
    answered = len(frames) - len(_malformed())
    assert len(plain) < answered  # some acks were for no record of the call


def test_a_changed_field_is_caught() -> None:
    """The comparison sees every field: a reader that got one of them wrong differs."""
    ids = _IDS["generated"]()
    batches = [_frames(ids)]

    def off_by_one(ids: CorrelationIds, settle: ack_inbox.Settle) -> nats_adapter.AckHandler:
        def shifted(i: int, ack: Ack | None, error: LiftbridgeError | None) -> object:
            if ack is not None:
                ack = dataclasses.replace(ack, commit_timestamp=ack.commit_timestamp + 1)
            return settle(i, ack, error)

        return ack_inbox.read_acks(ids, shifted)

    assert _read(off_by_one, ids, batches) != _read(ack_inbox.read_acks_plain, ids, batches)


async def test_on_the_engines_own_traffic_the_readers_agree(nats_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of every shape through ``send_over_nats`` (CRC on and off) to a stand-in broker
    that answers each with an ack of its own ack policy, or a refusal, plus a second copy, a CRC'd
    copy and junk; the engine's reader and the plain one read the same payload lists and settle
    the same, and the engine's outcome holds what they settled."""
    subject = f"acks-{uuid.uuid4().hex[:10]}"
    responder = await nats_adapter.connect(nats_url)
    refusals = {b"occ": api_pb2.Ack.INCORRECT_OFFSET, b"big": api_pb2.Ack.TOO_LARGE, b"enc": api_pb2.Ack.ENCRYPTION}

    async def answer(msg: nats.aio.msg.Msg) -> None:
        m = codec.unmarshal_message(msg.data)
        error = refusals.get(m.value, api_pb2.Ack.OK)
        pb = _ack(m.correlationId, ackInbox=m.ackInbox, ackPolicy=m.ackPolicy, offset=len(m.value), ackError=error)
        pb.partitionSubject = subject
        pb.msgSubject = f"{subject}.{len(m.key)}" if m.key else subject  # keyed: partition 1
        for frame in (codec.encode_ack(pb), codec.encode_ack(pb, crc=True), b"junk"):
            await responder.publish(m.ackInbox, frame)

    await responder.subscribe(subject, cb=answer)
    await nats_adapter.flush(responder)  # nc.flush() can overtake the SUB
    seen: list[tuple[CorrelationIds, list[bytes]]] = []
    fast_reader = ack_inbox.read_acks

    def both(ids: CorrelationIds, settle: ack_inbox.Settle) -> nats_adapter.AckHandler:
        read = fast_reader(ids, settle)

        def tee(payloads: list[bytes]) -> None:
            seen.append((ids, list(payloads)))
            read(payloads)

        return tee

    monkeypatch.setattr(nats_engine, "read_acks", both)
    records: list[Record | bytes] = [
        b"plain",
        b"",
        Record(b"keyed", key=b"k"),
        Record(b"empty key", key=b""),
        Record(b"headers", headers={"h": b"1", "empty": b""}),
        Record(b"own id", correlation_id="mine"),
        b"v" * 300,
        Record(b"occ", expected_offset=7),  # refused, as the next two: last, so that all are sent
        b"big",
        b"enc",
    ]
    nc = await nats_adapter.connect(nats_url)
    try:
        for crc in (True, False):
            for policy in (AckPolicy.LEADER, AckPolicy.ALL):
                ids = correlation_ids(records)
                out = await nats_engine.send_over_nats(
                    nc, [subject] * len(records), records, ids, PublishOptions(ack_policy=policy), crc=crc
                )
                assert out.acked == len(records) - 3 and set(out.errors) == {7, 8, 9}
                assert [a.partition for a in out.acks[:4] if a is not None] == [0, 0, 1, 0]
                assert {a.ack_policy for a in out.acks if a is not None} == {policy}
    finally:
        await nc.close()
        await responder.close()
    assert seen
    for ids, payloads in seen:
        fast = _read(fast_reader, ids, [payloads])
        assert fast == _read(ack_inbox.read_acks_plain, ids, [payloads])
        assert any(s[1] is not None for s in fast) and any(s[2] is not None for s in fast)
