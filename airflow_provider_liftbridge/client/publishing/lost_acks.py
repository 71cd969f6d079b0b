"""Records acknowledged with ack policy ALL, then lost before the call failed.

Liftbridge v1.9 can remove records it acknowledged with ALL: a follower cuts its log to its own
lagging high watermark and is then elected (docs/reliability.md, seeds 59919 and 59961). When a
publish with ALL is about to raise a :class:`~..errors.PublishError`, and only then (the success
path pays nothing), :func:`lost_since_acked` asks each partition that acknowledged records in the
call for its newest offset, from the leader its replicas agree on; an acknowledged record above it
is reported with :class:`~..errors.AckedThenLostError` instead of its ack.

A deposed leader that still names itself may answer with a shorter log than the real one. So a
partition's reading counts only when exactly one replica answers as leader, a majority of its
replicas answer (as leader or "not leader"), and a second reading names the same leader with the
log still ending below the acks. Otherwise the acks stand and a warning says the check could not
tell. Every step is bounded by the call's ack timeout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from airflow_provider_liftbridge._proto import api_pb2

from ..conversion import partition_from_pb
from ..effects import Op, RpcFailure, Unary
from ..error_mapping import map_rpc_error
from ..errors import AckedThenLostError, LiftbridgeError, NotLeaderError, PublishError
from ..operations import refresh_metadata
from ..routing import ClientCore
from ..types import Ack, AckPolicy, PartitionInfo
from .options import PublishOptions
from .resend import NO_RESEND

__all__ = ["lost_since_acked"]

log = logging.getLogger("airflow_provider_liftbridge.client")


def lost_since_acked(core: ClientCore, stream: str, options: PublishOptions, exc: PublishError) -> Op[PublishError]:
    """``exc`` as it is, or (ack policy ALL, some acknowledged records now above their partition's
    newest offset, as the agreed leader reports it) a new :class:`PublishError` chained to it in
    which those records carry :class:`AckedThenLostError` instead of their ack. Never raises: a
    partition that cannot be read in the call's ack timeout keeps its acks (logged at WARNING).

    With ``NO_RESEND`` the caller decides on unacknowledged records itself and checks the log
    itself (exactly-once publishing: ``TruncatedLogError``), so ``exc`` is returned as it is.
    """
    if options.policy != AckPolicy.ALL or options.resend is NO_RESEND or not exc.acked:
        return exc
    newest_acked: dict[int, int] = {}
    for ack in exc.acks:
        if ack is not None and ack.offset > newest_acked.get(ack.partition, -1):
            newest_acked[ack.partition] = ack.offset
    until = core.clock() + options.wait
    ends: dict[int, int] = {}
    for partition, top in sorted(newest_acked.items()):
        newest = yield from _agreed_newest(core, stream, partition, until)
        if newest is None:
            log.warning(
                "publish_many to stream %r failed; whether partition %d still holds the records it acknowledged "
                "with ALL (up to offset %d) could not be told in %g s (no agreed leader answered); they are "
                "reported as acknowledged",
                stream,
                partition,
                top,
                options.wait,
            )
        elif newest < top:
            ends[partition] = newest
    if not ends:
        return exc
    return _with_lost(stream, exc, ends)


def _with_lost(stream: str, exc: PublishError, ends: dict[int, int]) -> PublishError:
    """``exc`` with each ack above its partition's end in ``ends`` turned into an error."""
    acks: list[Ack | None] = list(exc.acks)
    errors = dict(exc.errors)
    lost: list[int] = []
    for i, ack in enumerate(acks):
        if ack is None or ack.partition not in ends or ack.offset <= ends[ack.partition]:
            continue
        newest = ends[ack.partition]
        acks[i] = None
        lost.append(i)
        errors[i] = AckedThenLostError(
            f"record {i} was acknowledged with ack policy ALL at offset {ack.offset} of stream {stream!r} partition "
            f"{ack.partition}, and the partition's log now ends at offset {newest}: the record is not stored. "
            "Publish it again, and check the cluster (Liftbridge removed a committed record: its brokers' logs, "
            "the partition's leader changes and ISR).",
            stream=stream,
            partition=ack.partition,
            offset=ack.offset,
            newest_offset=newest,
        )
    where = ", ".join(f"partition {p} ends at offset {end}" for p, end in sorted(ends.items()))
    first = lost[0] if exc.index is None else min(exc.index, lost[0])
    failed = PublishError(
        f"{exc}; and {len(lost)} record(s) acknowledged with ALL in this call were lost since ({where}): "
        "they are reported as not stored (AckedThenLostError); publish them again",
        acks=acks,
        index=first,
        errors=errors,
        start=exc.start,
    )
    failed.__cause__ = exc
    return failed


def _agreed_newest(core: ClientCore, stream: str, partition: int, until: float) -> Op[int | None]:
    """The partition's newest offset as its agreed leader reports it, read twice (the higher of
    the two readings), or ``None`` when no leader is agreed on in both readings."""
    first = yield from _leader_reading(core, stream, partition, until)
    if first is None:
        return None
    second = yield from _leader_reading(core, stream, partition, until)
    if second is None or second.leader != first.leader:
        return None
    return max(first.newest_offset, second.newest_offset)


def _leader_reading(core: ClientCore, stream: str, partition: int, until: float) -> Op[PartitionInfo | None]:
    """The partition as the one replica that answers as its leader reports it, when a majority of
    its replicas answered (as leader, or refusing as "not leader"); else ``None``."""
    replicas = yield from _replicas(core, stream, partition, until)
    request = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    claims: list[PartitionInfo] = []
    answered = 0
    for k, broker_id in enumerate(replicas):
        address = core.cache.broker_address(broker_id)
        remaining = until - core.clock()
        if address is None or remaining <= 0:
            continue
        # Each replica gets a share of what is left: a silent one must not use up the others' time.
        share = remaining / (len(replicas) - k)
        try:
            response = yield Unary(address, "FetchPartitionMetadata", request, share)
        except RpcFailure as failure:
            refused = map_rpc_error("FetchPartitionMetadata", failure, stream=stream, partition=partition)
            answered += isinstance(refused, NotLeaderError)
            continue
        answered += 1
        info = partition_from_pb(stream, response.metadata)
        if info.leader == broker_id:
            claims.append(info)
    if len(claims) != 1 or 2 * answered <= len(replicas):
        return None
    return claims[0]


def _replicas(core: ClientCore, stream: str, partition: int, until: float) -> Op[Sequence[str]]:
    """The partition's replicas (broker ids), from the cache or else fresh metadata; none when
    neither tells."""
    part = core.partition_info(stream, partition)
    if part is None:
        try:
            yield from refresh_metadata(core, [stream], until)
        except LiftbridgeError:
            return ()
        part = core.partition_info(stream, partition)
    return () if part is None else part.replicas
