"""Re-sending over NATS only what a partition certainly does not hold (``publish_many``'s default
after an ack time-out), and saying so: every re-send is logged at WARNING and counted."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..effects import DropNats, Op, Sleep
from ..errors import LiftbridgeError, NoSuchPartitionError, NoSuchStreamError, NotLeaderError, UnavailableError
from ..operations import fetch_partition_metadata, missing_confirmed_op
from ..routing import ClientCore
from .nats_engine import BulkOutcome

__all__ = ["discard_nats", "merge_retry", "send_unstored_again", "warn_resent"]

log = logging.getLogger("airflow_provider_liftbridge.client")


def send_unstored_again(
    core: ClientCore,
    stream: str,
    outcome: BulkOutcome,
    parts: Sequence[int],
    before: dict[int, int],
    nats: Callable[[Sequence[int]], Op[BulkOutcome]],
) -> Op[None]:
    """Send again, within the call's retry budget, the timed-out records that are certainly not
    stored; ``outcome`` is updated in place (the rest stay timed out).

    Over NATS a publish that no broker takes gets no answer at all: right after a full-cluster
    restart the partitions have no leader for a second or two, and what is published to their
    subjects meanwhile is dropped (``liftbridge-semantics.md``), where gRPC says "no such stream".
    An ack time-out alone cannot tell a dropped record from one stored whose ack was late or lost,
    so nothing is re-sent on its strength (beyond what the caller's resend policy allows). A
    partition's records are known not to be stored when its leader's newest offset is what it
    held before the batch plus the records of the batch it acknowledged: nothing else was written
    there since. The client's NATS connection is dropped first, so that no copy still buffered
    in it can arrive after that check. Until the partitions have a leader again, the check waits
    its backoff, as :mod:`..presence` says; a stream confirmed missing ends it.
    """
    if any(before[parts[i]] < -1 for i in outcome.timed_out):
        return  # metadata without offsets: nothing to judge by
    for attempt in range(1, core.retry.max_retries + 1):
        yield from discard_nats()
        yield Sleep(core.backoff(attempt))
        acked: dict[int, int] = {}
        for i, ack in enumerate(outcome.acks):
            if ack is not None:
                acked[parts[i]] = acked.get(parts[i], 0) + 1
        waiting = sorted({parts[i] for i in outcome.timed_out})
        try:
            newest: dict[int, int] = {}
            for p in waiting:
                part = yield from fetch_partition_metadata(core, stream, p)
                if part.readonly:
                    return  # dropped for good: _explain_timeouts says why
                newest[p] = part.newest_offset
        except (NoSuchStreamError, NoSuchPartitionError, NotLeaderError, UnavailableError):
            try:
                if (yield from missing_confirmed_op(core, stream, waiting[0])):
                    return
            except LiftbridgeError:
                return  # keep the time-outs
            info = core.cache.stream(stream)  # all streams' metadata, just fetched
            if info is not None and any(info.partitions[p].paused for p in waiting if p in info.partitions):
                return  # a paused partition answers as a non-leader; waiting will not change that
            continue  # the cluster is not back: no leader to ask yet
        except LiftbridgeError:
            return  # the broker does not answer in time either (stopped, overloaded): keep the time-outs
        if any(newest[p] != before[p] + acked.get(p, 0) for p in waiting):
            return  # something was written there: these records may be stored, keep their time-outs
        again = outcome.timed_out
        log.warning(
            "publish_many to stream %r: re-sending %d record(s) without an ack that the partition does not hold",
            stream,
            len(again),
        )
        merge_retry(outcome, again, (yield from nats(again)))
        if not outcome.timed_out or outcome.failure is not None:
            return
        # Still no ack: judge again (this batch's new acks count as what the partitions hold).


def merge_retry(outcome: BulkOutcome, again: Sequence[int], retry: BulkOutcome) -> None:
    """Fold the outcome of re-sending records ``again`` (indices into ``outcome``) into ``outcome``."""
    outcome.timed_out = [again[k] for k in retry.timed_out]
    for k, i in enumerate(again):
        outcome.acks[i] = retry.acks[k]
        if k in retry.errors:
            outcome.errors[i] = retry.errors[k]
    if retry.failure is not None:
        outcome.failure = retry.failure
    outcome.sent += retry.sent
    outcome.resent += len(again) + retry.resent


def warn_resent(stream: str, records: int, why: str) -> None:
    log.warning(
        "publish_many to stream %r: re-sent %d record(s) %s (at-least-once: each may be stored twice)",
        stream,
        records,
        why,
    )


def discard_nats() -> Op[None]:
    """Close the client's NATS connection without flushing what it still buffers (it reconnects
    on next use): after a failed batch, nothing queued may reach the server later."""
    yield DropNats()
