"""``publish_many`` with its two paths: NATS-direct (bulk) and gRPC PublishAsync (fallback).

When the client knows NATS servers, ``publish_many`` publishes enveloped messages (the codec,
CRC-32C on) straight to each partition's NATS subject (``subject``, ``subject.N``, from the
stream's metadata) and matches the acks arriving on one ack inbox by correlation id (engine:
:func:`.nats_engine.send_over_nats`). Without NATS servers — or, with ``path="auto"``, when a
target partition is paused or read-only (NATS publishes to those are dropped without an ack, where
gRPC resumes a paused partition and names a read-only one) or NATS cannot be reached — it uses
gRPC PublishAsync (:func:`.grpc_engine.send_over_grpc`). Callers see the same results and errors either way.

The operation is written once, like the others in :mod:`..operations`: the NATS I/O is one
:class:`~..effects.NatsCall` effect that each client runs on its own event loop (the async client
on the caller's, the blocking client on a private loop thread, see :class:`..transport.sync.LoopThread`).
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from airflow_provider_liftbridge.nats_security import redact_urls

from ..compression import compress_record, compressor
from ..diagnostics import is_nats_refusal
from ..effects import NatsCall, Op, Sleep
from ..errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    PublishError,
    ReadonlyPartitionError,
    UnavailableError,
)
from ..operations import choose_partition, fetch_partition_metadata, missing_confirmed_op, refresh_metadata
from ..partitioners import PartitionerFunc
from ..routing import ClientCore
from ..types import Ack, AckPolicy, Record, StreamInfo
from . import grpc_engine
from .columns import RecordColumns, as_record
from .contract import accounted, accounted_failure, name_unacknowledged
from .correlation import CorrelationIds, correlation_ids
from .lost_acks import lost_since_acked
from .nats_engine import (
    BulkOutcome,
    outcome_acks,
    partition_subject,
    send_over_nats,
)
from .options import PUBLISH_PATHS, PublishOptions
from .resend import NO_RESEND
from .timeout_recovery import discard_nats, merge_retry, send_unstored_again, warn_resent

if TYPE_CHECKING:
    from ..write_stats import WriteStats

__all__ = [
    "Route",
    "discard_nats",
    "held",
    "open_route",
    "send_batch",
    "publish_many",
    "resolve_options",
    "resolve_path",
]

log = logging.getLogger("airflow_provider_liftbridge.client")
_OFFSET = operator.attrgetter("offset")

# Which clients have logged their publish path already (once per client and path).
_LOGGED: weakref.WeakKeyDictionary[ClientCore, set[str]] = weakref.WeakKeyDictionary()


def resolve_path(core: ClientCore, path: str) -> Literal["nats", "grpc"]:
    """The path ``publish_many(path=...)`` takes before looking at the stream: ``"nats"`` when
    asked, or for ``"auto"`` when the client knows NATS servers; else ``"grpc"``.

    :raises InvalidArgumentError: an unknown path, or ``"nats"`` without NATS servers.
    """
    if path not in PUBLISH_PATHS:
        raise InvalidArgumentError(f"path {path!r} is unknown; use one of {', '.join(PUBLISH_PATHS)}")
    if path == "nats" and not core.nats_servers:
        raise InvalidArgumentError("path='nats' needs NATS servers: create the client with nats_servers=[...]")
    if path == "grpc" or not core.nats_servers:
        return "grpc"
    return "nats"


def _log_path(core: ClientCore, stream: str, path: str, why: str = "") -> None:
    seen = _LOGGED.setdefault(core, set())
    if why:
        # The client was given NATS servers and they are not used: say so where it is seen.
        log.warning("publish_many to stream %r over %s, not NATS: %s", stream, path, why)
    elif path not in seen:
        seen.add(path)
        where = f"NATS-direct ({redact_urls(core.nats_servers)})" if path == "nats" else "gRPC PublishAsync"
        log.info("publish_many to stream %r over %s", stream, where)


def resolve_options(core: ClientCore, stream: str, options: PublishOptions) -> PublishOptions:
    """``options`` checked against the client (the path) and with its defaults filled in (ack
    policy, timeout) for a publisher of ``stream``.

    :raises InvalidArgumentError: an empty stream name, or ``"nats"`` without NATS servers.
    """
    if not isinstance(stream, str) or not stream:
        raise InvalidArgumentError(f"stream must be a non-empty stream name, got {stream!r}")
    resolve_path(core, options.path)
    policy = core.resolve_ack_policy(options.ack_policy)
    return options.resolved(policy, core.ack_wait(options.timeout, policy))


@dataclass(slots=True)
class Route:
    """Where a batch publisher sends: decided when its first batch goes out (:func:`open_route`),
    changed only by a fallback to gRPC (which is then kept for the publisher's later batches).

    :ivar path: ``"nats"`` or ``"grpc"``.
    :ivar info: the stream's metadata (NATS path; before it is opened: what the caller has just
        read, if anything).
    :ivar opened: whether the path is decided.
    :ivar fit: partitions already found fit for NATS publishes (neither paused nor read-only).
    :ivar why: why gRPC is used although the client knows NATS servers ("" if it is not).
    :ivar newest: per partition, the newest offset after this route's last batch as its acks show
        it (NATS path): the next batch's baseline for the "certainly not stored" check.
    """

    path: Literal["nats", "grpc"] = "grpc"
    info: StreamInfo | None = None
    opened: bool = False
    fit: set[int] = field(default_factory=set)
    why: str = ""
    newest: dict[int, int] = field(default_factory=dict)

    def fall_back(self, why: str) -> None:
        """Use gRPC from now on (this batch and the publisher's later ones), because ``why``."""
        self.path, self.why = "grpc", why


def open_route(core: ClientCore, stream: str, options: PublishOptions, route: Route) -> Op[Route]:
    """Decide ``route``'s path, once (NATS when asked, or for ``"auto"`` when the client knows NATS
    servers) and, for NATS, read the stream's metadata (unless the route holds it already).

    :raises NoSuchStreamError: the NATS path was chosen and the stream does not exist.
    """
    if route.opened:
        return route
    if resolve_path(core, options.path) == "nats":
        route.info = route.info if route.info is not None else (yield from _stream_info(core, stream))
        route.path = "nats"
    route.opened = True
    return route


def send_batch(
    core: ClientCore,
    stream: str,
    options: PublishOptions,
    route: Route,
    records: Iterable[Record | bytes],
    stats: WriteStats | None = None,
) -> Op[list[Ack]]:
    """Publish one batch on ``route`` (opened first if it is not); return the acks in input
    order. The batch is held in memory (callers with unbounded input send it batch by batch, see
    ``BatchPublisher.send_all``).
    With ``options.compression`` each value is compressed first (so the envelope's CRC and the
    max-payload check see what is sent); ``stats`` gets each acknowledged record's latencies.

    :raises PublishError: / :raises InvalidArgumentError: see ``LiftbridgeClient.publish_many``.
    """
    items = held(records)
    if not items:
        return []
    yield from open_route(core, stream, options, route)
    if options.compression is not None:
        items = _compressed(items, options.compression)
    sent_ns = None if stats is None else [0] * len(items)
    n, expects_acks, where = len(items), options.policy != AckPolicy.NONE, f"stream {stream!r}"
    try:
        engine_acks = yield from _send_batch(core, stream, options, route, items, sent_ns, stats)
    except PublishError as exc:
        checked = accounted_failure(exc, n, where, expects_acks=expects_acks)
        # Only a failing call pays for this look at the partitions (never the success path).
        checked = yield from lost_since_acked(core, stream, options, checked)
        if checked is exc:
            raise
        raise checked from exc
    # The publish contract: every record acknowledged (or, with NONE, none expected), or raise.
    acks = accounted(engine_acks, n, expects_acks=expects_acks, where=where)
    if stats is not None and sent_ns is not None:
        _count_acks(stats, items, acks, sent_ns)
    return acks


def held(records: Iterable[Record | bytes]) -> Sequence[Record | bytes]:
    """A batch in memory: a list or ``RecordColumns`` as it is, anything else read into a list."""
    return records if isinstance(records, (list, RecordColumns)) else list(records)


def _compressed(items: Sequence[Record | bytes], codec: str) -> list[Record | bytes]:
    squeeze = compressor(codec)  # type: ignore[arg-type]  # validated by PublishOptions
    assert squeeze is not None
    return [compress_record(as_record(i, item), squeeze, codec) for i, item in enumerate(items)]


def _count_acks(
    stats: WriteStats, items: Sequence[Record | bytes], acks: Sequence[Ack], sent_ns: Sequence[int]
) -> None:
    """Add a batch's acks to ``stats`` in one pass (acks are in input order, one per record when
    complete); sizes from the columns when the batch is held as columns."""
    if len(acks) != len(items):
        return  # ack policy NONE: nothing to measure
    if isinstance(items, RecordColumns):
        keys = items.keys
        size = sum(map(len, items.values)) + (0 if keys is None else sum(len(k) for k in keys if k))
    else:
        size = sum(len(item) if isinstance(item, bytes) else len(item.value) + len(item.key or b"") for item in items)
    stats.acked_many(sent_ns, acks, size)


@dataclass(frozen=True, slots=True)
class NatsBatch:
    """One batch on the NATS path, as planned: every record with its partition, subject and
    correlation id. Sending it changes nothing of it; what came back is the :class:`BulkOutcome`.

    :ivar items: the records (bytes, ``Record`` or ``RecordColumns``).
    :ivar parts: each record's partition.
    :ivar subjects: each record's NATS subject.
    :ivar ids: each record's correlation id.
    :ivar options: the options of the NATS path (its window filled in).
    :ivar before: what each target partition held before this batch, as far as the route knows
        (its metadata, then the acks of its last batch): the base against which an ack time-out
        is judged (:func:`.timeout_recovery.send_unstored_again`).
    :ivar sent_ns: first send times for the write statistics, or ``None``.
    """

    items: Sequence[Record | bytes]
    parts: Sequence[int]
    subjects: Sequence[str]
    ids: Sequence[str]
    options: PublishOptions
    before: dict[int, int]
    sent_ns: list[int] | None

    def send(self, indices: Sequence[int] | None = None) -> Op[BulkOutcome]:
        """Send the batch (``indices=None``) or the records at ``indices`` again, on the client's
        NATS connection (the transport hands it over); a re-send keeps each record's first send
        time. A connection that cannot be opened is the outcome's ``failure``, with nothing sent."""
        if indices is None:
            subjects, items, ids, sent_ns = self.subjects, self.items, self.ids, self.sent_ns
        else:
            subjects = [self.subjects[i] for i in indices]
            items = [self.items[i] for i in indices]
            ids, sent_ns = [self.ids[i] for i in indices], None
        options = self.options
        try:
            # The transport hands over its NATS connection and awaits the engine on its loop.
            done: BulkOutcome = yield NatsCall(
                lambda nc: send_over_nats(nc, subjects, items, ids, options, sent_ns=sent_ns),
                fresh=options.path == "nats",
            )
        except UnavailableError as exc:
            return BulkOutcome([None] * len(items), failure=exc)
        return done


def _send_batch(
    core: ClientCore,
    stream: str,
    options: PublishOptions,
    route: Route,
    items: Sequence[Record | bytes],
    sent_ns: list[int] | None,
    stats: WriteStats | None = None,
) -> Op[list[Ack]]:
    """One batch on ``route``: over gRPC, or planned and sent over NATS, falling back to gRPC
    (for this and the publisher's later batches) where ``"auto"`` allows it. Re-sends are
    logged at WARNING and counted in ``stats``."""
    items = _uniform(items)
    if route.path == "grpc":
        return (yield from _over_grpc(core, stream, options, items, sent_ns, stats=stats))
    planned = yield from _plan_nats(core, stream, options, route, items, sent_ns)
    if isinstance(planned, str):
        route.fall_back(planned)
        return (yield from _over_grpc(core, stream, options, items, sent_ns, planned, stats))
    _log_path(core, stream, "nats")
    outcome = yield from planned.send()
    # "auto" takes gRPC when NATS cannot be reached, not when NATS refused this client's
    # credentials or TLS: that is a configuration error, which a silent fallback would hide.
    failure = outcome.failure
    if failure is not None and outcome.sent == 0 and options.path == "auto" and not is_nats_refusal(failure):
        route.fall_back(f"NATS is unavailable ({failure})")
        return (yield from _over_grpc(core, stream, options, items, sent_ns, route.why, stats))
    if outcome.resent:
        warn_resent(stream, outcome.resent, "without an ack in time, as the resend policy allows")
    # With NO_RESEND the caller decides what to send again (exactly-once publishing reads the
    # partitions first): the time-outs stand, and so does the stop.
    checked = options.resend is not NO_RESEND and stream in core.seen_streams
    while checked and outcome.timed_out and outcome.failure is None:
        yield from send_unstored_again(core, stream, outcome, planned)
        # The engine stops sending at its first time-out; once every record sent so far is
        # accounted for, the rest of the batch goes out (nothing of it can be stored yet).
        rest = [] if outcome.timed_out or outcome.errors or outcome.failure is not None else outcome.unsent()
        if not rest:
            break
        log.info("publish_many to stream %r: sending the %d record(s) the recovered stop held back", stream, len(rest))
        merge_retry(outcome, rest, (yield from planned.send(rest)), resent=False)
    if stats is not None:
        stats.note_resent(outcome.resent)
    if outcome.timed_out:
        yield from _explain_timeouts(core, stream, outcome, planned.parts, options.wait)
    acks = outcome_acks(outcome, f"stream {stream!r} over NATS (ack timeout {options.wait:g} s)")
    _note_newest(route, planned.parts, acks)
    return acks


def _note_newest(route: Route, parts: Sequence[int], acks: Sequence[Ack]) -> None:
    """Every ack of a batch is in: what its partitions hold now, if no one else writes (the next
    batch's baseline)."""
    if acks and len(set(parts)) == 1:
        p = parts[0]
        route.newest[p] = max(route.newest.get(p, -1), max(map(_OFFSET, acks)))
        return
    newest = route.newest
    for p, offset in zip(parts, map(_OFFSET, acks), strict=False):
        if offset > newest.get(p, -1):
            newest[p] = offset


def _uniform(items: Sequence[Record | bytes]) -> Sequence[Record | bytes]:
    """``items`` with every element bytes or a ``Record``: columns and all-bytes batches as they
    are (the bulk cases, checked at C speed), anything else converted item by item."""
    if items.__class__ is RecordColumns or set(map(type, items)) <= {bytes, Record}:
        return items
    return [item if type(item) is bytes or type(item) is Record else as_record(i, item) for i, item in enumerate(items)]


def _over_grpc(
    core: ClientCore,
    stream: str,
    options: PublishOptions,
    items: Sequence[Record | bytes],
    sent_ns: list[int] | None,
    why: str = "",
    stats: WriteStats | None = None,
) -> Op[list[Ack]]:
    _log_path(core, stream, "grpc", why)
    return (yield from grpc_engine.send_over_grpc(core, stream, items, options, sent_ns=sent_ns, stats=stats))


def _plan_nats(
    core: ClientCore,
    stream: str,
    options: PublishOptions,
    route: Route,
    items: Sequence[Record | bytes],
    sent_ns: list[int] | None,
) -> Op[NatsBatch | str]:
    """The batch's partitions, subjects and correlation ids over NATS, or why it must go over
    gRPC instead (a target partition is paused or read-only, with path ``"auto"``).

    :raises PublishError: a target partition cannot take NATS publishes (path ``"nats"``), or
        does not exist; nothing was sent.
    """
    info = route.info
    assert info is not None
    # Columns name every record's partition and carry no correlation ids of their own.
    columns = items if items.__class__ is RecordColumns else None
    all_bytes = columns is None and set(map(type, items)) == {bytes}
    if all_bytes and options.partitioner is None:
        parts: Sequence[int] = [options.partition or 0] * len(items)
    elif columns is not None:
        parts = list(columns.partitions)
    else:
        parts = yield from _partitions(core, stream, items, options.partition, options.partitioner)
    targets = set(parts)
    blocked = yield from _blocked_partitions(core, info, sorted(targets - route.fit))
    if blocked:
        p, error = blocked
        if options.path == "auto" and not isinstance(error, NoSuchPartitionError):
            return f"partition {p} is {_state(error)}, which NATS publishes cannot handle"
        raise _not_sent(items, parts.index(p), error)
    route.fit |= targets  # checked: later batches to these partitions skip the check
    ids = CorrelationIds(len(items), {}) if all_bytes or columns is not None else correlation_ids(items)
    if len(targets) == 1:
        subjects = [partition_subject(info.subject, parts[0])] * len(parts)
    else:
        subject_of = {p: partition_subject(info.subject, p) for p in targets}
        subjects = [subject_of[p] for p in parts]
    before = {p: route.newest.get(p, info.partitions[p].newest_offset) for p in targets}
    # By default nothing is re-sent blindly on a time-out: only what timeout_recovery.py proves unstored.
    resend = NO_RESEND if options.resend is None else options.resend
    nats_options = options.replace(window=options.window_for("nats"), resend=resend)
    return NatsBatch(items, parts, subjects, ids, nats_options, before, sent_ns)


def publish_many(
    core: ClientCore, stream: str, records: Iterable[Record | bytes], options: PublishOptions
) -> Op[list[Ack]]:
    """The operation of ``LiftbridgeClient.publish_many`` (documented there): a batch publisher
    opened for one batch."""
    options = resolve_options(core, stream, options)
    items = records if isinstance(records, list) else list(records)
    if not items:
        return []
    return (yield from send_batch(core, stream, options, Route(), items))


def _partitions(
    core: ClientCore,
    stream: str,
    items: Sequence[Record | bytes],
    partition: int | None,
    partitioner: PartitionerFunc | None,
) -> Op[list[int]]:
    """Each record's partition, as the gRPC path chooses it: the record's own, else ``partition``,
    else the ``partitioner``'s choice, else 0."""
    if partitioner is None:
        default = partition or 0
        return [rec.partition if isinstance(rec, Record) and rec.partition is not None else default for rec in items]
    parts: list[int] = []
    for rec in items:
        if isinstance(rec, Record):
            key, value, own = rec.key, rec.value, rec.partition
        else:
            key, value, own = None, rec, None
        chosen = yield from choose_partition(
            core, stream, key, value, own if own is not None else partition, partitioner
        )
        parts.append(chosen)
    return parts


def _stream_info(core: ClientCore, stream: str) -> Op[StreamInfo]:
    """Fresh metadata of ``stream`` (its subject, partitions and their flags).

    :raises NoSuchStreamError: the stream does not exist: never seen by this client, or confirmed
        missing (a cluster right after a restart lists no streams for a moment, see :mod:`..presence`).
    """
    for attempt in range(1, core.retry.max_retries + 2):
        yield from refresh_metadata(core, [stream])
        info = core.cache.stream(stream)
        if info is not None:
            return info
        if attempt > core.retry.max_retries or (yield from missing_confirmed_op(core, stream, 0)):
            break
        yield Sleep(core.backoff(attempt))
    raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first or check the name.")


def _blocked_partitions(core: ClientCore, info: StreamInfo, parts: Sequence[int]) -> Op[tuple[int, Exception] | None]:
    """The first target partition NATS cannot publish to, with the error a publish would meet."""
    for p in parts:
        part = info.partitions.get(p)
        if part is None:
            return p, NoSuchPartitionError(
                f"stream {info.name!r} has no partition {p} (it has {len(info.partitions)}); "
                "use a partition number below the count."
            )
        if part.readonly:
            return p, ReadonlyPartitionError(
                f"stream {info.name!r} partition {p} is read-only; it accepts no more messages."
            )
        if part.paused and (yield from _really_paused(core, info.name, p)):
            return p, PartitionPausedError(
                f"stream {info.name!r} partition {p} is paused, and NATS publishes to a paused partition are "
                "dropped; publish over gRPC (path='grpc' or 'auto'), which resumes it."
            )
    return None


def _really_paused(core: ClientCore, stream: str, partition: int) -> Op[bool]:
    """Whether a partition the metadata calls paused still is: the flag stays set after a publish
    resumed it (Liftbridge v1.9), while the leader refuses FetchPartitionMetadata only while it
    really is paused (``leader_unary`` tells the two apart). A partition without a leader to ask
    counts as paused: NATS publishes to it would be lost just the same."""
    try:
        yield from fetch_partition_metadata(core, stream, partition)
    except (NotLeaderError, PartitionPausedError):
        return True
    return False


def _state(error: Exception) -> str:
    return "paused" if isinstance(error, PartitionPausedError) else "read-only"


def _not_sent(items: Sequence[Record | bytes], index: int, error: Exception) -> PublishError:
    """Record ``index`` cannot be published (``error``), found before anything was sent: it fails
    with ``error``, every other record with :class:`NotSentError`."""
    acks: list[Ack | None] = [None] * len(items)
    errors: dict[int, LiftbridgeError] = {index: error} if isinstance(error, LiftbridgeError) else {}
    name_unacknowledged(acks, errors, unsent=range(len(items)), in_doubt=None, stopped_by=f"record {index}'s refusal")
    exc = PublishError(
        f"0 of {len(items)} records acknowledged; record {index} cannot be published: {error}",
        acks=acks,
        index=index,
        errors=errors,
    )
    exc.__cause__ = error
    return exc


def _explain_timeouts(
    core: ClientCore, stream: str, outcome: BulkOutcome, parts: Sequence[int], wait: float
) -> Op[None]:
    """Give each timed-out record the most precise error: NATS drops a message to a deleted
    stream or a paused or read-only partition without a word, so look at the metadata."""
    try:
        yield from refresh_metadata(core, [stream])
    except LiftbridgeError:
        pass  # keep the timeout errors
    info = core.cache.stream(stream)
    paused: dict[int, bool] = {}  # asked once per partition: the flag alone may be stale
    for i in outcome.timed_out:
        p = parts[i]
        part = info.partitions.get(p) if info is not None else None
        if part is not None and part.paused and p not in paused:
            paused[p] = yield from _really_paused(core, stream, p)
        error: LiftbridgeError
        if info is None:
            error = NoSuchStreamError(f"stream {stream!r} no longer exists (deleted while publishing)")
        elif part is None:
            error = NoSuchPartitionError(f"stream {stream!r} has no partition {p} any more")
        elif part.readonly:
            error = ReadonlyPartitionError(
                f"stream {stream!r} partition {p} became read-only while publishing; record {i} was dropped"
            )
        elif paused.get(p, False):
            error = PartitionPausedError(
                f"stream {stream!r} partition {p} was paused while publishing and record {i} was dropped; "
                "publish it again over gRPC, which resumes the partition"
            )
        else:
            error = AckTimeoutError(
                f"no ack for record {i} on stream {stream!r} partition {p} within {wait:g} s, after every re-send "
                "the policy allowed; the broker may be down or overloaded. It may or may not be stored."
            )
        outcome.errors[i] = error
