"""Recovery after an ack time-out over NATS: re-sending only what a partition certainly does not
hold (``publish_many``'s default), and saying so: every re-send is logged at WARNING and counted. Records
that were stored but whose acks were lost (a NATS node dying between the broker and the client)
are found by reading the partition, and count as acknowledged."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from airflow_provider_liftbridge._proto import api_pb2

from ..effects import DropNats, Op, Sleep
from ..errors import LiftbridgeError, NoSuchPartitionError, NoSuchStreamError, NotLeaderError, UnavailableError
from ..operations import fetch_partition_metadata, missing_confirmed_op
from ..routing import ClientCore, OutageBudget
from ..subscription import read_committed
from ..types import Ack, AckPolicy, Record
from .columns import as_record
from .nats_engine import BulkOutcome
from .options import PublishOptions

__all__ = ["discard_nats", "merge_retry", "send_unstored_again", "warn_resent"]

log = logging.getLogger("airflow_provider_liftbridge.client")


class SentBatch(Protocol):
    """A batch sent over NATS, as :func:`send_unstored_again` needs it (``batch.NatsBatch``)."""

    @property
    def items(self) -> Sequence[Record | bytes]: ...
    @property
    def parts(self) -> Sequence[int]: ...
    @property
    def subjects(self) -> Sequence[str]: ...
    @property
    def ids(self) -> Sequence[str]: ...
    @property
    def options(self) -> PublishOptions: ...
    @property
    def before(self) -> Mapping[int, int]: ...
    def send(self, indices: Sequence[int] | None = None) -> Op[BulkOutcome]: ...


def send_unstored_again(core: ClientCore, stream: str, outcome: BulkOutcome, batch: SentBatch) -> Op[None]:
    """Send again, within the call's retry budget (:class:`OutageBudget`: the ack timeout, at least
    ``max_retries`` rounds), the timed-out records that are certainly not stored; ``outcome`` is
    updated in place (the rest stay timed out).

    Over NATS a publish that no broker takes gets no answer at all: right after a full-cluster
    restart the partitions have no leader for a second or two, and what is published to their
    subjects meanwhile is dropped (``liftbridge-semantics.md``), where gRPC says "no such stream".
    An ack time-out alone cannot tell a dropped record from one stored whose ack was late or lost,
    so nothing is re-sent on its strength (beyond what the caller's resend policy allows). A
    partition's records are known not to be stored when its leader's newest offset is what it
    held before the batch plus the records of the batch it acknowledged: nothing else was written
    there since. When more was written, but no more than the batch itself, the partition is read
    (:func:`recover_stored`): records found there were stored and only their acks were lost, and
    they count as acknowledged; if that accounts for everything written, the rest are certainly
    not stored. (Callers that publish with ``resend=NO_RESEND`` never come here: they find out
    themselves, as exactly-once publishing does, and must see the time-outs.) The client's NATS
    connection is dropped first, so that no copy still buffered
    in it can arrive after that check. Until the partitions have a leader again, the check waits
    its backoff, as :mod:`..presence` says; a stream confirmed missing ends it.
    """
    parts, before = batch.parts, batch.before
    if any(before[parts[i]] < -1 for i in outcome.timed_out):
        return  # metadata without offsets: nothing to judge by
    stretch = OutageBudget(core, batch.options.wait)
    while (backoff := stretch.retry()) is not None:
        yield from discard_nats()
        yield Sleep(backoff)
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
            # A paused partition is not among these: fetch_partition_metadata raises
            # PartitionPausedError for it (handled below), and the metadata's paused flag is no
            # proof either way (it stays set after a resume).
            continue  # the cluster is not back: no leader to ask yet
        except LiftbridgeError:
            return  # the broker does not answer in time either (stopped, overloaded): keep the time-outs
        if not (yield from _unstored_proven(core, stream, outcome, batch, newest, waiting)):
            return  # these records may be stored: keep their time-outs
        if not outcome.timed_out:
            return  # all found stored
        again = outcome.timed_out
        log.warning(
            "publish_many to stream %r: re-sending %d record(s) without an ack that the partition does not hold",
            stream,
            len(again),
        )
        merge_retry(outcome, again, (yield from batch.send(again)))
        if not outcome.timed_out or outcome.failure is not None:
            return
        if len(outcome.timed_out) < len(again):
            stretch.progressed()  # some were acknowledged: the cluster is taking records again
        # Still no ack: judge again (this batch's new acks count as what the partitions hold).


def _unstored_proven(
    core: ClientCore,
    stream: str,
    outcome: BulkOutcome,
    batch: SentBatch,
    newest: Mapping[int, int],
    waiting: Sequence[int],
) -> Op[bool]:
    """Whether the records of ``outcome`` still timed out are certainly not in the ``waiting``
    partitions, reading them (:func:`recover_stored`, which acknowledges what it finds) when more
    than the acknowledged records was written there."""
    if _accounted_for(outcome, batch.parts, batch.before, newest, waiting):
        return True
    try:
        yield from recover_stored(core, stream, outcome, batch, newest, waiting)
    except LiftbridgeError:
        return False  # the partition could not be read
    return _accounted_for(outcome, batch.parts, batch.before, newest, waiting)


def _accounted_for(
    outcome: BulkOutcome,
    parts: Sequence[int],
    before: Mapping[int, int],
    newest: Mapping[int, int],
    waiting: Sequence[int],
) -> bool:
    """Whether everything written to the ``waiting`` partitions since ``before`` is this batch's
    acknowledged records (so its records without an ack are certainly not there)."""
    acked: dict[int, int] = {}
    for i, ack in enumerate(outcome.acks):
        if ack is not None:
            acked[parts[i]] = acked.get(parts[i], 0) + 1
    return all(newest[p] == before[p] + acked.get(p, 0) for p in waiting)


def recover_stored(
    core: ClientCore,
    stream: str,
    outcome: BulkOutcome,
    batch: SentBatch,
    newest: Mapping[int, int],
    waiting: Sequence[int],
) -> Op[None]:
    """Find the batch's records without an ack that the partitions hold, and give each the ack
    it missed (``outcome`` is updated in place; logged at WARNING).

    A broker acks over NATS after storing; when the NATS node between it and the client dies,
    the record is stored and its ack is lost. Only a partition that holds no more new messages
    than the batch sent it is read (the batch is the only writer that can explain them). A
    delivered message carries no correlation id (``liftbridge-semantics.md``), so records are
    recognised by key, value and headers, each stored message matched once and none that an ack
    already names: a record with the same content written by another writer at the same moment
    cannot be told apart from this one.

    :raises LiftbridgeError: a partition could not be read.
    """
    timed_out = set(outcome.timed_out)
    found: dict[int, Ack] = {}
    for p in waiting:
        mine = [i for i, part in enumerate(batch.parts) if part == p]
        first, last = batch.before[p] + 1, newest[p]
        if last < first or last - first + 1 > len(mine):
            continue  # nothing new, or more than this batch wrote: another writer; keep the time-outs
        acked_offsets = {a.offset for i in mine if (a := outcome.acks[i]) is not None}
        pool: dict[tuple[bytes, bytes], list[api_pb2.Message]] = {}
        wait = batch.options.wait
        for pb in (yield from read_committed(core, stream, p, first, last, wait)):
            if pb.offset not in acked_offsets:
                pool.setdefault((pb.key, pb.value), []).append(pb)
        for i in mine:
            if i not in timed_out:
                continue
            record = as_record(i, batch.items[i])
            candidates = pool.get((record.key or b"", record.value), [])
            match = next((pb for pb in candidates if _headers_match(record, pb)), None)
            if match is not None:
                candidates.remove(match)
                found[i] = _recovered_ack(stream, p, batch, i, match)
    if not found:
        return
    for i, ack in found.items():
        outcome.acks[i] = ack
    outcome.timed_out = [i for i in outcome.timed_out if i not in found]
    log.warning(
        "publish_many to stream %r: %d record(s) without an ack were found stored (their acks were lost on the way, "
        "as when a NATS node dies); counted as acknowledged, not sent again",
        stream,
        len(found),
    )


def _headers_match(record: Record, pb: api_pb2.Message) -> bool:
    # The server adds headers of its own (subject, reply): the record's must all be there.
    return all(pb.headers.get(name) == value for name, value in (record.headers or {}).items())


def _recovered_ack(stream: str, partition: int, batch: SentBatch, i: int, pb: api_pb2.Message) -> Ack:
    """The ack a stored record would have got: its offset and reception time as stored (the
    commit time is not known: 0)."""
    subject = batch.subjects[i]
    return Ack(
        stream=stream,
        partition=partition,
        partition_subject=subject,
        msg_subject=subject,
        offset=pb.offset,
        ack_inbox="",
        correlation_id=batch.ids[i],
        ack_policy=batch.options.ack_policy or AckPolicy.LEADER,  # None: the server default
        reception_timestamp=pb.timestamp,
        commit_timestamp=0,
    )


def merge_retry(outcome: BulkOutcome, again: Sequence[int], retry: BulkOutcome, *, resent: bool = True) -> None:
    """Fold the outcome of sending records ``again`` (indices into ``outcome``) into ``outcome``:
    a re-send of records without an ack, or (``resent=False``) the first send of records the
    batch had not sent yet. Records of ``again`` that this send did not hand over keep their
    state (still never sent, or sent before)."""
    outcome.timed_out = [again[k] for k in retry.timed_out]
    state, retry_state = outcome.state, retry.state
    for k, i in enumerate(again):
        outcome.acks[i] = retry.acks[k]
        if k in retry.errors:
            outcome.errors[i] = retry.errors[k]
        if state is not None and retry_state is not None and retry_state[k]:  # no state: nothing handed over
            state[i] = retry_state[k]
    if retry.failure is not None:
        outcome.failure = retry.failure
    outcome.sent += retry.sent
    outcome.resent += (len(again) if resent else 0) + retry.resent


def warn_resent(stream: str, records: int, why: str) -> None:
    log.warning(
        "publish_many to stream %r: re-sent %d record(s) %s (at-least-once: each may be stored twice)",
        stream,
        records,
        why,
    )


def discard_nats(flush_within: float = 0.0) -> Op[bool]:
    """Drop the client's NATS connection (it reconnects on next use) so that nothing queued in it
    reaches the server later: a flush of up to ``flush_within`` seconds, else a reset (see
    ``NatsLink.discard``). Result: whether everything sent on it is known to have reached the
    server (``False``: segments already on the way may still arrive)."""
    delivered: bool = yield DropNats(flush_within)
    return delivered
