"""The NATS-direct engine: enveloped messages straight to partitions' NATS subjects, acks read
from one ack inbox, within a window, re-sent while the resend policy allows.

The window's states and steps are :class:`~.window.SendWindow`'s (as on the gRPC path); this
module runs them on a NATS connection: bursts of frames into the free room (:class:`_Wire`), the
acks read on the inbox (:func:`~.ack_inbox.read_acks`), re-sends at each burst's deadline.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge.codec import (
    NO_EXPECTED_OFFSET,
    PayloadTooLargeError,
    PublishEncoder,
)
from airflow_provider_liftbridge.nats_adapter import FastNats, fast_nats, flush

from ..error_mapping import publish_error
from ..errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    MessageTooLargeError,
    PublishError,
    UnavailableError,
)
from ..types import Ack, AckPolicy, Record
from .ack_inbox import read_acks
from .columns import RecordColumns
from .contract import accounted_failure, name_unacknowledged
from .correlation import CorrelationIds
from .options import DEFAULT_OPTIONS, PublishOptions
from .resend import DEFAULT_RESEND, ResendPolicy
from .window import SendWindow

__all__ = [
    "BulkOutcome",
    "outcome_acks",
    "partition_subject",
    "send_over_nats",
]

log = logging.getLogger(__name__)


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject of a stream partition: ``subject`` for 0, ``subject.N`` for N."""
    if partition < 0:
        raise InvalidArgumentError(f"partition must be >= 0, got {partition}")
    return subject if partition == 0 else f"{subject}.{partition}"


@dataclass(slots=True)
class BulkOutcome:
    """What :func:`send_over_nats` achieved; it raises nothing for per-record failures.

    :ivar acks: per input record, its ack or ``None``.
    :ivar errors: typed errors of refused records (ack errors, too large), by index.
    :ivar timed_out: indices that got no ack in time after every re-send the policy allowed.
    :ivar failure: a failure of the connection itself (not of one record), if any.
    :ivar sent: records published at least once.
    :ivar resent: re-sends made.
    :ivar peak_in_flight: the most records ever unacknowledged at once (never above the window).
    :ivar sent_ns: when given, each record's first send (wall-clock ns; write statistics).
    :ivar state: per record, 1 once it was handed to the connection, 0 while never (so certainly
        not stored: the window's ``written_once``); ``None``: every record was handed over if
        ``sent``, else none.
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
        return self.state.find(0) >= 0

    def unsent(self) -> list[int]:
        """The records never handed to the connection and not refused before sending: certainly
        not stored (the engine stops sending new records at the first failure)."""
        if not self.any_unsent():
            return []
        if self.state is None:
            return [i for i in range(len(self.acks)) if i not in self.errors]
        return [i for i, st in enumerate(self.state) if not st and i not in self.errors]


# Acks arrive on one subscription per call; a slow consumer would lose acks, so be generous.
_ACK_PENDING_MSGS = 1 << 20
_ACK_PENDING_BYTES = 256 << 20


async def send_over_nats(
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
    if n and (len(ids) != n or len(subjects) != n):
        raise InvalidArgumentError(f"{n} records need {n} subjects and ids, got {len(subjects)} and {len(ids)}")
    cids = ids if isinstance(ids, CorrelationIds) else CorrelationIds.of(ids)
    acked = options.policy != AckPolicy.NONE
    window = SendWindow(n, options.window_for("nats"), answers=acked)
    out = BulkOutcome(window.acks, window.errors, window.timed_out, sent_ns=sent_ns, expects_acks=acked or not n)
    if n == 0:
        return out
    out.state = window.written_once
    resend = DEFAULT_RESEND if options.resend is None else options.resend
    try:
        for subject in set(subjects):
            _check_subject(subject)
        inbox = str(nc.new_inbox()) if acked else ""
        encoder = PublishEncoder(ack_inbox=inbox, ack_policy=int(options.policy), crc=crc)
        frames = _Frames(records, cids, encoder, nc.max_payload, window.refuse)
        wire = _Wire(fast_nats(nc), subjects, frames, window, out)
        if acked:
            await _with_acks(wire, inbox, cids, options.wait, resend)
        else:
            await _without_acks(wire, options.wait)
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
    """Builds the frames of one call's records; a record too large to publish is refused (its
    :class:`MessageTooLargeError` goes to ``refuse``) and ends the burst before it."""

    def __init__(
        self,
        records: Sequence[Record | bytes],
        ids: CorrelationIds,
        encoder: PublishEncoder,
        max_payload: int,
        refuse: Callable[[int, LiftbridgeError], object],
    ) -> None:
        self._records, self._ids, self._refuse = records, ids, refuse
        self._encoder, self._max_payload = encoder, max_payload

    def burst(self, start: int, end: int) -> list[bytes]:
        """The frames of ``records[start:end]``, cut short before the first record that cannot
        be published (refused): empty only when ``records[start]`` is."""
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
                    self._refuse(
                        i,
                        MessageTooLargeError(
                            f"record {i} is {len(data)} bytes enveloped, over the NATS server's max_payload of "
                            f"{max_payload}; split it or raise max_payload on the NATS server"
                        ),
                    )
                    break
                append(data)
        except PayloadTooLargeError as exc:
            self._refuse(i, MessageTooLargeError(f"record {i} is too large to publish: {exc}"))
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


@dataclass(slots=True)
class _Wire:
    """One call's records on their way to the connection: a burst of the window's next records
    (:meth:`send`), or records again (:meth:`resend`), counted in the outcome."""

    fast: FastNats
    subjects: Sequence[str]
    frames: _Frames
    window: SendWindow
    out: BulkOutcome

    async def send(self, span: range, deadline: float | None) -> None:
        """Send the records of ``span`` that can be framed (up to the first refused one), answered
        by ``deadline``."""
        frames = self.frames.burst(span.start, span.stop)
        went = span[: len(frames)]
        if not went:
            return
        out = self.out
        # Marked before the await: a frame handed over may be stored even if the write fails.
        self.window.sent(went, deadline)
        out.peak_in_flight = max(out.peak_in_flight, self.window.in_flight)
        if out.sent_ns is not None:
            out.sent_ns[went.start : went.stop] = [time.time_ns()] * len(went)
        await self.fast.publish_burst(self.subjects[went.start : went.stop], frames)
        out.sent += len(went)

    async def resend(self, again: list[int]) -> None:
        """Send records ``again``: the same frames as the first time."""
        await self.fast.publish_burst([self.subjects[i] for i in again], [self.frames.one(i) for i in again])
        self.out.resent += len(again)


async def _without_acks(wire: _Wire, wait: float) -> None:
    """Ack policy ``NONE``: send the records a window at a time, then flush; no answer comes."""
    while span := wire.window.next_span():
        await wire.send(span, None)
    await flush(wire.fast.nc, timeout=max(1, int(wait)))


async def _with_acks(wire: _Wire, inbox: str, ids: CorrelationIds, wait: float, resend: ResendPolicy) -> None:
    """Run the window until every record is settled, late or never to be sent: send a burst into
    the free room, settle the acks as they come in on ``inbox`` (:func:`~.ack_inbox.read_acks`),
    re-send or give up on the records whose ``wait`` passed (:meth:`~.window.SendWindow.overdue`),
    and otherwise wait for acks to free room (:class:`_Room`)."""
    window, loop = wire.window, asyncio.get_running_loop()
    room = _Room(window)
    read = read_acks(ids, window.settle)
    returned = False  # the call returned: acks handed over later change nothing

    def on_acks(payloads: list[bytes]) -> None:
        if not returned:
            read(payloads)
            room.acks_came()

    fast = wire.fast
    sub = await fast.subscribe(inbox, on_acks, pending_msgs=_ACK_PENDING_MSGS, pending_bytes=_ACK_PENDING_BYTES)
    try:
        while window.running:
            span = window.next_span()  # one burst fills the free room; acks coming meanwhile free more
            if span:
                await wire.send(span, loop.time() + wait)
            if not window.in_flight:
                continue
            now = loop.time()
            if window.next_deadline <= now:
                again = window.overdue(now, resend, now + wait)
                if again:
                    await wire.resend(again)
                continue
            await room.wait(window.next_deadline - now)
    finally:
        returned = True
        fast.forget(sub)
        try:
            await sub.unsubscribe()
        except nats.errors.Error:
            pass  # the connection is going away anyway


class _Room:
    """Wakes the sender once acks have freed a quarter of the window (while there is more to
    send) or emptied it (while only waiting), rather than on every ack."""

    def __init__(self, window: SendWindow) -> None:
        self._window = window
        self._refill = window.size - max(1, window.size // 4)
        self._wake_at = self._refill
        self._event = asyncio.Event()
        self._armed = False

    def acks_came(self) -> None:
        """Acks were settled: wake the waiting sender if there is the room it waits for."""
        if self._armed and self._window.in_flight <= self._wake_at:
            self._armed = False
            self._event.set()

    async def wait(self, timeout: float) -> None:
        """Return once acks freed the room (possibly at once), or after ``timeout`` seconds."""
        self._wake_at = self._refill if self._window.more_to_send else 0
        if self._window.in_flight <= self._wake_at:
            return
        self._event.clear()
        self._armed = True
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            pass
        finally:
            self._armed = False


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
