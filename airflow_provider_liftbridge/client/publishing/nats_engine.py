"""The NATS-direct engine: enveloped messages straight to partitions' NATS subjects, acks read
from one ack inbox, within a window, re-sent while the resend policy allows.

This is the bulk path (an order of magnitude more acknowledged messages per second from Python
than gRPC; ``bench/RESULTS.md`` has the figures): the broker stores an enveloped message it
receives on a stream's subject exactly as if it came through Publish, and sends the ack to the
message's ack inbox.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge.codec import (
    NO_EXPECTED_OFFSET,
    AckDecoder,
    EnvelopeError,
    PayloadTooLargeError,
    PublishEncoder,
)
from airflow_provider_liftbridge.nats_adapter import FastNats, fast_nats, flush

from ..conversion import ack_from_pb
from ..error_mapping import check_ack, publish_error
from ..errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    MessageTooLargeError,
    PublishError,
    UnavailableError,
)
from ..types import Ack, AckError, AckPolicy, Record
from .columns import RecordColumns
from .contract import accounted_failure, name_unacknowledged
from .correlation import CorrelationIds
from .options import DEFAULT_OPTIONS, PublishOptions
from .resend import DEFAULT_RESEND, ResendPolicy

__all__ = [
    "BulkOutcome",
    "outcome_acks",
    "partition_subject",
    "publish_enveloped",
]

log = logging.getLogger(__name__)


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject of a stream partition: ``subject`` for 0, ``subject.N`` for N."""
    if partition < 0:
        raise InvalidArgumentError(f"partition must be >= 0, got {partition}")
    return subject if partition == 0 else f"{subject}.{partition}"


@dataclass(slots=True)
class BulkOutcome:
    """What :func:`publish_enveloped` achieved; it raises nothing for per-record failures.

    :ivar acks: per input record, its ack or ``None``.
    :ivar errors: typed errors of refused records (ack errors, too large), by index.
    :ivar timed_out: indices that got no ack in time after every re-send the policy allowed.
    :ivar failure: a failure of the connection itself (not of one record), if any.
    :ivar sent: records published at least once.
    :ivar resent: re-sends made.
    :ivar peak_in_flight: the most records ever unacknowledged at once (never above the window).
    :ivar sent_ns: when given, each record's first send (wall-clock ns; write statistics).
    :ivar state: per record, whether it was ever handed to the connection (0: never, so certainly
        not stored) and how it stands; ``None``: every record was handed over if ``sent``, else none.
    :ivar expects_acks: ``False`` with ``AckPolicy.NONE`` (no acks come by design).
    """

    acks: list[Ack | None]
    errors: dict[int, LiftbridgeError] = field(default_factory=dict)
    timed_out: list[int] = field(default_factory=list)
    failure: LiftbridgeError | None = None
    sent: int = 0
    resent: int = 0
    peak_in_flight: int = 0
    sent_ns: list[int] | None = None
    state: bytearray | None = None
    expects_acks: bool = True

    @property
    def acked(self) -> int:
        return sum(1 for a in self.acks if a is not None)

    def any_unsent(self) -> bool:
        """Whether some record was never handed to the connection (at C speed)."""
        if self.state is None:
            return self.sent == 0 and bool(self.acks)
        return self.state.find(_UNSENT_BYTE) >= 0

    def unsent(self) -> list[int]:
        """The records never handed to the connection and not refused before sending: certainly
        not stored (the engine stops sending new records at the first failure)."""
        if not self.any_unsent():
            return []
        if self.state is None:
            return [i for i in range(len(self.acks)) if i not in self.errors]
        return [i for i, st in enumerate(self.state) if st == _UNSENT and i not in self.errors]


# Acks arrive on one subscription per call; a slow consumer would lose acks, so be generous.
_ACK_PENDING_MSGS = 1 << 20
_ACK_PENDING_BYTES = 256 << 20
# Per-record states of one call (a bytearray, one byte per record).
_UNSENT, _FLYING, _SETTLED, _LATE = 0, 1, 2, 3  # _LATE: timed out, but a late ack still counts
_FLYING_BYTE, _UNSENT_BYTE = bytes([_FLYING]), bytes([_UNSENT])


async def publish_enveloped(
    nc: NatsClient,
    subjects: Sequence[str],
    records: Sequence[Record | bytes],
    ids: Sequence[str],
    options: PublishOptions = DEFAULT_OPTIONS,
    *,
    crc: bool = True,
    sent_ns: list[int] | None = None,
) -> BulkOutcome:
    """Publish ``records[i]`` as an enveloped message on ``subjects[i]`` with correlation id
    ``ids[i]`` and collect the acks on one fresh ack inbox.

    ``options`` (partitions are the caller's: ``subjects``): at most ``options.window`` records
    are unacknowledged at any time (unset: the NATS path's, :data:`~.options.NATS_WINDOW`). A
    record whose ack has not come ``options.timeout`` seconds after it was sent (unset:
    :attr:`~.options.PublishOptions.wait`) is re-sent (same frame, same correlation id) while
    ``options.resend`` allows it (unset: :data:`~.resend.DEFAULT_RESEND`), else it
    counts as timed out; the first ack of a correlation id wins,
    later copies are ignored. The first refused or timed-out record stops new sends; records
    already in flight are still waited for. With ``AckPolicy.NONE`` the records are published and
    flushed, and no ack is expected.

    ``ids`` is best a :class:`CorrelationIds` (what :func:`~.correlation.correlation_ids` returns): acks are
    then matched by parsing the record's index out of the id; any other sequence of unique ids
    is matched through a dictionary. ``sent_ns`` (as long as ``records``), when given, gets each
    record's first send time in wall-clock nanoseconds (for write statistics).

    Per-record problems are reported in the returned :class:`BulkOutcome`, never raised; the
    caller turns it into a result with :func:`outcome_acks`.

    :raises InvalidArgumentError: ``ids`` holds a duplicate or is not as long as ``records``.
    """
    n = len(records)
    out = BulkOutcome([None] * n, sent_ns=sent_ns)
    if n == 0:
        return out
    if len(ids) != n or len(subjects) != n:
        raise InvalidArgumentError(f"{n} records need {n} subjects and ids, got {len(subjects)} and {len(ids)}")
    cids = ids if isinstance(ids, CorrelationIds) else CorrelationIds.of(ids)
    ack_policy, ack_timeout = options.policy, options.wait
    window = options.window_for("nats")
    resend = DEFAULT_RESEND if options.resend is None else options.resend
    fast = fast_nats(nc)
    try:
        for subject in set(subjects):
            _check_subject(subject)
        if ack_policy == AckPolicy.NONE:
            out.expects_acks = False
            out.state = state = bytearray(n)
            frames = _Frames(records, cids, out, PublishEncoder(ack_policy=int(ack_policy), crc=crc), nc.max_payload)
            for start in range(0, n, max(window, 1)):
                sent = frames.burst(start, min(n, start + window))
                if sent:
                    # Marked before the await: a frame handed over may be stored even if this fails.
                    state[start : start + len(sent)] = _FLYING_BYTE * len(sent)
                    await fast.publish_burst(subjects[start : start + len(sent)], sent)
                    out.sent += len(sent)
                if out.errors:
                    break
            await flush(nc, timeout=max(1, int(ack_timeout)))
            return out
        return await _with_acks(fast, subjects, records, cids, out, window, ack_timeout, resend, int(ack_policy), crc)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        out.failure = UnavailableError(
            f"the NATS connection failed after {out.sent} of {n} records were sent ({type(exc).__name__}: {exc}); "
            "check that NATS is up and reachable"
        )
        return out


def _check_subject(subject: str) -> None:
    # What nats-py checks on every publish (an empty subject, whitespace or CR/LF could break or
    # inject protocol lines), once per subject here since bursts skip publish().
    if not subject or any(c.isspace() for c in subject):
        raise InvalidArgumentError(f"{subject!r} is not a valid NATS subject (empty, or with whitespace)")


class _Frames:
    """Builds the frames of one call's records; a record too large to publish gets its
    :class:`MessageTooLargeError` in the outcome and ends the burst before it."""

    def __init__(
        self,
        records: Sequence[Record | bytes],
        ids: CorrelationIds,
        out: BulkOutcome,
        encoder: PublishEncoder,
        max_payload: int,
    ) -> None:
        self._records, self._ids, self._out = records, ids, out
        self._encoder, self._max_payload = encoder, max_payload

    def burst(self, start: int, end: int) -> list[bytes]:
        """The frames of ``records[start:end]``, cut short before the first record that cannot
        be published."""
        records, encoder, max_payload = self._records, self._encoder, self._max_payload
        encode_value, encode = encoder.encode_value, encoder.encode
        prefix, own = self._ids.prefix_bytes, self._ids.own_bytes
        if not own and end - start > 1:
            # The bulk cases, with generated ids, framed in one call: values only, or columns (an
            # exactly-once batch). Any problem is found again and named by the loop below.
            columns = records.__class__ is RecordColumns
            chunk = records[start:end]
            if columns or set(map(type, chunk)) == {bytes}:
                cids = [b"%s%d" % (prefix, i) for i in range(start, end)]
                try:
                    if columns:
                        frames = _encode_columns(encoder, chunk, cids)  # type: ignore[arg-type]
                    else:
                        frames = encoder.encode_values(chunk, cids)  # type: ignore[arg-type]
                except PayloadTooLargeError:
                    frames = []
                if frames and max(map(len, frames)) <= max_payload:
                    return frames
        frames = []
        append = frames.append
        i = start
        try:
            for i in range(start, end):
                rec = records[i]
                cid = (own.get(i) if own else None) or b"%s%d" % (prefix, i)
                if type(rec) is bytes:
                    data = encode_value(rec, cid)
                else:
                    data = _encode_record(encode, rec, cid)  # type: ignore[arg-type]
                if len(data) > max_payload:
                    self._out.errors[i] = MessageTooLargeError(
                        f"record {i} is {len(data)} bytes enveloped, over the NATS server's max_payload of "
                        f"{max_payload}; split it or raise max_payload on the NATS server"
                    )
                    break
                append(data)
        except PayloadTooLargeError as exc:
            self._out.errors[i] = MessageTooLargeError(f"record {i} is too large to publish: {exc}")
        return frames

    def one(self, i: int) -> bytes:
        """The frame of record ``i`` again (for a re-send: the same bytes as the first time)."""
        frames = self.burst(i, i + 1)
        assert frames, "a record that was sent once can be framed again"
        return frames[0]


def _encode_columns(encoder: PublishEncoder, columns: RecordColumns, cids: list[bytes]) -> list[bytes]:
    offsets = columns.expected_offsets
    return encoder.encode_many(
        columns.values,
        cids,
        columns.header_wires,
        [NO_EXPECTED_OFFSET] * len(cids) if offsets is None else offsets,
        columns.keys,
    )


def _encode_record(encode: Callable[..., bytes], rec: Record, cid: bytes) -> bytes:
    return encode(
        rec.value,
        cid,
        key=rec.key or b"",
        headers=rec.headers,
        expected_offset=-1 if rec.expected_offset is None else rec.expected_offset,
    )


async def _with_acks(
    fast: FastNats,
    subjects: Sequence[str],
    records: Sequence[Record | bytes],
    ids: CorrelationIds,
    out: BulkOutcome,
    window: int,
    ack_timeout: float,
    resend: ResendPolicy,
    policy: int,
    crc: bool,
) -> BulkOutcome:
    nc = fast.nc
    n = len(records)
    loop = asyncio.get_running_loop()
    acks, errors, timed_out = out.acks, out.errors, out.timed_out
    out.state = state = bytearray(n)  # _UNSENT, _FLYING, _SETTLED or _LATE per record
    sends: dict[int, int] = {}  # sends so far of records sent more than once
    # (deadline, indices) of each burst, in deadline order; a burst stays until its deadline
    # passes, when its records still flying are re-sent or time out.
    bursts: deque[tuple[float, Sequence[int]]] = deque()
    flying = 0
    room = asyncio.Event()
    armed = False  # the sender waits on room for flying <= wake_at
    # Wake the sender when a quarter of the window is free (while sending) or when nothing is in
    # flight (while draining), rather than on every ack.
    refill = window - max(1, window // 4)
    wake_at = refill
    decode = AckDecoder().decode
    index_of = ids.index_of
    prefix, plen, own = ids.prefix, len(ids.prefix), bool(ids.own)
    # For building acks (see _UnfrozenAck): partitions parsed once per subject.
    unfreeze, new_ack, acked_class = _UNFREEZE_WORKS, object.__new__, Ack
    partitions: dict[str, int] = {}
    policies, leader, ok = {p.value: p for p in AckPolicy}, AckPolicy.LEADER, AckError.OK

    done = False  # the call has returned: acks handed over later change nothing

    def on_acks(payloads: list[bytes]) -> None:
        nonlocal flying, armed
        if done:
            return
        for data in payloads:
            try:
                pb = decode(data)
            except EnvelopeError as exc:
                log.warning("ignoring a frame on the ack inbox that is not an ack: %s", exc)
                continue
            cid = pb.correlationId
            # index_of(cid), inlined for generated ids (the bulk case).
            if own or not cid.startswith(prefix):
                i = index_of(cid)
                if i < 0:
                    continue  # not ours
            else:
                try:
                    i = int(cid[plen:])
                except ValueError:
                    continue  # not ours
                if not 0 <= i < n:
                    continue
            st = state[i]
            if st == _FLYING:
                flying -= 1
            elif st == _LATE:
                timed_out.remove(i)
            else:
                continue  # a second ack after a re-send
            state[i] = _SETTLED
            if pb.ackError == 0 and unfreeze:
                # ack_from_pb(pb), inlined, on the unfrozen twin (a test holds the two equal).
                ack: Any = new_ack(_UnfrozenAck)
                ms = ack.msg_subject = pb.msgSubject
                part = partitions.get(ms)
                if part is None:
                    part = partitions[ms] = ack_from_pb(pb).partition
                ack.partition = part
                ack.stream = pb.stream
                ack.partition_subject = pb.partitionSubject
                ack.offset = pb.offset
                ack.ack_inbox = pb.ackInbox
                ack.correlation_id = cid
                ack.ack_policy = policies.get(pb.ackPolicy, leader)
                ack.reception_timestamp = pb.receptionTimestamp
                ack.commit_timestamp = pb.commitTimestamp
                ack.ack_error = ok
                ack.__class__ = acked_class
                acks[i] = ack
            elif pb.ackError == 0:
                acks[i] = ack_from_pb(pb)
            else:
                try:
                    check_ack(ack_from_pb(pb))
                except LiftbridgeError as exc:
                    errors[i] = exc
        if armed and flying <= wake_at:
            armed = False
            room.set()

    inbox = str(nc.new_inbox())
    frames = _Frames(records, ids, out, PublishEncoder(ack_inbox=inbox, ack_policy=policy, crc=crc), nc.max_payload)
    sub = await fast.subscribe(inbox, on_acks, pending_msgs=_ACK_PENDING_MSGS, pending_bytes=_ACK_PENDING_BYTES)
    try:
        nxt = 0
        while True:
            if nxt < n and not errors and not timed_out and flying < window:
                # One burst fills the free room; acks arriving meanwhile free more for the next.
                start = nxt
                burst = frames.burst(start, min(n, start + window - flying))
                k = len(burst)
                nxt = start + k
                if k:
                    state[start : start + k] = _FLYING_BYTE * k
                    flying += k
                    bursts.append((loop.time() + ack_timeout, range(start, start + k)))
                    if out.sent_ns is not None:
                        out.sent_ns[start : start + k] = [time.time_ns()] * k
                    await fast.publish_burst(subjects[start : start + k], burst)
                    out.sent += k
                    if flying > out.peak_in_flight:
                        out.peak_in_flight = flying
            if not flying:
                if nxt >= n or errors or timed_out:
                    break
                continue
            now = loop.time()
            if bursts[0][0] <= now:
                # Not `flying -= await ...`: acks handled during the await change flying.
                gave_up = await _expire(
                    fast, frames, subjects, bursts, state, sends, timed_out, now, ack_timeout, resend, out
                )
                flying -= gave_up
                continue
            sending = nxt < n and not errors and not timed_out
            wake_at = refill if sending else 0
            if flying <= wake_at:
                continue  # acks freed the room already
            room.clear()
            armed = True
            try:
                async with asyncio.timeout(bursts[0][0] - now):
                    await room.wait()
            except TimeoutError:
                pass
            armed = False
    finally:
        done = True
        fast.forget(sub)
        try:
            await sub.unsubscribe()
        except nats.errors.Error:
            pass  # the connection is going away anyway
    return out


async def _expire(
    fast: FastNats,
    frames: _Frames,
    subjects: Sequence[str],
    bursts: deque[tuple[float, Sequence[int]]],
    state: bytearray,
    sends: dict[int, int],
    timed_out: list[int],
    now: float,
    ack_timeout: float,
    resend: ResendPolicy,
    out: BulkOutcome,
) -> int:
    """Re-send or give up on every record still flying in the bursts whose deadline has passed;
    return how many stopped flying (timed out)."""
    again: list[int] = []
    gave_up = 0
    while bursts and bursts[0][0] <= now:
        _, indices = bursts.popleft()
        for i in indices:
            if state[i] != _FLYING:
                continue
            attempt = sends.get(i, 1) + 1
            if resend.should_resend(i, attempt):
                sends[i] = attempt
                again.append(i)
            else:
                state[i] = _LATE
                timed_out.append(i)
                gave_up += 1
    if again:
        bursts.append((now + ack_timeout, again))
        await fast.publish_burst([subjects[i] for i in again], [frames.one(i) for i in again])
        out.resent += len(again)
    return gave_up


class _UnfrozenAck:
    """Same slots, in the same order, as :class:`Ack`, without the frozen ``__setattr__``: the
    bulk engine fills an ack in here with plain attribute stores, then makes it an ``Ack`` by
    ``__class__`` assignment (Python allows it between classes of the same slot layout). A
    fraction of the cost of calling each frozen slot's setter, which was the largest item of an
    ack's cost after parsing. Where the assignment does not work, the engine uses
    ``ack_from_pb``."""

    __slots__ = tuple(f.name for f in fields(Ack))


def _unfreeze_works() -> bool:
    """Whether an :class:`_UnfrozenAck` can become an :class:`Ack` (checked once at import; the
    engine falls back to ``ack_from_pb`` if a future ``Ack`` changes its layout)."""
    try:
        probe: Any = object.__new__(_UnfrozenAck)
        for f in fields(Ack):
            setattr(probe, f.name, None)
        probe.__class__ = Ack
    except TypeError:
        return False
    return type(probe) is Ack and all(getattr(probe, f.name) is None for f in fields(Ack))


_UNFREEZE_WORKS = _unfreeze_works()


_NONES = itertools.repeat(None)


def outcome_acks(out: BulkOutcome, where: str) -> list[Ack]:
    """The acks of a complete outcome, in input order (``[]`` with ack policy ``NONE``);
    otherwise raise, naming every record that has no ack.

    Timed-out records must already have their typed error in ``out.errors`` (callers that know
    more than NATS does, e.g. that the partition became read-only, put a better one there); any
    left are reported as :class:`AckTimeoutError`. Records never handed to the connection get
    :class:`NotSentError`; after a connection failure, the others get the failure ("may or may
    not be stored"). The publish contract (:mod:`.contract`) then checks that nothing is left.

    :param where: names the target in messages, e.g. ``"stream 'orders'"``.
    :raises PublishError: a record failed or the connection did; ``__cause__`` is the first error.
    """
    errors, acks, failure = out.errors, out.acks, out.failure
    if not errors and not out.timed_out and failure is None:
        if not out.expects_acks:
            if not out.any_unsent():
                return []
        # `None not in acks` would call Ack.__eq__ once per ack; an identity test per ack runs at C speed.
        elif not any(map(operator.is_, acks, _NONES)):
            return acks  # type: ignore[return-value]  # every record acknowledged: no None left
    for i in out.timed_out:
        errors.setdefault(
            i,
            AckTimeoutError(
                f"no ack for record {i} on {where}; the broker may have dropped it (paused or read-only partition, "
                "refused expected offset) or be down or overloaded. It may or may not be stored."
            ),
        )
    first = min(errors) if errors else None

    def in_doubt(i: int) -> LiftbridgeError:
        return UnavailableError(
            f"record {i} was sent to {where} and the connection failed before it was settled ({failure}); "
            "it may or may not be stored"
        )

    if first is not None:
        stopped_by = f"record {first}'s failure"
    else:
        stopped_by = "a failure of the connection" if failure is not None else "an unexplained stop of the engine"
    name_unacknowledged(
        acks, errors, unsent=out.unsent(), in_doubt=None if failure is None else in_doubt, stopped_by=stopped_by
    )
    if failure is not None and first is None:
        raise publish_error(acks, None, errors, f"publishing to {where} failed: {failure}") from failure
    if errors:
        first = min(errors)
        raise publish_error(acks, first, errors, f"record {first} failed: {errors[first]}") from errors[first]
    # Neither acknowledged nor named: the publish contract reports each such record.
    raise accounted_failure(PublishError("", acks=acks, index=None), len(acks), where, expects_acks=out.expects_acks)
