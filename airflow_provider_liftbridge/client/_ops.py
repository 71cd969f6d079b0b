"""Every client operation, written once as a generator of I/O effects.

Each public function here takes the :class:`~._core.ClientCore` first and the caller's arguments
after it; :mod:`.sync_client` and :mod:`.async_client` expose them as methods whose signatures
and docstrings are these functions' own, and differ only in how effects are executed.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from ._core import (
    CURSORS_STREAM,
    IDEMPOTENT,
    ClientCore,
    ReadTimeout,
    RpcFailure,
    StartAt,
    StopAt,
    SubscriptionState,
    ack_from_pb,
    build_create_stream,
    build_publish,
    build_publish_to_subject,
    check_ack,
    is_end_of_stream,
    is_transient,
    map_async_error,
    map_rpc_error,
    metadata_from_pb,
    now_monotonic,
    partition_from_pb,
)
from ._effects import END, Cancel, CloseWrite, Emit, Op, OpenStream, Pump, Read, Sleep, Unary, Write
from .errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    PublishError,
    UnavailableError,
)
from .nats_direct import ResendPolicy
from .partitioners import PartitionerFunc
from .types import Ack, AckPolicy, Metadata, PartitionInfo, Record, StartPosition

__all__ = [
    "create_stream",
    "delete_stream",
    "fetch_cursor",
    "fetch_metadata",
    "fetch_partition_metadata",
    "pause_stream",
    "publish",
    "publish_many",
    "publish_to_subject",
    "set_cursor",
    "set_stream_readonly",
    "subscribe",
]

# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def _unary(
    core: ClientCore,
    method: str,
    request: object,
    *,
    timeout: float | None = None,
    preferred: str | None = None,
    stream: str | None = None,
    partition: int | None = None,
) -> Op[object]:
    """One unary call, retried on a lost connection across the known brokers, with backoff.

    Every call is retried on UNAVAILABLE and kin (see ``is_transient``): for idempotent calls that
    is harmless; CreateStream, DeleteStream and the publishes are retried too, which makes a
    publish at-least-once and lets a create/delete report "exists"/"not found" when the lost
    attempt went through (the error says so).
    """
    deadline = core.call_timeout(timeout)
    tried: list[str] = []
    attempt = 0
    while True:
        address = core.address_for_attempt(attempt, preferred)
        tried.append(address)
        try:
            response = yield Unary(address, method, request, deadline)
        except RpcFailure as failure:
            if is_transient(failure) and attempt < core.retry.max_retries:
                attempt += 1
                yield Sleep(core.backoff(attempt))
                continue
            error = map_rpc_error(
                method,
                failure,
                stream=stream,
                partition=partition,
                attempts=attempt + 1,
                tried=tried,
                timeout=deadline,
            )
            if attempt and method not in IDEMPOTENT and not is_transient(failure):
                # The lost attempt may have done the work (created, deleted, published) already.
                error.args = (f"{error} (after {attempt} retried attempt(s): the first may have succeeded)",)
            raise error from failure.__cause__
        core.mark_good(address)
        return response


def _refresh(core: ClientCore, streams: Sequence[str] | None) -> Op[Metadata]:
    response = yield from _unary(core, "FetchMetadata", api_pb2.FetchMetadataRequest(streams=streams or ()))
    metadata = metadata_from_pb(response)  # type: ignore[arg-type]
    core.cache.update(metadata, streams)
    return metadata


def _ensure_partition(core: ClientCore, stream: str, partition: int, *, refresh: bool) -> Op[None]:
    """Make sure the cache knows ``stream``/``partition``, fetching metadata when asked or needed.

    :raises NoSuchStreamError: the server does not know the stream.
    :raises NoSuchPartitionError: the stream has no such partition.
    """
    if refresh or core.partition_info(stream, partition) is None:
        yield from _refresh(core, [stream])
    info = core.cache.stream(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first or check the name.")
    if partition not in info.partitions:
        raise NoSuchPartitionError(
            f"stream {stream!r} has no partition {partition} (it has {len(info.partitions)}); "
            "use a partition number below the count."
        )


def _partition_count(core: ClientCore, stream: str) -> Op[int]:
    info = core.cache.stream(stream)
    if info is None:
        yield from _refresh(core, [stream])
        info = core.cache.stream(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first or check the name.")
    return max(1, len(info.partitions))


def _choose_partition(
    core: ClientCore,
    stream: str,
    key: bytes | None,
    value: bytes,
    partition: int | None,
    partitioner: PartitionerFunc | None,
) -> Op[int]:
    """Explicit partition wins; else the partitioner with the cached partition count; else 0."""
    if partition is not None:
        return partition
    if partitioner is None:
        return 0
    count = yield from _partition_count(core, stream)
    chosen = partitioner(stream, key, value, count)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < count:
        raise InvalidArgumentError(
            f"partitioner {partitioner!r} returned {chosen!r} for stream {stream!r} with {count} partitions; "
            "it must return an int in [0, partition_count)."
        )
    return chosen


_ROUTING_ERRORS = (NotLeaderError, NoSuchStreamError, NoSuchPartitionError, PartitionPausedError)


def _leader_unary(core: ClientCore, method: str, request: object, stream: str, partition: int) -> Op[object]:
    """A unary call that must reach the partition leader: on NOT_FOUND / FAILED_PRECONDITION the
    metadata is refreshed (with backoff) and the call re-routed, up to ``max_retries`` times."""
    refreshes = 0
    yield from _ensure_partition(core, stream, partition, refresh=False)
    while True:
        try:
            return (
                yield from _unary(
                    core, method, request, preferred=core.route(stream, partition), stream=stream, partition=partition
                )
            )
        except _ROUTING_ERRORS as exc:
            if refreshes >= core.retry.max_retries:
                raise
            refreshes += 1
            yield Sleep(core.backoff(refreshes))
            yield from _ensure_partition(core, stream, partition, refresh=True)
            part = core.partition_info(stream, partition)
            if isinstance(exc, NotLeaderError) and part is not None and part.paused:
                raise PartitionPausedError(
                    f"stream {stream!r} partition {partition} is paused; publish to it, or subscribe with "
                    "resume=True, to resume it."
                ) from exc


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


def create_stream(
    core: ClientCore,
    subject: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    group: str | None = None,
    retention_max_bytes: int | None = None,
    retention_max_messages: int | None = None,
    retention_max_age: timedelta | None = None,
    cleaner_interval: timedelta | None = None,
    segment_max_bytes: int | None = None,
    segment_max_age: timedelta | None = None,
    compact_enabled: bool | None = None,
    compact_max_goroutines: int | None = None,
    auto_pause_time: timedelta | None = None,
    auto_pause_disable_if_subscribers: bool | None = None,
    min_isr: int | None = None,
    optimistic_concurrency_control: bool | None = None,
    encryption: bool | None = None,
) -> Op[None]:
    """Create a stream named ``name`` attached to the NATS subject ``subject``.

    Options left at ``None`` take the server's defaults. Durations are ``timedelta`` and are sent
    in milliseconds. ``partitions=0`` means 1; ``replication_factor=-1`` means every broker.

    :raises StreamExistsError: a stream with this name exists.
    :raises InvalidArgumentError: an empty or invalid name or subject, a reserved name, a
        replication factor larger than the cluster.
    :raises UnavailableError: no broker could be reached.
    """
    request = build_create_stream(
        subject,
        name,
        partitions=partitions,
        replication_factor=replication_factor,
        group=group,
        retention_max_bytes=retention_max_bytes,
        retention_max_messages=retention_max_messages,
        retention_max_age=retention_max_age,
        cleaner_interval=cleaner_interval,
        segment_max_bytes=segment_max_bytes,
        segment_max_age=segment_max_age,
        compact_enabled=compact_enabled,
        compact_max_goroutines=compact_max_goroutines,
        auto_pause_time=auto_pause_time,
        auto_pause_disable_if_subscribers=auto_pause_disable_if_subscribers,
        min_isr=min_isr,
        optimistic_concurrency_control=optimistic_concurrency_control,
        encryption=encryption,
    )
    core.cache.forget(name)
    yield from _unary(core, "CreateStream", request, stream=name)


def delete_stream(core: ClientCore, name: str) -> Op[None]:
    """Delete the stream ``name`` and all its partitions.

    :raises NoSuchStreamError: there is no such stream.
    :raises InvalidArgumentError: the name is reserved.
    """
    if not name:
        raise InvalidArgumentError("name must be a non-empty stream name")
    core.cache.forget(name)
    yield from _unary(core, "DeleteStream", api_pb2.DeleteStreamRequest(name=name), stream=name)


def pause_stream(
    core: ClientCore, name: str, partitions: Sequence[int] | None = None, resume_all: bool = False
) -> Op[None]:
    """Pause the given partitions of ``name`` (all when ``partitions`` is ``None``).

    A paused partition resumes when a message is published to it (all partitions when
    ``resume_all``) or when a subscriber asks with ``resume=True``.

    :raises NoSuchStreamError: there is no such stream.
    :raises NoSuchPartitionError: a listed partition does not exist.
    """
    if not name:
        raise InvalidArgumentError("name must be a non-empty stream name")
    request = api_pb2.PauseStreamRequest(name=name, partitions=list(partitions or ()), resumeAll=resume_all)
    yield from _unary(core, "PauseStream", request, stream=name)


def set_stream_readonly(
    core: ClientCore, name: str, partitions: Sequence[int] | None = None, readonly: bool = True
) -> Op[None]:
    """Make the given partitions of ``name`` read-only (all when ``partitions`` is ``None``), or
    writable again with ``readonly=False``.

    :raises NoSuchStreamError: there is no such stream.
    :raises NoSuchPartitionError: a listed partition does not exist.
    """
    if not name:
        raise InvalidArgumentError("name must be a non-empty stream name")
    request = api_pb2.SetStreamReadonlyRequest(name=name, partitions=list(partitions or ()), readonly=readonly)
    yield from _unary(core, "SetStreamReadonly", request, stream=name)


# ---------------------------------------------------------------------------------------------
# Publishing
# ---------------------------------------------------------------------------------------------


def publish(
    core: ClientCore,
    stream: str,
    value: bytes,
    *,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    partition: int | None = None,
    partitioner: PartitionerFunc | None = None,
    ack_policy: AckPolicy | None = None,
    expected_offset: int | None = None,
    ack_inbox: str | None = None,
    correlation_id: str | None = None,
    timeout: float | None = None,
) -> Op[Ack | None]:
    """Publish one message and wait for its ack (``None`` with ``AckPolicy.NONE``).

    The partition is ``partition`` if given, else the ``partitioner``'s choice, else 0. A publish
    that meets UNAVAILABLE is retried on another broker: without ``expected_offset`` that makes it
    at-least-once (a retried message may be stored twice).

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist.
    :raises ReadonlyPartitionError: the partition is read-only.
    :raises IncorrectOffsetError: ``expected_offset`` was refused (optimistic concurrency control).
    :raises AckTimeoutError: no ack within ``timeout`` (or the client's default).
    :raises UnavailableError: no broker could be reached.
    """
    policy = core.resolve_ack_policy(ack_policy)
    chosen = yield from _choose_partition(core, stream, key, value, partition, partitioner)
    request = build_publish(
        stream,
        value,
        partition=chosen,
        key=key,
        headers=headers,
        ack_policy=policy,
        expected_offset=expected_offset,
        ack_inbox=ack_inbox,
        correlation_id=correlation_id or uuid.uuid4().hex,
    )
    try:
        response = yield from _unary(
            core,
            "Publish",
            request,
            timeout=timeout,
            preferred=core.route(stream, chosen),
            stream=stream,
            partition=chosen,
        )
    except (NoSuchStreamError, NoSuchPartitionError):
        core.cache.forget(stream)  # a stale partition count may have chosen the partition
        raise
    return _ack_of(response, policy)


def publish_to_subject(
    core: ClientCore,
    subject: str,
    value: bytes,
    *,
    key: bytes | None = None,
    headers: Mapping[str, bytes] | None = None,
    ack_policy: AckPolicy | None = None,
    ack_inbox: str | None = None,
    correlation_id: str | None = None,
    timeout: float | None = None,
) -> Op[Ack | None]:
    """Publish one message to a NATS subject; every stream attached to it stores it. Returns the
    first ack (``None`` with ``AckPolicy.NONE``). Retried on UNAVAILABLE: at-least-once.

    :raises AckTimeoutError: no stream acknowledged within the timeout (also: no stream listens on
        the subject).
    :raises UnavailableError: no broker could be reached.
    """
    policy = core.resolve_ack_policy(ack_policy)
    request = build_publish_to_subject(
        subject,
        value,
        key=key,
        headers=headers,
        ack_policy=policy,
        ack_inbox=ack_inbox,
        correlation_id=correlation_id or uuid.uuid4().hex,
    )
    response = yield from _unary(core, "PublishToSubject", request, timeout=timeout, stream=None)
    return _ack_of(response, policy)


def _ack_of(response: object, policy: AckPolicy) -> Ack | None:
    if policy == AckPolicy.NONE or not response.HasField("ack"):  # type: ignore[attr-defined]
        return None
    return check_ack(ack_from_pb(response.ack))  # type: ignore[attr-defined]


def publish_many(
    core: ClientCore,
    stream: str,
    records: Iterable[Record | bytes],
    *,
    partition: int | None = None,
    partitioner: PartitionerFunc | None = None,
    ack_policy: AckPolicy | None = None,
    window: int = 256,
    timeout: float | None = None,
    resend: ResendPolicy | None = None,
) -> Op[list[Ack]]:
    """Publish many records pipelined over one PublishAsync stream, at most ``window`` unacked
    at a time; return their acks in input order (an empty list with ``AckPolicy.NONE``, which
    gets no answers).

    A record's own ``partition`` wins over ``partition``, which wins over ``partitioner``. If
    the connection is lost (UNAVAILABLE) the unacknowledged records are sent again on another
    broker, up to ``max_retries`` times, while ``resend`` allows it (default: always):
    at-least-once. ``timeout`` bounds the wait for each ack.

    :raises PublishError: a record was refused or not acknowledged in time; it carries the acks
        received (``.acks``, ``.acked``), the first failing record's index (``.index``) and the
        typed error of each failed record (``.errors``); ``__cause__`` is the first error.
    :raises InvalidArgumentError: a bad record, window or duplicate correlation id, before
        anything is sent.
    """
    if window < 1:
        raise InvalidArgumentError(f"window must be at least 1, got {window}")
    policy = core.resolve_ack_policy(ack_policy)
    wait = core.call_timeout(timeout)
    batch = uuid.uuid4().hex[:12]
    requests: list[api_pb2.PublishRequest] = []
    ids: list[str] = []
    for i, item in enumerate(records):
        rec = as_record(i, item)
        chosen = yield from _choose_partition(
            core, stream, rec.key, rec.value, rec.partition if rec.partition is not None else partition, partitioner
        )
        cid = rec.correlation_id or f"{batch}-{i}"
        ids.append(cid)
        requests.append(
            build_publish(
                stream,
                rec.value,
                partition=chosen,
                key=rec.key,
                headers=rec.headers,
                ack_policy=policy,
                expected_offset=rec.expected_offset,
                ack_inbox=None,
                correlation_id=cid,
            )
        )
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError("correlation ids must be unique within one publish_many call")
    if policy == AckPolicy.NONE:
        yield from _send_unacknowledged(core, requests, wait)
        return []
    return (yield from _pipeline(core, stream, requests, ids, window, wait, resend))


def as_record(index: int, item: Record | bytes) -> Record:
    """``item`` as a :class:`Record` (bytes become its value).

    :raises InvalidArgumentError: ``item`` is neither.
    """
    rec = Record(item) if isinstance(item, bytes | bytearray | memoryview) else item
    if not isinstance(rec, Record):
        raise InvalidArgumentError(f"record {index} is a {type(item).__name__}; pass Record objects or bytes")
    return rec


def _send_unacknowledged(core: ClientCore, requests: list[api_pb2.PublishRequest], wait: float) -> Op[None]:
    # NONE gets no response: write everything, half-close, and let the server end the stream
    # (which tells us every request was read), but do not wait longer than the ack timeout.
    handle = yield OpenStream(core.address_for_attempt(0), "PublishAsync")
    try:
        for request in requests:
            yield Write(handle, request)
        yield CloseWrite(handle)
        while (yield Read(handle, wait)) is not END:
            pass
    except ReadTimeout:
        pass
    except RpcFailure as failure:
        raise map_rpc_error("PublishAsync", failure, stream=requests[0].stream if requests else None) from (
            failure.__cause__
        )
    yield Cancel(handle)


def _pipeline(
    core: ClientCore,
    stream: str,
    requests: list[api_pb2.PublishRequest],
    ids: list[str],
    window: int,
    wait: float,
    resend: ResendPolicy | None = None,
) -> Op[list[Ack]]:
    acks: list[Ack | None] = [None] * len(requests)
    errors: dict[int, LiftbridgeError] = {}
    index_of = {cid: i for i, cid in enumerate(ids)}
    pending: deque[int] = deque(range(len(requests)))
    inflight: set[int] = set()
    attempt = 0
    while pending or inflight:
        handle = yield OpenStream(core.address_for_attempt(attempt), "PublishAsync")
        try:
            while (pending and not errors) or inflight:
                while pending and not errors and len(inflight) < window:
                    i = pending.popleft()
                    inflight.add(i)
                    yield Write(handle, requests[i])
                response = yield Read(handle, wait)
                if response is END:
                    raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "the server closed the publish stream early")
                i = index_of.get(response.correlationId or response.ack.correlationId, -1)
                if i not in inflight:
                    continue  # not ours (or a repeat after a resend): ignore
                inflight.discard(i)
                req = requests[i]
                if response.HasField("asyncError"):
                    err = response.asyncError
                    errors[i] = map_async_error(err.code, err.message, stream=stream, partition=req.partition)
                    continue
                ack = ack_from_pb(response.ack)
                try:
                    acks[i] = check_ack(ack)
                except LiftbridgeError as exc:
                    errors[i] = exc
            # Done when the last ack is in: cancel rather than wait for the server to close the
            # stream (a real server takes seconds to).
            yield Cancel(handle)
            break
        except RpcFailure as failure:
            yield Cancel(handle)
            if is_transient(failure) and attempt < core.retry.max_retries:
                attempt += 1
                # Resend what was not acknowledged, in input order (at-least-once), unless the
                # caller's policy refuses (exactly-once publishing decides for itself).
                refused = sorted(i for i in inflight if resend is not None and not resend.should_resend(i, attempt + 1))
                for i in refused:
                    errors[i] = AckTimeoutError(
                        f"the connection was lost before record {i} was acknowledged and the resend policy "
                        "refused to send it again; it may or may not be stored."
                    )
                if refused:
                    why = f"record {refused[0]} failed: {errors[refused[0]]}"
                    raise _publish_error(acks, refused[0], errors, why) from errors[refused[0]]
                pending = deque(sorted(inflight | set(pending)))
                inflight.clear()
                yield Sleep(core.backoff(attempt))
                continue
            cause = map_rpc_error("PublishAsync", failure, stream=stream, attempts=attempt + 1)
            raise _publish_error(acks, None, errors, f"publishing to stream {stream!r} failed: {cause}") from cause
        except ReadTimeout:
            first = min(inflight)
            cause = AckTimeoutError(
                f"no ack for record {first} on stream {stream!r} within {wait:g} s; raise timeout= or check the "
                "broker. Unacknowledged records may or may not be stored."
            )
            errors[first] = cause
            raise _publish_error(acks, first, errors, str(cause)) from cause
    if errors:
        first = min(errors)
        raise _publish_error(acks, first, errors, f"record {first} was refused: {errors[first]}") from errors[first]
    return [a for a in acks if a is not None]


def _publish_error(
    acks: list[Ack | None], index: int | None, errors: dict[int, LiftbridgeError], why: str
) -> PublishError:
    done = sum(1 for a in acks if a is not None)
    return PublishError(f"{done} of {len(acks)} records acknowledged; {why}", acks=acks, index=index, errors=errors)


# ---------------------------------------------------------------------------------------------
# Subscribing
# ---------------------------------------------------------------------------------------------


def subscribe(
    core: ClientCore,
    stream: str,
    *,
    partition: int = 0,
    start_at: StartAt = StartPosition.EARLIEST,
    stop_at: StopAt = None,
    read_isr_replica: bool = False,
    resume: bool = False,
) -> Op[None]:
    """Read messages of one partition, from ``start_at`` until ``stop_at`` (or until the caller
    stops iterating). The server's empty handshake message is swallowed.

    ``start_at``: ``StartPosition.EARLIEST`` / ``LATEST`` / ``NEW_ONLY``, an ``int`` offset, an
    aware ``datetime`` (first message at or after it) or a ``timedelta`` (that long ago).
    ``stop_at``: ``None`` (never stop), an ``int`` offset (inclusive), ``StopPosition.LATEST``
    (the newest message when subscribing) or an aware ``datetime``.

    Reaching the stop position, or the end of a read-only partition, ends the iteration cleanly.
    After a transient failure (connection lost, broker restarted, leader changed) the client
    resubscribes from the last delivered offset + 1 — no gap, no duplicate — for up to
    ``resubscribe_wait`` seconds before giving up.

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist (or was
        deleted while subscribed).
    :raises PartitionPausedError: the partition is paused and ``resume`` is false.
    :raises UnavailableError: / :raises NotLeaderError: no broker served the partition within the
        wait.
    :raises InvalidArgumentError: bad positions (e.g. a stop offset before the start).
    """
    state = SubscriptionState(stream, partition, start_at, stop_at, read_isr_replica=read_isr_replica, resume=resume)
    give_up_at: float | None = None  # set at the first failure after a working subscription
    attempt = 0
    connected = False  # has any (re)subscription got its handshake?
    refresh = False
    while True:
        yield from _ensure_partition(core, stream, partition, refresh=refresh)
        address = core.route(stream, partition, read_isr_replica=read_isr_replica)
        address = address or core.address_for_attempt(attempt)
        handle = yield OpenStream(address, "Subscribe", state.request(), long_lived=True)
        try:
            pb = yield Read(handle)  # the handshake (an empty message): the subscription is on
            if pb is END:
                return
            connected, give_up_at, attempt = True, None, 0
            message = state.on_message(pb, first=True)
            if message is not None:
                yield Emit(message)
            if not state.done:
                yield Pump(handle, state)  # every further message, until the stop or the stream's end
            return
        except RpcFailure as failure:
            yield Cancel(handle)
            if is_end_of_stream(failure) or state.done:
                return
            mapped = map_rpc_error("Subscribe", failure, stream=stream, partition=partition, attempts=attempt + 1)
            retryable = is_transient(failure) or isinstance(mapped, _ROUTING_ERRORS)
            if not retryable:
                raise mapped from failure.__cause__
            now = now_monotonic()
            if connected and give_up_at is None:
                give_up_at = now + core.resubscribe_wait
            attempt += 1
            out_of_time = give_up_at is not None and now >= give_up_at
            out_of_tries = give_up_at is None and attempt > core.retry.max_retries
            if out_of_time or out_of_tries:
                if isinstance(mapped, UnavailableError | NotLeaderError):
                    why = f"within {core.resubscribe_wait:g} s" if out_of_time else f"after {attempt} attempts"
                    raise type(mapped)(
                        f"subscription to stream {stream!r} partition {partition} could not be re-established {why}; "
                        f"last offset delivered: {state.last_offset}. {mapped}"
                    ) from failure.__cause__
                raise mapped from failure.__cause__
            if isinstance(mapped, PartitionPausedError):
                raise mapped from failure.__cause__
            delay = core.backoff(attempt)
            if give_up_at is not None:
                delay = max(0.0, min(delay, give_up_at - now))
            yield Sleep(delay)
            try:
                yield from _ensure_partition(core, stream, partition, refresh=True)
            except (NoSuchStreamError, NoSuchPartitionError):
                raise
            except UnavailableError:
                pass  # no broker answered metadata yet: keep trying within the wait
            part = core.partition_info(stream, partition)
            if isinstance(mapped, NotLeaderError) and part is not None and part.paused and not resume:
                raise PartitionPausedError(
                    f"stream {stream!r} partition {partition} is paused; subscribe with resume=True or publish to it."
                ) from failure.__cause__
            refresh = False


# ---------------------------------------------------------------------------------------------
# Metadata and cursors
# ---------------------------------------------------------------------------------------------


def fetch_metadata(core: ClientCore, streams: Sequence[str] | None = None) -> Op[Metadata]:
    """Ask the cluster for its brokers and streams (all streams, or only ``streams``); always goes
    to the server and refreshes the client's cache. Streams that do not exist are absent from the
    result.

    :raises UnavailableError: no broker could be reached.
    """
    if isinstance(streams, str):
        streams = [streams]
    return (yield from _refresh(core, list(streams) if streams else None))


def fetch_partition_metadata(core: ClientCore, stream: str, partition: int = 0) -> Op[PartitionInfo]:
    """Ask the partition's leader for the partition's state (offsets, ISR, paused, read-only).

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the target does not exist.
    :raises PartitionPausedError: the partition is paused (the server does not answer for it).
    :raises UnavailableError: no broker could be reached.
    """
    request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    response = yield from _leader_unary(core, "FetchPartitionMetadata", request, stream, partition)
    return partition_from_pb(stream, response.metadata)  # type: ignore[attr-defined]


def set_cursor(core: ClientCore, cursor_id: str, stream: str, partition: int, offset: int) -> Op[None]:
    """Store ``offset`` as the position of cursor ``cursor_id`` on ``stream``/``partition``.

    Sent to the leader of the cursors-stream partition that owns the cursor (any broker when the
    cluster's metadata shows no cursors stream).

    :raises InvalidArgumentError: an empty cursor id or stream.
    :raises NotLeaderError: the owning partition's leader could not be found in time.
    :raises UnavailableError: no broker could be reached.
    """
    _cursor_args(cursor_id, stream)
    request = api_pb2.SetCursorRequest(cursorId=cursor_id, stream=stream, partition=partition, offset=offset)
    yield from _cursor_unary(core, "SetCursor", request, cursor_id, stream, partition)


def fetch_cursor(core: ClientCore, cursor_id: str, stream: str, partition: int) -> Op[int]:
    """The offset stored for cursor ``cursor_id`` on ``stream``/``partition``; -1 if never set.

    Routed like :func:`set_cursor`.

    :raises InvalidArgumentError: an empty cursor id or stream.
    :raises NotLeaderError: the owning partition's leader could not be found in time.
    :raises UnavailableError: no broker could be reached.
    """
    _cursor_args(cursor_id, stream)
    request = api_pb2.FetchCursorRequest(cursorId=cursor_id, stream=stream, partition=partition)
    response = yield from _cursor_unary(core, "FetchCursor", request, cursor_id, stream, partition)
    return int(response.offset)  # type: ignore[attr-defined]


def _cursor_unary(
    core: ClientCore, method: str, request: object, cursor_id: str, stream: str, partition: int
) -> Op[object]:
    """A cursor call, sent where the cursor lives: the leader of the cursors-stream partition
    that owns it. A broker that is not (or no longer) that leader refuses the call; the cursors
    stream's metadata is then refreshed and the call re-routed, up to ``max_retries`` times.
    Without a cursors stream in metadata (checked again every ``CURSORS_RECHECK`` seconds) any
    broker takes the call."""
    refreshes = 0
    while True:
        if core.cursors_unknown():
            yield from _refresh(core, [CURSORS_STREAM])
            core.cursors_absent_since = None if core.cache.stream(CURSORS_STREAM) else now_monotonic()
        owner = core.cursors_partition(cursor_id, stream, partition)
        preferred = None if owner is None else core.route(CURSORS_STREAM, owner)
        try:
            return (yield from _unary(core, method, request, preferred=preferred, stream=stream, partition=partition))
        except NotLeaderError:
            if owner is None or refreshes >= core.retry.max_retries:
                raise
            refreshes += 1
            yield Sleep(core.backoff(refreshes))
            core.cache.forget(CURSORS_STREAM)  # the leader moved: look it up again
            core.cursors_absent_since = None


def _cursor_args(cursor_id: str, stream: str) -> None:
    if not cursor_id:
        raise InvalidArgumentError("cursor_id must be a non-empty string naming the cursor")
    if not stream:
        raise InvalidArgumentError("stream must be a non-empty stream name")
