"""Publishing a batch over gRPC PublishAsync: pipelined within a window, acks matched by
correlation id, unacknowledged records re-sent after a lost connection while the resend policy
allows."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc

from airflow_provider_liftbridge._proto import api_pb2

from ..conversion import ack_from_pb
from ..effects import END, Cancel, CloseWrite, Op, OpenStream, Read, ReadTimeout, RpcFailure, Sleep, Write
from ..error_mapping import check_ack, map_async_error, map_rpc_error, publish_error
from ..errors import (
    AckTimeoutError,
    InvalidArgumentError,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PublishError,
)
from ..operations import choose_partition, missing_confirmed_op, refresh_metadata
from ..requests import build_publish
from ..retry import is_transient
from ..routing import ClientCore, OutageBudget
from ..types import Ack, AckPolicy, Record
from .columns import as_record
from .contract import name_unacknowledged
from .options import DEFAULT_OPTIONS, PublishOptions
from .resend import ResendPolicy
from .window import SendWindow

if TYPE_CHECKING:
    from ..write_stats import WriteStats

log = logging.getLogger("airflow_provider_liftbridge.client")

__all__ = ["send_over_grpc"]


def send_over_grpc(
    core: ClientCore,
    stream: str,
    records: Iterable[Record | bytes],
    options: PublishOptions = DEFAULT_OPTIONS,
    *,
    sent_ns: list[int] | None = None,
    stats: WriteStats | None = None,
) -> Op[list[Ack]]:
    """Publish many records pipelined over one PublishAsync stream, at most ``window`` unacked
    at a time; return their acks in input order (an empty list with ``AckPolicy.NONE``, which
    gets no answers).

    A record's own ``partition`` wins over ``options.partition``, which wins over ``options.partitioner``. If
    the connection is lost (UNAVAILABLE) the unacknowledged records are sent again on another
    broker while ``options.resend`` allows it (default: twice): at-least-once. Records refused
    with "no such stream" for a stream this client has seen in metadata are sent again after a
    backoff, unless the metadata of all streams confirms it is gone (see :mod:`..presence`).
    Either kind of retry goes on, with backoff, for at least ``max_retries`` retries and then
    while the wait ends within ``options.timeout`` of the first failure since the last ack
    (``ClientCore.retry_wait``), so a partition electing a leader is waited out for the call's
    time, as the unary calls do. ``options.timeout`` also bounds the wait for each ack (unset: the
    client's), ``options.window`` the records in flight (unset: 256).
    ``sent_ns``, when given, gets each record's first send time in wall-clock nanoseconds (for
    write statistics).

    :raises PublishError: a record was refused or not acknowledged in time; it carries the acks
        received (``.acks``, ``.acked``), the first failing record's index (``.index``) and the
        typed error of each failed record (``.errors``); ``__cause__`` is the first error.
    :raises InvalidArgumentError: a bad record, window or duplicate correlation id, before
        anything is sent.
    """
    policy = core.resolve_ack_policy(options.ack_policy)
    wait = core.ack_wait(options.timeout, policy)
    partition, partitioner = options.partition, options.partitioner
    batch = uuid.uuid4().hex[:12]
    requests: list[api_pb2.PublishRequest] = []
    ids: list[str] = []
    for i, item in enumerate(records):
        rec = as_record(i, item)
        chosen = yield from choose_partition(
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
    window = options.window_for("grpc")
    return (yield from _pipeline(core, stream, requests, ids, window, wait, options.resend, sent_ns, stats))


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


def _leader_of(core: ClientCore, stream: str, requests: list[api_pb2.PublishRequest]) -> str | None:
    """The address of the leader of the one partition all ``requests`` go to; ``None`` when they
    go to several or the metadata cache does not know it."""
    if not requests:
        return None
    partition = requests[0].partition
    if any(r.partition != partition for r in requests):
        return None
    return core.route(stream, partition)


def _pipeline(
    core: ClientCore,
    stream: str,
    requests: list[api_pb2.PublishRequest],
    ids: list[str],
    window: int,
    wait: float,
    resend: ResendPolicy | None = None,
    sent_ns: list[int] | None = None,
    stats: WriteStats | None = None,
) -> Op[list[Ack]]:
    """Send ``requests`` through a :class:`~.window.SendWindow` of ``window`` records over one
    PublishAsync stream at a time: send, settle each answer, and after a lost connection re-send
    what was in flight (:func:`_after_lost_connection`) on a new stream; an ack time-out or a
    failure that is not transient ends the call with every record named (:func:`_failed`)."""
    sent = SendWindow(len(requests), window)
    index_of = {cid: i for i, cid in enumerate(ids)}
    attempt = 0  # connections lost in this call: picks the broker
    outage = OutageBudget(core, wait)
    # A batch for one partition goes to that partition's leader (when the metadata cache knows
    # it), not to whichever broker answered last: any broker accepts a publish and forwards it,
    # but a stopped broker that received it carries it out when it wakes, long after the client
    # gave up on it. Sent to the leader, a record waits in no other broker (ADR 8).
    leader = _leader_of(core, stream, requests)
    while sent.unfinished:
        address = core.address_for_attempt(attempt, leader)
        handle = yield OpenStream(address, "PublishAsync")
        try:
            while sent.running:
                for i in sent.sendable():
                    if sent_ns is not None and not sent_ns[i]:
                        sent_ns[i] = time.time_ns()
                    yield Write(handle, requests[i])
                response = yield Read(handle, wait)
                if response is END:
                    raise RpcFailure(grpc.StatusCode.UNAVAILABLE, "the server closed the publish stream early")
                _settle(sent, index_of, response, stream, requests, outage)
            # Done when the last ack is in: cancel rather than wait for the server to close the
            # stream (a real server takes seconds to).
            yield Cancel(handle)
            if (yield from _missing_again(core, stream, requests, sent, outage)):
                continue
            break
        except RpcFailure as failure:
            yield Cancel(handle)
            backoff = outage.retry() if is_transient(failure) else None
            if backoff is None:
                cause = map_rpc_error("PublishAsync", failure, stream=stream, attempts=attempt + 1)
                why = f"publishing to stream {stream!r} failed: {cause}"
                raise _failed(sent, None, why, cause) from cause
            attempt += 1
            yield from _after_lost_connection(core, stream, sent, resend, backoff, outage, stats)
            leader = _leader_of(core, stream, requests)
        except ReadTimeout:
            first = sent.expire(
                lambda i: AckTimeoutError(
                    f"no ack for record {i} on stream {stream!r} within {wait:g} s; raise timeout= or check the "
                    "broker. Unacknowledged records may or may not be stored."
                )
            )
            core.suspect(address, stream)  # maybe a leader cut off from its peers: ask another next
            cause = sent.errors[first]
            raise _failed(sent, first, str(cause), cause) from cause
    if sent.errors:
        first = min(sent.errors)
        why = f"record {first} was refused: {sent.errors[first]}"
        raise _failed(sent, first, why, None) from sent.errors[first]
    return sent.acks  # type: ignore[return-value]  # complete: the publish contract (send_batch) checks it


def _settle(
    sent: SendWindow,
    index_of: dict[str, int],
    response: api_pb2.PublishResponse,
    stream: str,
    requests: list[api_pb2.PublishRequest],
    outage: OutageBudget,
) -> None:
    """Settle the record ``response`` answers: its async error, or its checked ack (an ack, not a
    refusal, is progress: refusals share one outage budget). Answers for no record in flight
    (not ours, or a repeat after a re-send) are ignored."""
    i = index_of.get(response.correlationId or response.ack.correlationId, -1)
    if not sent.is_in_flight(i):
        return
    if response.HasField("asyncError"):
        err = response.asyncError
        sent.settle(i, error=map_async_error(err.code, err.message, stream=stream, partition=requests[i].partition))
        return
    outage.progressed()
    try:
        sent.settle(i, check_ack(ack_from_pb(response.ack)))
    except LiftbridgeError as exc:
        sent.settle(i, error=exc)


def _missing_again(
    core: ClientCore,
    stream: str,
    requests: list[api_pb2.PublishRequest],
    sent: SendWindow,
    outage: OutageBudget,
) -> Op[bool]:
    """Whether records refused only with "no such stream" go again (they now wait): about a stream
    just created, or seen before, that is what a new stream's brokers and a restarting cluster say
    for a second or two (presence.py). Refused records were not stored: sending them again after a
    backoff cannot duplicate them, unless metadata confirms the stream is gone."""
    errors = sent.errors
    missing = sorted(i for i, e in errors.items() if isinstance(e, NoSuchStreamError | NoSuchPartitionError))
    backoff = outage.retry() if missing and len(missing) == len(errors) else None
    if backoff is None:
        return False
    yield Sleep(backoff)
    if (yield from missing_confirmed_op(core, stream, requests[missing[0]].partition)):
        return False
    sent.retry(missing)
    return True


def _after_lost_connection(
    core: ClientCore,
    stream: str,
    sent: SendWindow,
    resend: ResendPolicy | None,
    backoff: float,
    outage: OutageBudget,
    stats: WriteStats | None,
) -> Op[None]:
    """The publish stream was lost (a transient failure): re-send what was in flight, in input
    order (at-least-once), unless the caller's policy refuses (exactly-once publishing decides for
    itself), once the cluster answers again.

    :raises PublishError: a re-send was refused, or no broker answered within the outage's budget.
    """
    refused, requeued = sent.requeue(
        resend,
        lambda i: AckTimeoutError(
            f"the connection was lost before record {i} was acknowledged and the resend policy "
            "refused to send it again; it may or may not be stored."
        ),
    )
    if refused:
        why = f"record {refused[0]} failed: {sent.errors[refused[0]]}"
        raise _failed(sent, refused[0], why, None) from sent.errors[refused[0]]
    if requeued:
        # At-least-once: the lost attempt may have stored them. Said and counted.
        log.warning(
            "publish_many to stream %r: re-sending %d record(s) without an ack after a lost connection "
            "(at-least-once: each may be stored twice)",
            stream,
            requeued,
        )
        if stats is not None:
            stats.note_resent(requeued)
    yield Sleep(backoff)
    try:
        # Hand the records over again only once the cluster answers, within the outage's budget:
        # each reconnect that failed after they were written would count as one more send of each
        # (it may have stored them), and the refreshed metadata names the partition's leader now.
        yield from refresh_metadata(core, [stream], until=outage.until)
    except LiftbridgeError as unreachable:
        why = f"publishing to stream {stream!r} failed: {unreachable}"
        raise _failed(sent, None, why, unreachable) from unreachable


def _failed(sent: SendWindow, index: int | None, why: str, in_doubt: LiftbridgeError | None) -> PublishError:
    """The :class:`PublishError` of a pipeline that stopped, every record named: those never
    written get :class:`NotSentError`; written ones without an ack get ``in_doubt`` (the failure
    that ended the stream: "may or may not be stored"), when there is one. The caller raises it
    from the first error."""

    def doubt(i: int) -> LiftbridgeError:
        assert in_doubt is not None
        return type(in_doubt)(f"record {i} was sent without an ack before the publish failed: {in_doubt}")

    stopped_by = f"record {index}'s failure" if index is not None else "a failure of the publish stream"
    unsent = [i for i, h in enumerate(sent.written_once) if not h]
    acks, errors = sent.acks, sent.errors
    name_unacknowledged(
        acks, errors, unsent=unsent, in_doubt=None if in_doubt is None else doubt, stopped_by=stopped_by
    )
    return publish_error(acks, index, errors, why)
