"""The cursor operations (``SetCursor``, ``FetchCursor``), written once as generators of I/O
effects like :mod:`.operations`, whose building blocks they use.

A cursor lives in one partition of Liftbridge's internal cursors stream, so a cursor call goes to
that partition's leader, re-routed while leaders move, and a FetchCursor first waits for that
leader to commit what it holds (so it never answers an older position); a cluster that says it
has no cursors stream is believed only once confirmed. See docs/reading-positions.md.
"""

from __future__ import annotations

import time

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from .conversion import partition_from_pb
from .effects import Op, RpcFailure, Sleep, Unary
from .errors import CursorsDisabledError, InvalidArgumentError, NotLeaderError, UnavailableError, UnsettledCursorError
from .operations import refresh_metadata, unary
from .routing import CURSORS_STREAM, ClientCore

__all__ = ["CURSORS_SETTLE_WAIT", "fetch_cursor", "set_cursor"]


def set_cursor(core: ClientCore, cursor_id: str, stream: str, partition: int, offset: int) -> Op[None]:
    """The operation of ``LiftbridgeClient.set_cursor`` (documented there)."""
    _cursor_args(cursor_id, stream)
    request = api_pb2.SetCursorRequest(cursorId=cursor_id, stream=stream, partition=partition, offset=offset)
    yield from _cursor_unary(core, "SetCursor", request, cursor_id, stream, partition)


def fetch_cursor(core: ClientCore, cursor_id: str, stream: str, partition: int) -> Op[int]:
    """The operation of ``LiftbridgeClient.fetch_cursor`` (documented there)."""
    _cursor_args(cursor_id, stream)
    request = api_pb2.FetchCursorRequest(cursorId=cursor_id, stream=stream, partition=partition)
    response = yield from _cursor_unary(core, "FetchCursor", request, cursor_id, stream, partition, settle=True)
    return int(response.offset)  # type: ignore[attr-defined]


#: How long a FetchCursor waits for the owning cursors partition's leader to commit what it holds
#: (a leader restarted from its high-watermark checkpoint took about 6 s on Liftbridge v1.9).
CURSORS_SETTLE_WAIT = 30.0


def _cursors_settled(core: ClientCore, owner: int, leader: str | None) -> Op[str]:
    """Return the address of the leader of cursors partition ``owner`` once it has committed every
    message it held when first asked (high watermark >= that newest offset).

    Liftbridge answers a FetchCursor it has no cached answer for by reading the partition backwards
    from the leader's high watermark, and caches what it found until the next SetCursor of that
    cursor or the next leadership change (``server/cursors.go``). A leader restarted from its
    high-watermark checkpoint (written every 5 s), or newly elected (it knows the high watermark a
    fetch late), reports a high watermark below messages that were committed: asked then, it
    answers an older position, or -1, and keeps answering it (docs/reading-positions.md). Asking
    only once what the leader held is committed closes that window for this client's reads.

    Only the leader is asked: ``leader``, or when metadata names none this client can reach (a
    leader just restarted can be missing from what the others list), the broker that answers for
    the partition (only its leader does). One that cannot be reached, or that no longer leads,
    raises :class:`NotLeaderError` (the caller looks the leader up again and retries). A paused
    partition's leader refuses partition metadata in a non-leader's words: when the metadata says
    paused, the read goes ahead (a paused log was closed cleanly, its high watermark is current); a
    broker that really no longer leads refuses the FetchCursor too, and the caller re-routes it.

    :raises NotLeaderError: no leader found, or it is unreachable or refuses as not the leader.
    :raises UnsettledCursorError: not committed within :data:`CURSORS_SETTLE_WAIT` s.
    """
    request = api_pb2.FetchPartitionMetadataRequest(stream=CURSORS_STREAM, partition=owner)
    if leader is None:
        leader = yield from _answering_leader(core, request)
    give_up = core.clock() + CURSORS_SETTLE_WAIT
    held = None
    pause = 0.05
    while True:
        try:
            response = yield Unary(leader, "FetchPartitionMetadata", request, core.call_timeout(None))
        except RpcFailure as failure:
            listed = core.partition_info(CURSORS_STREAM, owner)
            if failure.code == grpc.StatusCode.FAILED_PRECONDITION and listed is not None and listed.paused:
                return leader
            raise NotLeaderError(
                f"the leader of {CURSORS_STREAM} partition {owner} ({leader}) did not answer for it: {failure}"
            ) from failure
        info = partition_from_pb(CURSORS_STREAM, response.metadata)
        held = info.newest_offset if held is None else held
        if info.high_watermark >= held:
            return leader
        if core.clock() + pause > give_up:
            raise UnsettledCursorError(
                f"the leader of {CURSORS_STREAM} partition {owner} ({info.leader}) has committed up to offset "
                f"{info.high_watermark} of the {held} it holds, {CURSORS_SETTLE_WAIT:g} s on: a cursor read now "
                "could return an older position than the last one stored (Liftbridge reads cursors up to the "
                "committed offset and caches the answer), so none was read; try again once the cluster has "
                "settled (a broker restarting, or an in-sync replica missing)"
            )
        yield Sleep(pause)
        pause = min(pause * 2, 1.0)


def _answering_leader(core: ClientCore, request: api_pb2.FetchPartitionMetadataRequest) -> Op[str]:
    """The known broker that answers ``request`` (partition metadata: only a partition's leader
    does), each asked once.

    :raises NotLeaderError: none did.
    """
    for address in core.known_addresses():
        try:
            yield Unary(address, "FetchPartitionMetadata", request, core.call_timeout(None))
        except RpcFailure:
            continue
        return address
    raise NotLeaderError(f"no broker answers for {CURSORS_STREAM} partition {request.partition} yet")


def _cursor_unary(
    core: ClientCore,
    method: str,
    request: object,
    cursor_id: str,
    stream: str,
    partition: int,
    *,
    settle: bool = False,
) -> Op[object]:
    """A cursor call, sent where the cursor lives: the leader of the cursors-stream partition
    that owns it. A broker that is not (or no longer) that leader refuses the call; the cursors
    stream's metadata is then refreshed and the call re-routed, with backoff, within the client's
    timeout (``ClientCore.retry_wait``): a cluster electing leaders after a restart is waited out.
    Without a cursors stream in metadata (checked again every ``CURSORS_RECHECK`` seconds) the
    call goes to any broker; one that answers "not leader" shows the stream exists after all (a
    restarting cluster lists no streams for a moment), so that also looks it up again. So does
    "Cursors stream does not exist" until the cluster is confirmed to have no cursors stream (see
    :func:`_cursors_off_confirmed`): a cluster right after a full restart answers that for a moment too.
    With ``settle`` (FetchCursor) each attempt first waits for the owning partition to commit what its
    leader holds (:func:`_cursors_settled`)."""
    until = core.call_deadline(None)
    retries = 0
    while True:
        if core.cursors_unknown():
            yield from refresh_metadata(core, [CURSORS_STREAM], until)
            core.cursors_absent_since = None if core.cache.stream(CURSORS_STREAM) else time.monotonic()
        owner = core.cursors_partition(cursor_id, stream, partition)
        preferred = None if owner is None else core.route(CURSORS_STREAM, owner)
        try:
            if settle and owner is not None:
                preferred = yield from _cursors_settled(core, owner, preferred)
            return (
                yield from unary(
                    core, method, request, preferred=preferred, stream=stream, partition=partition, until=until
                )
            )
        except (NotLeaderError, CursorsDisabledError) as exc:
            if isinstance(exc, CursorsDisabledError) and (yield from _cursors_off_confirmed(core, retries)):
                raise  # cursors are off in this cluster: waiting cannot help
            wait = core.retry_wait(retries + 1, until)
            if wait is None:
                raise
            retries += 1
            yield Sleep(wait)
            core.cache.forget(CURSORS_STREAM)  # the leader moved: look it up again
            core.cursors_absent_since = None


def _cursors_off_confirmed(core: ClientCore, retries: int) -> Op[bool]:
    """After "Cursors stream does not exist": whether cursors really are off. Not when this client
    has seen the cursors stream listed, or the metadata of all streams lists it (a restarting
    cluster: it answers so until the stream has a leader again). Yes when that metadata lists
    other streams and no cursors stream. A cluster that lists no stream at all is either empty or
    in the first moment of a full restart (about 0.3 s on Liftbridge): believed after
    ``max_retries`` waits."""
    if CURSORS_STREAM in core.seen_streams:
        return False
    try:
        metadata = yield from refresh_metadata(core, None)
    except UnavailableError:
        return False  # no broker answers yet: the cluster is not back
    if CURSORS_STREAM in metadata.streams:
        return False
    return bool(metadata.streams) or retries >= core.retry.max_retries


def _cursor_args(cursor_id: str, stream: str) -> None:
    if not cursor_id:
        raise InvalidArgumentError("cursor_id must be a non-empty string naming the cursor")
    if not stream:
        raise InvalidArgumentError("stream must be a non-empty stream name")
