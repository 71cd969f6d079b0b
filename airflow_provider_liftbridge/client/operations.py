"""The client's operations, each written once as a generator of I/O effects (:mod:`.effects`):
the building blocks (a retried unary call, metadata refresh, partition choice, leader routing),
stream administration and metadata. Cursors live in :mod:`.cursors`, publishing in
:mod:`.publishing`, subscribing in :mod:`.subscription`. :mod:`.sync_client` and :mod:`.async_client` run them.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .conversion import metadata_from_pb, partition_from_pb
from .effects import Op, RpcFailure, Sleep, Unary
from .error_mapping import map_rpc_error
from .errors import (
    InvalidArgumentError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PartitionPausedError,
    StreamExistsError,
    UnavailableError,
)
from .partitioners import PartitionerFunc
from .presence import missing_confirmed
from .requests import build_create_stream
from .retry import IDEMPOTENT, is_transient
from .routing import ClientCore
from .stream_options import StreamOptions
from .types import Metadata, PartitionInfo

__all__ = [
    "ROUTING_ERRORS",
    "choose_partition",
    "create_stream",
    "delete_stream",
    "ensure_partition",
    "fetch_metadata",
    "fetch_partition_metadata",
    "leader_unary",
    "missing_confirmed_op",
    "partition_count",
    "pause_stream",
    "refresh_metadata",
    "settled_metadata",
    "set_stream_readonly",
    "unary",
]

# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def unary(
    core: ClientCore,
    method: str,
    request: object,
    *,
    timeout: float | None = None,
    preferred: str | None = None,
    stream: str | None = None,
    partition: int | None = None,
    until: float | None = None,
) -> Op[object]:
    """One unary call, retried on a lost connection across the known brokers, with backoff: the
    first ``max_retries`` retries always; once some broker has answered this client
    (``core.reached``), more while the backoff ends before ``until`` (on ``core.clock``; default:
    ``timeout`` from now), so a cluster whose brokers are all restarting is waited out for the
    call's time. A cluster never reached (likely a wrong address) fails after the count. Each
    attempt has ``timeout``.

    Every call is retried on UNAVAILABLE and kin (see ``is_transient``): for idempotent calls that
    is harmless; CreateStream, DeleteStream and the publishes are retried too, which makes a
    publish at-least-once and lets a create/delete report "exists"/"not found" when the lost
    attempt went through (the error says so).
    """
    deadline = core.call_timeout(timeout)
    until = core.clock() + deadline if until is None else until
    tried: list[str] = []
    attempt = 0
    while True:
        address = core.address_for_attempt(attempt, preferred)
        tried.append(address)
        try:
            response = yield Unary(address, method, request, deadline)
        except RpcFailure as failure:
            wait = core.retry_wait(attempt + 1, until if core.reached else None) if is_transient(failure) else None
            if wait is not None:
                attempt += 1
                yield Sleep(wait)
                continue
            if (
                _stalled(failure, method)
                and attempt < core.retry.max_retries
                and not set(core.known_addresses()) <= set(tried)
            ):
                # A broker that does not answer a read in time may be stopped (SIGSTOP) while the
                # others serve: ask one not asked yet in this call, without waiting.
                attempt += 1
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


def _stalled(failure: RpcFailure, method: str) -> bool:
    return failure.code == grpc.StatusCode.DEADLINE_EXCEEDED and method in IDEMPOTENT


def refresh_metadata(core: ClientCore, streams: Sequence[str] | None, until: float | None = None) -> Op[Metadata]:
    """Fetch the metadata of ``streams`` (``None``: all) into the cache; retried as :func:`unary`."""
    request = api_pb2.FetchMetadataRequest(streams=streams or ())
    response = yield from unary(core, "FetchMetadata", request, until=until)
    metadata = metadata_from_pb(response)  # type: ignore[arg-type]
    core.cache.update(metadata, streams)
    core.seen_streams.update(metadata.streams)
    return metadata


def settled_metadata(core: ClientCore, streams: Sequence[str], until: float | None = None) -> Op[Metadata]:
    """The metadata of ``streams`` (names given); one this client has just created that the
    broker asked does not list yet is asked for again, with backoff, until ``until`` (default: the
    client's timeout from now; see ``ClientCore.retry_wait``): a new stream reaches the brokers one
    by one (:mod:`.presence`)."""
    until = core.call_deadline(None) if until is None else until
    metadata = yield from refresh_metadata(core, streams, until)
    tries = 0
    while any(s not in metadata.streams and core.seen_streams.fresh(s) for s in streams):
        wait = core.retry_wait(tries + 1, until)
        if wait is None:
            break
        tries += 1
        yield Sleep(wait)
        metadata = yield from refresh_metadata(core, streams, until)
    return metadata


def missing_confirmed_op(core: ClientCore, stream: str, partition: int) -> Op[bool]:
    """After a "no such stream / partition" about ``stream``: whether to believe it (the rule of
    :mod:`.presence`). A stream never seen is believed missing at once; one just created (or
    reported existing) is never believed (the caller tries again within its budget); another seen
    one only when the metadata of all streams shows a cluster with leaders that does not list it."""
    if stream not in core.seen_streams:
        return True
    if core.seen_streams.fresh(stream):
        return False  # a new stream may not have reached the broker that answered yet
    try:
        return missing_confirmed((yield from refresh_metadata(core, None)), stream, partition)
    except UnavailableError:
        return False  # no broker answers yet: the cluster is not back


def ensure_partition(
    core: ClientCore, stream: str, partition: int, *, refresh: bool, until: float | None = None
) -> Op[None]:
    """Make sure the cache knows ``stream``/``partition``, fetching metadata when asked or needed
    (a fresh stream's metadata is waited for until ``until``: :func:`settled_metadata`).

    :raises NoSuchStreamError: the server does not know the stream.
    :raises NoSuchPartitionError: the stream has no such partition.
    """
    if refresh or core.partition_info(stream, partition) is None:
        yield from settled_metadata(core, [stream], until)
    info = core.cache.stream(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first or check the name.")
    if partition not in info.partitions:
        raise NoSuchPartitionError(
            f"stream {stream!r} has no partition {partition} (it has {len(info.partitions)}); "
            "use a partition number below the count."
        )


def partition_count(core: ClientCore, stream: str) -> Op[int]:
    info = core.cache.stream(stream)
    if info is None:
        yield from settled_metadata(core, [stream])
        info = core.cache.stream(stream)
    if info is None:
        raise NoSuchStreamError(f"stream {stream!r} does not exist; create it first or check the name.")
    return max(1, len(info.partitions))


def choose_partition(
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
    count = yield from partition_count(core, stream)
    chosen = partitioner(stream, key, value, count)
    if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < count:
        raise InvalidArgumentError(
            f"partitioner {partitioner!r} returned {chosen!r} for stream {stream!r} with {count} partitions; "
            "it must return an int in [0, partition_count)."
        )
    return chosen


ROUTING_ERRORS = (NotLeaderError, NoSuchStreamError, NoSuchPartitionError, PartitionPausedError)


#: How many times in a row the leader named by fresh metadata must refuse a call while that
#: metadata says "paused" before the partition counts as paused (see :func:`leader_unary`).
PAUSED_REFUSALS = 2


def leader_unary(core: ClientCore, method: str, request: object, stream: str, partition: int) -> Op[object]:
    """A unary call that must reach the partition leader. While the partition has no leader (NOT
    LEADER, or a restarting cluster's "no such stream / partition" about a stream this client has
    seen) the metadata is refreshed and the call re-routed, with backoff, within the client's
    timeout (``ClientCore.retry_wait``). A stream never seen, or confirmed missing, fails at once.

    A paused partition's leader refuses such calls with the words of a non-leader, and metadata
    keeps saying ``paused`` after a publish resumed the partition (Liftbridge v1.9). So the flag
    alone decides nothing: the partition counts as paused only when the broker that fresh metadata
    names leader refused :data:`PAUSED_REFUSALS` times in a row while that metadata said paused; a
    refusal by a broker no longer named leader is a leader change.

    :raises NoSuchStreamError: the stream does not exist (confirmed as in :mod:`.presence`).
    :raises NoSuchPartitionError: the stream has no such partition (confirmed likewise).
    :raises NotLeaderError: no broker took the call as leader within the timeout.
    :raises PartitionPausedError: the partition is paused (see above), or the server said so
        ``max_retries`` + 1 times.
    """
    until = core.call_deadline(None)
    retries = paused_refusals = 0
    error: Exception | None = None
    refused_by: str | None = None
    while True:
        try:
            yield from ensure_partition(core, stream, partition, refresh=error is not None, until=until)
        except (NoSuchStreamError, NoSuchPartitionError) as exc:
            error, paused_refusals = exc, 0
        else:
            part = core.partition_info(stream, partition)
            route = core.route(stream, partition)
            still_leader = refused_by is not None and route == refused_by
            if isinstance(error, NotLeaderError) and part is not None and part.paused and still_leader:
                paused_refusals += 1
            else:
                paused_refusals = 0
            if paused_refusals >= PAUSED_REFUSALS:
                raise PartitionPausedError(
                    f"stream {stream!r} partition {partition} is paused (its leader refuses {method} and the "
                    "metadata says paused); publish to it, or subscribe with resume=True, to resume it."
                ) from error
            try:
                refused_by = route
                return (
                    yield from unary(
                        core, method, request, preferred=route, stream=stream, partition=partition, until=until
                    )
                )
            except ROUTING_ERRORS as exc:
                error = exc
        if isinstance(error, (NoSuchStreamError, NoSuchPartitionError)) and (
            yield from missing_confirmed_op(core, stream, partition)
        ):
            raise error
        # Paused is a state of the partition, not an election: no longer than a count of retries.
        counted = isinstance(error, PartitionPausedError) and retries >= core.retry.max_retries
        wait = None if counted else core.retry_wait(retries + 1, until)
        if wait is None:
            raise error
        retries += 1
        yield Sleep(wait)


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------


def create_stream(core: ClientCore, subject: str, name: str, options: StreamOptions) -> Op[None]:
    """The operation of ``LiftbridgeClient.create_stream`` (documented there)."""
    request = build_create_stream(subject, name, options)
    core.cache.forget(name)
    try:
        yield from unary(core, "CreateStream", request, stream=name)
    except StreamExistsError:
        core.seen_streams.created(name)  # the server just said it exists
        raise
    # Known from now on: other brokers may say "no such stream" for a moment (presence.py).
    core.seen_streams.created(name)


def delete_stream(core: ClientCore, name: str) -> Op[None]:
    """The operation of ``LiftbridgeClient.delete_stream`` (documented there)."""
    if not name:
        raise InvalidArgumentError("name must be a non-empty stream name")
    core.cache.forget(name)
    core.seen_streams.forget(name)  # "no such stream" about it is believed from now on
    yield from unary(core, "DeleteStream", api_pb2.DeleteStreamRequest(name=name), stream=name)


def pause_stream(
    core: ClientCore, name: str, partitions: Sequence[int] | None = None, resume_all: bool = False
) -> Op[None]:
    """The operation of ``LiftbridgeClient.pause_stream`` (documented there)."""
    if not name:
        raise InvalidArgumentError("name must be a non-empty stream name")
    request = api_pb2.PauseStreamRequest(name=name, partitions=list(partitions or ()), resumeAll=resume_all)
    yield from unary(core, "PauseStream", request, stream=name)


def set_stream_readonly(
    core: ClientCore, name: str, partitions: Sequence[int] | None = None, readonly: bool = True
) -> Op[None]:
    """The operation of ``LiftbridgeClient.set_stream_readonly`` (documented there)."""
    if not name:
        raise InvalidArgumentError("name must be a non-empty stream name")
    request = api_pb2.SetStreamReadonlyRequest(name=name, partitions=list(partitions or ()), readonly=readonly)
    yield from unary(core, "SetStreamReadonly", request, stream=name)


# ---------------------------------------------------------------------------------------------
# Metadata
# ---------------------------------------------------------------------------------------------


def fetch_metadata(core: ClientCore, streams: Sequence[str] | None = None) -> Op[Metadata]:
    """The operation of ``LiftbridgeClient.fetch_metadata`` (documented there)."""
    if isinstance(streams, str):
        streams = [streams]
    if streams:
        return (yield from settled_metadata(core, list(streams)))
    return (yield from refresh_metadata(core, None))


def fetch_partition_metadata(core: ClientCore, stream: str, partition: int = 0) -> Op[PartitionInfo]:
    """The operation of ``LiftbridgeClient.fetch_partition_metadata`` (documented there)."""
    request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    response = yield from leader_unary(core, "FetchPartitionMetadata", request, stream, partition)
    return partition_from_pb(stream, response.metadata)  # type: ignore[attr-defined]
