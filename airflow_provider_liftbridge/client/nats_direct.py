"""NATS-direct publishing: enveloped messages straight to a stream's NATS subject, acks read
from an ack inbox.

This is the bulk path (tens of thousands of acknowledged messages per second from Python, where
gRPC manages a few thousand): the broker stores an enveloped message it receives on a stream's
subject exactly as if it came through Publish, and sends the ack to the message's ack inbox. It
needs the NATS servers the brokers listen to. Built on nats-py and the project's codec.

:func:`publish_enveloped` is the engine (window, ack matching by correlation id, re-sends);
:class:`NatsPublisher` wraps it for callers that hold only a NATS URL, and
``LiftbridgeClient.publish_many`` uses it when the client knows NATS servers (see :mod:`.bulk`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec import (
    EnvelopeError,
    PayloadTooLargeError,
    encode_message,
    new_message,
    unmarshal_ack,
)

from ._core import ack_from_pb, check_ack
from .errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    MessageTooLargeError,
    PublishError,
    UnavailableError,
)
from .types import Ack, AckPolicy, Record

__all__ = [
    "DEFAULT_RESEND",
    "NO_RESEND",
    "BulkOutcome",
    "NatsPublisher",
    "NoResend",
    "ResendPolicy",
    "ResendUnacked",
    "outcome_acks",
    "partition_subject",
    "publish_enveloped",
    "publish_many_direct",
]

log = logging.getLogger(__name__)


def partition_subject(subject: str, partition: int) -> str:
    """The NATS subject of a stream partition: ``subject`` for 0, ``subject.N`` for N."""
    if partition < 0:
        raise InvalidArgumentError(f"partition must be >= 0, got {partition}")
    return subject if partition == 0 else f"{subject}.{partition}"


# ---------------------------------------------------------------------------------------------
# Re-send policies
# ---------------------------------------------------------------------------------------------


class ResendPolicy(Protocol):
    """Decides whether a record is published again when its ack did not come in time (NATS path)
    or its connection was lost before the ack (gRPC path). Re-sending makes publishing
    at-least-once: the first copy may have been stored too.
    """

    def should_resend(self, index: int, attempt: int) -> bool:
        """:param index: the record's position in the call's input.
        :param attempt: the send this would be (2 for the first re-send).
        :returns: ``True`` to publish the record again, ``False`` to give up on it (the call then
            raises ``PublishError`` with an ``AckTimeoutError`` for it).
        """
        ...


@dataclass(frozen=True, slots=True)
class ResendUnacked:
    """Re-send every unacknowledged record, up to ``max_resends`` times (the default policy).

    :raises InvalidArgumentError: ``max_resends`` is negative.
    """

    max_resends: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.max_resends, bool) or not isinstance(self.max_resends, int) or self.max_resends < 0:
            raise InvalidArgumentError(f"max_resends must be a whole number >= 0, got {self.max_resends!r}")

    def should_resend(self, index: int, attempt: int) -> bool:
        return attempt - 1 <= self.max_resends


@dataclass(frozen=True, slots=True)
class NoResend:
    """Never re-send: a record without an ack in time fails the call. For callers that decide
    themselves what to publish again (exactly-once publishing scans the partition first)."""

    def should_resend(self, index: int, attempt: int) -> bool:
        return False


#: Never re-send (see :class:`NoResend`).
NO_RESEND = NoResend()
#: What ``publish_many`` does unless told otherwise: up to two re-sends per record.
DEFAULT_RESEND = ResendUnacked()


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


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
    """

    acks: list[Ack | None]
    errors: dict[int, LiftbridgeError] = field(default_factory=dict)
    timed_out: list[int] = field(default_factory=list)
    failure: LiftbridgeError | None = None
    sent: int = 0
    resent: int = 0
    peak_in_flight: int = 0

    @property
    def acked(self) -> int:
        return sum(1 for a in self.acks if a is not None)


# In-flight entry: [index, deadline, sends so far, subject, frame]; a list, cheaper than an object.
_INDEX, _DEADLINE, _SENDS, _SUBJECT, _FRAME = range(5)
# Acks arrive on one subscription per call; a slow consumer would lose acks, so be generous.
_ACK_PENDING_MSGS = 1 << 20
_ACK_PENDING_BYTES = 256 << 20


async def publish_enveloped(
    nc: NatsClient,
    subjects: Sequence[str],
    records: Sequence[Record | bytes],
    ids: Sequence[str],
    *,
    ack_policy: AckPolicy = AckPolicy.LEADER,
    window: int = 1024,
    ack_timeout: float = 10.0,
    resend: ResendPolicy = DEFAULT_RESEND,
    crc: bool = True,
) -> BulkOutcome:
    """Publish ``records[i]`` as an enveloped message on ``subjects[i]`` with correlation id
    ``ids[i]`` and collect the acks on one fresh ack inbox.

    At most ``window`` records are unacknowledged at any time. A record whose ack has not come
    ``ack_timeout`` seconds after it was sent is re-sent (same frame, same correlation id) while
    ``resend`` allows it, else it counts as timed out; the first ack of a correlation id wins,
    later copies are ignored. The first refused or timed-out record stops new sends; records
    already in flight are still waited for. With ``AckPolicy.NONE`` the records are published and
    flushed, and no ack is expected.

    Per-record problems are reported in the returned :class:`BulkOutcome`, never raised; the
    caller turns it into a result with :func:`outcome_acks`.
    """
    n = len(records)
    out = BulkOutcome([None] * n)
    if n == 0:
        return out
    policy = int(ack_policy)
    max_payload = nc.max_payload

    def frame(i: int, framer: _Framer) -> bytes | None:
        try:
            data = framer(records[i], ids[i])
        except PayloadTooLargeError as exc:
            out.errors[i] = MessageTooLargeError(f"record {i} is too large to publish: {exc}")
            return None
        if len(data) > max_payload:
            out.errors[i] = MessageTooLargeError(
                f"record {i} is {len(data)} bytes enveloped, over the NATS server's max_payload of {max_payload}; "
                "split it or raise max_payload on the NATS server"
            )
            return None
        return data

    try:
        if ack_policy == AckPolicy.NONE:
            framer = _Framer("", policy, crc)
            for i in range(n):
                data = frame(i, framer)
                if data is None:
                    break
                await nc.publish(subjects[i], data)
                out.sent += 1
            await nc.flush(timeout=max(1, int(ack_timeout)))
            return out
        return await _with_acks(nc, subjects, ids, frame, out, window, ack_timeout, resend, policy, crc)
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        out.failure = UnavailableError(
            f"the NATS connection failed after {out.sent} of {n} records were sent ({type(exc).__name__}: {exc}); "
            "check that NATS is up and reachable"
        )
        return out


class _Framer:
    """Builds the enveloped frames of one call. It reuses one ``Message`` protobuf, setting only
    what differs per record: cheaper than building a protobuf per record, same bytes."""

    def __init__(self, inbox: str, policy: int, crc: bool) -> None:
        self._msg = api_pb2.Message(ackInbox=inbox, ackPolicy=policy, offset=-1)  # type: ignore[arg-type]
        self._inbox = inbox
        self._policy = policy
        self._crc = crc
        self._dirty = False  # key or offset set by the previous record

    def __call__(self, rec: Record | bytes, correlation_id: str) -> bytes:
        msg = self._msg
        if isinstance(rec, Record):
            if rec.headers:
                return new_message(
                    rec.value,
                    key=rec.key or b"",
                    headers=rec.headers,
                    ack_inbox=self._inbox,
                    correlation_id=correlation_id,
                    ack_policy=self._policy,
                    expected_offset=-1 if rec.expected_offset is None else rec.expected_offset,
                    crc=self._crc,
                )
            msg.key = rec.key or b""
            msg.offset = -1 if rec.expected_offset is None else rec.expected_offset
            msg.value = rec.value
            self._dirty = True
        else:
            if self._dirty:
                msg.key = b""
                msg.offset = -1
                self._dirty = False
            msg.value = rec
        msg.correlationId = correlation_id
        return encode_message(msg, crc=self._crc)


async def _with_acks(
    nc: NatsClient,
    subjects: Sequence[str],
    ids: Sequence[str],
    frame: Any,
    out: BulkOutcome,
    window: int,
    ack_timeout: float,
    resend: ResendPolicy,
    policy: int,
    crc: bool,
) -> BulkOutcome:
    n = len(ids)
    loop = asyncio.get_running_loop()
    acks, errors, timed_out = out.acks, out.errors, out.timed_out
    inflight: dict[str, list[Any]] = {}  # in send order, so the first entry has the nearest deadline
    expired: dict[str, int] = {}  # timed out, but a late ack still counts until the call returns
    room = asyncio.Event()
    # Wake the sender when a quarter of the window is free (while sending) or when nothing is in
    # flight (while draining), rather than on every ack.
    refill = window - max(1, window // 4)
    wake_at = [refill]

    async def on_ack(msg: Any) -> None:
        try:
            pb = unmarshal_ack(msg.data)
        except EnvelopeError as exc:
            log.warning("ignoring a frame on the ack inbox that is not an ack: %s", exc)
            return
        flight = inflight.pop(pb.correlationId, None)
        if flight is not None:
            i = flight[_INDEX]
        else:
            i = expired.pop(pb.correlationId, -1)
            if i < 0:
                return  # a second ack after a re-send, or not ours
            timed_out.remove(i)
        ack = ack_from_pb(pb)
        if pb.ackError == 0:
            acks[i] = ack
        else:
            try:
                check_ack(ack)
            except LiftbridgeError as exc:
                errors[i] = exc
        if len(inflight) <= wake_at[0]:
            room.set()

    inbox = str(nc.new_inbox())
    framer = _Framer(inbox, policy, crc)
    sub = await nc.subscribe(
        inbox, cb=on_ack, pending_msgs_limit=_ACK_PENDING_MSGS, pending_bytes_limit=_ACK_PENDING_BYTES
    )
    try:
        nxt = 0
        publish = nc.publish
        while True:
            if nxt < n and not errors and not timed_out and len(inflight) < window:
                # One burst fills the free room; acks arriving meanwhile free more for the next.
                deadline = loop.time() + ack_timeout
                start, end = nxt, min(n, nxt + window - len(inflight))
                for i in range(start, end):
                    nxt = i + 1
                    data = frame(i, framer)
                    if data is None:
                        break
                    subject = subjects[i]
                    inflight[ids[i]] = [i, deadline, 1, subject, data]
                    await publish(subject, data)
                    out.sent += 1
                else:
                    nxt = end
                if len(inflight) > out.peak_in_flight:
                    out.peak_in_flight = len(inflight)
            if not inflight:
                if nxt >= n or errors or timed_out:
                    break
                continue
            delay = next(iter(inflight.values()))[_DEADLINE] - loop.time()
            if delay <= 0:
                await _expire(nc, inflight, expired, timed_out, loop.time(), ack_timeout, resend, out)
                continue
            sending = nxt < n and not errors and not timed_out
            wake_at[0] = refill if sending else 0
            room.clear()
            if len(inflight) <= wake_at[0]:
                continue  # acks freed the room before we cleared the flag
            try:
                async with asyncio.timeout(delay):
                    await room.wait()
            except TimeoutError:
                pass
    finally:
        try:
            await sub.unsubscribe()
        except nats.errors.Error:
            pass  # the connection is going away anyway
    return out


async def _expire(
    nc: NatsClient,
    inflight: dict[str, list[Any]],
    expired: dict[str, int],
    timed_out: list[int],
    now: float,
    ack_timeout: float,
    resend: ResendPolicy,
    out: BulkOutcome,
) -> None:
    """Re-send or give up on every in-flight record whose deadline has passed."""
    while inflight:
        cid, flight = next(iter(inflight.items()))
        if flight[_DEADLINE] > now:
            return
        del inflight[cid]
        if resend.should_resend(flight[_INDEX], flight[_SENDS] + 1):
            flight[_DEADLINE] = now + ack_timeout
            flight[_SENDS] += 1
            inflight[cid] = flight  # back at the end: the newest deadline
            await nc.publish(flight[_SUBJECT], flight[_FRAME])
            out.resent += 1
        else:
            expired[cid] = flight[_INDEX]
            timed_out.append(flight[_INDEX])


def outcome_acks(out: BulkOutcome, where: str) -> list[Ack]:
    """The acks of a complete outcome, in input order; otherwise raise.

    Timed-out records must already have their typed error in ``out.errors`` (callers that know
    more than NATS does — e.g. that the partition became read-only — put a better one there);
    any left are reported as :class:`AckTimeoutError`.

    :param where: names the target in messages, e.g. ``"stream 'orders'"``.
    :raises PublishError: a record failed or the connection did; ``__cause__`` is the first error.
    """
    errors = out.errors
    for i in out.timed_out:
        errors.setdefault(
            i,
            AckTimeoutError(
                f"no ack for record {i} on {where}; the broker may have dropped it (paused or read-only partition, "
                "refused expected offset) or be down or overloaded. It may or may not be stored."
            ),
        )
    if out.failure is not None and not errors:
        raise _publish_error(out.acks, None, errors, f"publishing to {where} failed: {out.failure}") from out.failure
    if errors:
        first = min(errors)
        raise _publish_error(out.acks, first, errors, f"record {first} failed: {errors[first]}") from errors[first]
    return [a for a in out.acks if a is not None]


def _publish_error(
    acks: list[Ack | None], index: int | None, errors: dict[int, LiftbridgeError], why: str
) -> PublishError:
    done = sum(1 for a in acks if a is not None)
    return PublishError(f"{done} of {len(acks)} records acknowledged; {why}", acks=acks, index=index, errors=errors)


def correlation_ids(records: Sequence[Record | bytes]) -> list[str]:
    """One correlation id per record: its own, or ``<batch>-<index>``.

    :raises InvalidArgumentError: two records share a correlation id.
    """
    batch = uuid.uuid4().hex[:12]
    ids = [
        rec.correlation_id if isinstance(rec, Record) and rec.correlation_id else f"{batch}-{i}"
        for i, rec in enumerate(records)
    ]
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError("correlation ids must be unique within one publish_many call")
    return ids


async def _log_nats_error(exc: Exception) -> None:
    # nats-py's default prints a traceback per failed attempt; the caller gets a typed error anyway.
    log.debug("NATS: %s: %s", type(exc).__name__, exc)


async def connect_nats(servers: str | Sequence[str], *, connect_timeout: float = 5.0) -> NatsClient:
    """Connect to NATS with settings fit for bulk publishing (a large outbound buffer, subjects
    not re-validated on every publish: they come from stream metadata).

    :raises InvalidArgumentError: no server given.
    :raises UnavailableError: no NATS server could be reached.
    """
    urls = [servers] if isinstance(servers, str) else list(servers)
    if not urls:
        raise InvalidArgumentError("nats_servers is empty; give at least one 'nats://host:port' URL")
    try:
        nc = await nats.connect(
            servers=urls,
            connect_timeout=int(max(1, connect_timeout)),
            # Also bounds the first connect: ~1 s to give up on a server that refuses connections.
            max_reconnect_attempts=5,
            reconnect_time_wait=0.2,
            allow_reconnect=True,
            pending_size=64 * 1024 * 1024,
            skip_subject_validation=True,
            error_cb=_log_nats_error,
        )
    except Exception as exc:  # nats-py raises several unrelated types for "cannot connect"
        raise UnavailableError(f"cannot connect to NATS at {urls}: {exc}; check nats_servers") from exc
    return nc


# ---------------------------------------------------------------------------------------------
# The standalone publisher
# ---------------------------------------------------------------------------------------------


class NatsPublisher:
    """Publishes enveloped messages on NATS and collects their acks. An async context manager.

    :param nc: a connected nats-py client (see :meth:`connect`).
    """

    def __init__(self, nc: NatsClient) -> None:
        self._nc = nc

    @classmethod
    async def connect(cls, servers: str | Sequence[str], *, connect_timeout: float = 5.0) -> NatsPublisher:
        """Connect to NATS.

        :raises InvalidArgumentError: no server given.
        :raises UnavailableError: no NATS server could be reached.
        """
        return cls(await connect_nats(servers, connect_timeout=connect_timeout))

    async def close(self) -> None:
        """Flush and close the NATS connection; idempotent."""
        if not self._nc.is_closed:
            await self._nc.drain()

    async def __aenter__(self) -> NatsPublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def new_inbox(self) -> str:
        """A fresh, unique ack inbox subject."""
        return str(self._nc.new_inbox())

    async def publish(
        self,
        subject: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        ack_inbox: str | None = None,
        correlation_id: str | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        expected_offset: int | None = None,
    ) -> None:
        """Publish one enveloped message on ``subject`` (a partition's subject). Its ack, if the
        policy asks for one, goes to ``ack_inbox``: read it with :meth:`acks`."""
        frame = new_message(
            value,
            key=key or b"",
            headers=headers,
            ack_inbox=ack_inbox or "",
            correlation_id=correlation_id or "",
            ack_policy=int(ack_policy),
            expected_offset=-1 if expected_offset is None else expected_offset,
        )
        await self._nc.publish(subject, frame)

    async def acks(self, inbox: str) -> AsyncIterator[Ack]:
        """Yield the acks arriving on ``inbox`` until the caller stops iterating. Frames that are
        not acks are logged and skipped."""
        sub = await self._nc.subscribe(inbox)
        try:
            async for msg in sub.messages:
                ack = _decode_ack(msg.data)
                if ack is not None:
                    yield ack
        finally:
            await sub.unsubscribe()

    async def publish_many(
        self,
        subject: str,
        records: Iterable[Record | bytes],
        *,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        window: int = 1024,
        timeout: float = 10.0,
        resend: ResendPolicy = NO_RESEND,
    ) -> list[Ack]:
        """Publish records on the partition subjects of the stream subject ``subject`` (a
        record's ``partition`` picks ``subject.N``), at most ``window`` unacknowledged at a time,
        and return their acks in input order (``[]`` with ``AckPolicy.NONE``).

        A record without an ack ``timeout`` seconds after it was sent fails the call with an
        :class:`AckTimeoutError`, unless ``resend`` allows sending it again (e.g.
        :data:`DEFAULT_RESEND`: at-least-once). This standalone publisher never re-sends unless
        asked, because exactly-once publishing builds on it; ``LiftbridgeClient.publish_many``
        re-sends by default. A message the broker drops without an ack (paused or read-only
        partition) ends as an :class:`AckTimeoutError`.

        :raises PublishError: some record was refused or not acknowledged; ``.errors`` holds the
            typed error of each (``IncorrectOffsetError``, ``MessageTooLargeError``,
            ``AckTimeoutError``, ...).
        :raises InvalidArgumentError: a bad window, record or duplicate correlation id, before
            anything is sent.
        """
        if window < 1:
            raise InvalidArgumentError(f"window must be at least 1, got {window}")
        items: list[Record | bytes] = [
            r if type(r) is bytes else Record(bytes(r)) if isinstance(r, bytearray | memoryview) else r for r in records
        ]
        for i, rec in enumerate(items):
            if not isinstance(rec, Record | bytes):
                raise InvalidArgumentError(f"record {i} is a {type(rec).__name__}; pass Record objects or bytes")
        subject_of: dict[int, str] = {}
        subjects = []
        for rec in items:
            p = (rec.partition or 0) if isinstance(rec, Record) else 0
            if p not in subject_of:
                subject_of[p] = partition_subject(subject, p)
            subjects.append(subject_of[p])
        out = await publish_enveloped(
            self._nc,
            subjects,
            items,
            correlation_ids(items),
            ack_policy=ack_policy,
            window=window,
            ack_timeout=timeout,
            resend=resend,
        )
        return outcome_acks(out, f"subject {subject!r} (ack timeout {timeout:g} s)")


def _decode_ack(data: bytes) -> Ack | None:
    try:
        return ack_from_pb(unmarshal_ack(data))
    except EnvelopeError as exc:
        log.warning("ignoring a frame on an ack inbox that is not an ack: %s", exc)
        return None


def publish_many_direct(
    servers: str | Sequence[str],
    subject: str,
    records: Iterable[Record | bytes],
    *,
    ack_policy: AckPolicy = AckPolicy.LEADER,
    window: int = 1024,
    timeout: float = 10.0,
    resend: ResendPolicy = NO_RESEND,
) -> list[Ack]:
    """Blocking convenience for code without an event loop: connect,
    :meth:`NatsPublisher.publish_many`, close.

    :raises PublishError: see :meth:`NatsPublisher.publish_many`.
    :raises UnavailableError: NATS could not be reached.
    """

    async def run() -> list[Ack]:
        async with await NatsPublisher.connect(servers) as pub:
            return await pub.publish_many(
                subject, records, ack_policy=ack_policy, window=window, timeout=timeout, resend=resend
            )

    return asyncio.run(run())
