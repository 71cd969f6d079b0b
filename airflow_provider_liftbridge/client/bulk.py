"""``publish_many`` with its two paths: NATS-direct (bulk) and gRPC PublishAsync (fallback).

When the client knows NATS servers, ``publish_many`` publishes enveloped messages (the codec,
CRC-32C on) straight to each partition's NATS subject (``subject``, ``subject.N``, from the
stream's metadata) and matches the acks arriving on one ack inbox by correlation id (engine:
:func:`.nats_direct.publish_enveloped`). Without NATS servers — or, with ``path="auto"``, when a
target partition is paused or read-only (NATS publishes to those are dropped without an ack, where
gRPC resumes a paused partition and names a read-only one) or NATS cannot be reached — it uses
gRPC PublishAsync (:func:`._ops.publish_many`). Callers see the same results and errors either way.

The operation is written once, like the others in :mod:`._ops`: the NATS I/O is one
:class:`~._effects.NatsCall` effect that each client runs on its own event loop (the async client
on the caller's, the blocking client on a private loop thread, see :class:`LoopThread`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import weakref
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, Literal, TypeVar

from nats.aio.client import Client as NatsClient

from airflow_provider_liftbridge._proto import api_pb2

from . import _ops
from ._core import ClientCore
from ._effects import NatsCall, Op
from .errors import (
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
from .nats_direct import (
    BulkOutcome,
    CorrelationIds,
    ResendPolicy,
    connect_nats,
    correlation_ids,
    outcome_acks,
    partition_subject,
    publish_enveloped,
)
from .partitioners import PartitionerFunc
from .types import Ack, AckPolicy, Record, StreamInfo

__all__ = [
    "GRPC_WINDOW",
    "NATS_WINDOW",
    "PUBLISH_PATHS",
    "LoopThread",
    "NatsLink",
    "PublishPath",
    "publish_many",
    "resolve_path",
]

log = logging.getLogger("airflow_provider_liftbridge.client")

_T = TypeVar("_T")

#: Default windows (records unacknowledged at a time). Over NATS the client, nats-server and the
#: broker each work on batches, and 256 or 1024 records in flight leave them waiting on each
#: other; 4096 keeps them busy (docs/bulk-publishing.md has the figures). Over gRPC the window
#: is bounded by the server's per-message cost, and 256 is plenty.
GRPC_WINDOW = 256
NATS_WINDOW = 4096

PublishPath = Literal["auto", "nats", "grpc"]
#: Values of ``publish_many(path=...)``.
PUBLISH_PATHS: tuple[str, ...] = ("auto", "nats", "grpc")

# Which clients have logged their publish path already (once per client and path).
_LOGGED: weakref.WeakKeyDictionary[ClientCore, set[str]] = weakref.WeakKeyDictionary()


class NatsLink:
    """One client's NATS connection, opened on first use and reopened if it was lost.

    A nats-py connection belongs to the event loop it was made on; used from another loop, the
    link opens a new connection there (the old one is dropped with its loop).

    :param servers: NATS URLs.
    :param connect_timeout: seconds to wait for a connection.
    """

    #: After a failed connect, fail at once for this many seconds (``auto`` then falls back to
    #: gRPC without waiting for NATS on every call).
    retry_after = 30.0

    def __init__(self, servers: Sequence[str], connect_timeout: float) -> None:
        self.servers = tuple(servers)
        self.connect_timeout = connect_timeout
        self._nc: NatsClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._failed: tuple[float, UnavailableError] | None = None

    async def get(self) -> NatsClient:
        """The connection, opened if needed.

        :raises UnavailableError: NATS cannot be reached (now, or less than :attr:`retry_after`
            seconds ago).
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._nc, self._loop, self._lock = None, loop, asyncio.Lock()
        assert self._lock is not None
        async with self._lock:
            if self._nc is None or self._nc.is_closed:
                if self._failed is not None and time.monotonic() - self._failed[0] < self.retry_after:
                    raise self._failed[1]
                try:
                    self._nc = await connect_nats(self.servers, connect_timeout=self.connect_timeout)
                except UnavailableError as exc:
                    self._failed = (time.monotonic(), exc)
                    raise
                self._failed = None
            return self._nc

    async def close(self) -> None:
        """Close the connection if it is open on the running loop; idempotent."""
        nc, self._nc = self._nc, None
        if nc is None or nc.is_closed:
            return
        if self._loop is asyncio.get_running_loop():
            try:
                await nc.close()
            except Exception:  # closing anyway
                log.debug("error while closing the NATS connection", exc_info=True)


class LoopThread:
    """A private event loop on a daemon thread: how the blocking client runs its NATS I/O.

    Started on first use; :meth:`run` may be called from any thread (calls run concurrently on
    the one loop, each with its own ack inbox).
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="liftbridge-nats-loop", daemon=True)
                self._thread.start()
            return self._loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure()).result()

    def stop(self, last: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run ``last`` (e.g. closing a connection), stop the loop and join the thread; idempotent."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            if last is not None:
                last.close()
            return
        try:
            if last is not None:
                asyncio.run_coroutine_threadsafe(last, loop).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()


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
        log.info("publish_many to stream %r over %s: %s", stream, path, why)
    elif path not in seen:
        seen.add(path)
        where = f"NATS-direct ({', '.join(core.nats_servers)})" if path == "nats" else "gRPC PublishAsync"
        log.info("publish_many to stream %r over %s", stream, where)


def publish_many(
    core: ClientCore,
    stream: str,
    records: Iterable[Record | bytes],
    *,
    partition: int | None = None,
    partitioner: PartitionerFunc | None = None,
    ack_policy: AckPolicy | None = None,
    window: int | None = None,
    timeout: float | None = None,
    path: PublishPath = "auto",
    resend: ResendPolicy | None = None,
) -> Op[list[Ack]]:
    """Publish many records and return their acks in input order (an empty list with
    ``AckPolicy.NONE``), at most ``window`` unacknowledged at a time (default: 256 over gRPC,
    4096 over NATS, where a smaller window leaves the pipeline waiting on round trips).

    ``path``: ``"nats"`` publishes enveloped messages straight to the partitions' NATS subjects
    with acks on an ack inbox (the bulk path, an order of magnitude faster from Python; needs
    ``nats_servers``); ``"grpc"`` pipelines them over PublishAsync; ``"auto"`` (default) takes
    NATS when the client knows NATS servers, except when a target partition is paused or
    read-only or NATS cannot be reached, where it falls back to gRPC. The choice is logged
    (logger ``airflow_provider_liftbridge.client``, once per client, and on every fallback).

    A record's own ``partition`` wins over ``partition``, which wins over ``partitioner``.
    ``timeout`` bounds the wait for each ack. A record not acknowledged in time (NATS), or in
    flight when the connection was lost (gRPC), is sent again while ``resend`` allows (default:
    up to two re-sends, see :class:`~.nats_direct.ResendUnacked`): publishing is at-least-once
    and a re-sent record may land after later ones. Pass :data:`~.nats_direct.NO_RESEND` to fail
    instead of re-sending.

    :raises PublishError: a record was refused or not acknowledged in time; it carries the acks
        received (``.acks``, ``.acked``), the first failing record's index (``.index``) and the
        typed error of each failed record (``.errors``: ``IncorrectOffsetError``,
        ``MessageTooLargeError``, ``ReadonlyPartitionError``, ``AckTimeoutError``, ...);
        ``__cause__`` is the first error.
    :raises NoSuchStreamError: the stream does not exist (NATS path; gRPC reports it per record).
    :raises InvalidArgumentError: a bad record, window, path or duplicate correlation id, before
        anything is sent.
    """
    chosen = resolve_path(core, path)
    if window is not None and window < 1:
        raise InvalidArgumentError(f"window must be at least 1, got {window}")
    # Plain bytes stay bytes: building a Record per value would cost more than publishing it.
    items: list[Record | bytes] = list(records)
    if not items:
        return []
    # All bytes (the bulk case) is checked at C speed; anything else item by item.
    all_bytes = set(map(type, items)) == {bytes}
    if not all_bytes:
        items = [item if type(item) is bytes else _ops.as_record(i, item) for i, item in enumerate(items)]

    def grpc(why: str = "") -> Op[list[Ack]]:
        _log_path(core, stream, "grpc", why)
        return _ops.publish_many(
            core,
            stream,
            items,
            partition=partition,
            partitioner=partitioner,
            ack_policy=ack_policy,
            window=GRPC_WINDOW if window is None else window,
            timeout=timeout,
            resend=resend,
        )

    if chosen == "grpc":
        return (yield from grpc())
    policy = core.resolve_ack_policy(ack_policy)
    wait = core.call_timeout(timeout)
    info = yield from _stream_info(core, stream)
    if all_bytes and partitioner is None:
        parts = [partition or 0] * len(items)
    else:
        parts = yield from _partitions(core, stream, items, partition, partitioner)
    targets = set(parts)
    blocked = yield from _blocked_partitions(core, info, sorted(targets))
    if blocked:
        p, error = blocked
        if path == "auto" and not isinstance(error, NoSuchPartitionError):
            return (yield from grpc(f"partition {p} is {_state(error)}, which NATS publishes cannot handle"))
        first = parts.index(p)
        raise _not_sent(items, first, error)
    ids = CorrelationIds(len(items), {}) if all_bytes else correlation_ids(items)
    if len(targets) == 1:
        subjects = [partition_subject(info.subject, parts[0])] * len(parts)
    else:
        subject_of = {p: partition_subject(info.subject, p) for p in targets}
        subjects = [subject_of[p] for p in parts]
    _log_path(core, stream, "nats")
    run = functools.partial(
        _run_nats,
        subjects,
        items,
        ids,
        ack_policy=policy,
        window=NATS_WINDOW if window is None else window,
        ack_timeout=wait,
        resend=resend,
    )
    outcome: BulkOutcome = yield NatsCall(run)
    if outcome.failure is not None and outcome.sent == 0 and path == "auto":
        return (yield from grpc(f"NATS is unavailable ({outcome.failure})"))
    if outcome.timed_out:
        yield from _explain_timeouts(core, stream, outcome, parts, wait)
    return outcome_acks(outcome, f"stream {stream!r} over NATS (ack timeout {wait:g} s)")


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
        chosen = yield from _ops._choose_partition(
            core, stream, key, value, own if own is not None else partition, partitioner
        )
        parts.append(chosen)
    return parts


async def _run_nats(
    subjects: Sequence[str],
    records: Sequence[Record | bytes],
    ids: Sequence[str],
    link: NatsLink,
    *,
    ack_policy: AckPolicy,
    window: int,
    ack_timeout: float,
    resend: ResendPolicy | None,
) -> BulkOutcome:
    try:
        nc = await link.get()
    except UnavailableError as exc:
        return BulkOutcome([None] * len(records), failure=exc)
    kwargs: dict[str, Any] = {} if resend is None else {"resend": resend}
    return await publish_enveloped(
        nc, subjects, records, ids, ack_policy=ack_policy, window=window, ack_timeout=ack_timeout, **kwargs
    )


def _stream_info(core: ClientCore, stream: str) -> Op[StreamInfo]:
    """Fresh metadata of ``stream`` (its subject, partitions and their flags)."""
    yield from _ops._refresh(core, [stream])
    info = core.cache.stream(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first or check the name.")
    return info


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
    # FetchMetadata keeps saying "paused" after a publish resumed the partition; the leader
    # refuses FetchPartitionMetadata only while the partition really is paused.
    request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    try:
        yield from _ops._unary(
            core,
            "FetchPartitionMetadata",
            request,
            preferred=core.route(stream, partition),
            stream=stream,
            partition=partition,
        )
    except (NotLeaderError, PartitionPausedError):
        return True
    return False


def _state(error: Exception) -> str:
    return "paused" if isinstance(error, PartitionPausedError) else "read-only"


def _not_sent(items: Sequence[Record | bytes], index: int, error: Exception) -> PublishError:
    errors: dict[int, LiftbridgeError] = {index: error} if isinstance(error, LiftbridgeError) else {}
    exc = PublishError(
        f"0 of {len(items)} records acknowledged; record {index} cannot be published: {error}",
        acks=[None] * len(items),
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
        yield from _ops._refresh(core, [stream])
    except LiftbridgeError:
        pass  # keep the timeout errors
    info = core.cache.stream(stream)
    for i in outcome.timed_out:
        p = parts[i]
        part = info.partitions.get(p) if info is not None else None
        error: LiftbridgeError
        if info is None:
            error = NoSuchStreamError(f"stream {stream!r} no longer exists (deleted while publishing)")
        elif part is None:
            error = NoSuchPartitionError(f"stream {stream!r} has no partition {p} any more")
        elif part.readonly:
            error = ReadonlyPartitionError(
                f"stream {stream!r} partition {p} became read-only while publishing; record {i} was dropped"
            )
        elif part.paused:
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
