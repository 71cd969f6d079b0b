"""The Subscribe RPC of one broker: where a subscription starts and stops, the handshake, the
committed messages straight from the log, and how a subscription ends (stop offset, read-only,
pause, delete, lost leadership, or another member of its consumer group taking the partition over:
``group_subscribers.py``). ``service.py`` registers it beside the other RPCs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from grpc import aio

from airflow_provider_liftbridge._proto import api_pb2

from .errors import ApiError
from .isolation import view_leader
from .model import BrokerSlot
from .partition import Partition
from .state import Store

_WAIT_FOREVER = -1
_READ_BATCH = 512
_HANDSHAKE = b""
#: What Liftbridge answers (INTERNAL, no handshake) to a Subscribe without ``resume`` on a paused
#: partition starting at a committed offset.
PAUSED_SUBSCRIBE = "Failed to create stream reader: segment has been closed"
#: How Liftbridge ends a subscription whose partition is paused (FAILED_PRECONDITION) or deleted
#: (NOT_FOUND): its commit log's errors (``server/commitlog``, ErrCommitLogClosed / ErrCommitLogDeleted).
COMMIT_LOG_CLOSED = "commit log was closed"
COMMIT_LOG_DELETED = "commit log was deleted"
#: Liftbridge's refusals of a group Subscribe without a consumer id, and of one on a replica (``server/api.go``).
NO_CONSUMER_ID = "Consumer id cannot be empty when group id is provided"
GROUP_ON_REPLICA = "Consumer groups not compatible with ReadISRReplica"


async def _abort(context: aio.ServicerContext[Any, Any], err: ApiError) -> NoReturn:
    await context.abort(err.code, err.message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class SubscribeApi:
    """Subscribe as answered by one broker.

    :param store: the shared state.
    :param broker: the broker answering (leadership checks, its own replica in cluster mode).
    :param knows: whether this broker knows a stream yet (a new one reaches the brokers one by one).
    """

    def __init__(self, store: Store, broker: BrokerSlot, knows: Callable[[str], bool]) -> None:
        self.store = store
        self.broker = broker
        self._knows = knows

    def _start_offset(self, req: api_pb2.SubscribeRequest, part: Partition) -> int:
        log_ = part.log
        newest = part.hw
        pos = req.startPosition
        if pos == api_pb2.OFFSET:
            start = req.startOffset
        elif pos == api_pb2.TIMESTAMP:
            start = log_.earliest_offset_after_timestamp(req.startTimestamp)
        elif pos == api_pb2.EARLIEST:
            # Liftbridge's OldestOffset is its first segment's first offset: -1 when that segment
            # holds no record (a new log, or one emptied by retention down to an empty active
            # segment), so the start is 0 there, and a stop below the next offset is accepted.
            start = -1 if log_.is_empty else log_.oldest_offset
        elif pos == api_pb2.LATEST:
            start = newest
        elif pos == api_pb2.NEW_ONLY:
            start = newest + 1
        else:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Unknown StartPosition {pos}")
        return max(start, 0)

    def _stop_offset(self, req: api_pb2.SubscribeRequest, part: Partition) -> int:
        newest = part.hw
        pos = req.stopPosition
        if pos == api_pb2.STOP_ON_CANCEL:
            return newest if part.readonly else _WAIT_FOREVER
        if pos == api_pb2.STOP_OFFSET:
            return req.stopOffset
        if pos == api_pb2.STOP_TIMESTAMP:
            return min(part.log.last_offset_at_or_before(req.stopTimestamp), newest)
        if pos == api_pb2.STOP_LATEST:
            if newest == -1:
                raise ApiError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stream is empty")
            return newest
        raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, f"Unknown StopPosition {pos}")

    async def Subscribe(
        self, req: api_pb2.SubscribeRequest, context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        store = self.store
        cluster = store.cluster
        group = req.consumer.groupId
        if group and not req.consumer.consumerId:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NO_CONSUMER_ID)
        part = store.get_partition(req.stream, req.partition)
        if part is None or (cluster is not None and (cluster.no_streams or not self._knows(req.stream))):
            await _abort(context, ApiError(grpc.StatusCode.NOT_FOUND, "No such partition"))
        leads = view_leader(part, self.broker) == self.broker.id  # an isolated broker: as it last knew
        if group and req.readISRReplica and not leads:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, GROUP_ON_REPLICA)
        if (not leads and not (req.readISRReplica and self.broker.id in part.isr)) or (
            cluster is not None and cluster.no_leaders
        ):
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
        if part.paused and req.resume:
            await store.resume_for_publish(part)
        try:
            # One subscriber per group per partition: a Subscribe with an older epoch is refused.
            member = part.group_subscribers.check(req.consumer) if group else None
            offset = self._start_offset(req, part)
            stop = self._stop_offset(req, part)
        except ApiError as err:
            await _abort(context, err)
        if stop != _WAIT_FOREVER and stop < offset:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"Stop offset is before start offset: {stop} < {offset}"
            )
        if member is not None and part.group_subscribers.replace(member):
            # As Liftbridge, the replaced subscription is closed before this one's reader opens
            # (so even if that fails below); a waiting one wakes now and ends.
            part.notify()
        try:
            if part.paused and offset <= part.hw:
                # Liftbridge closes a paused partition's log. A reader starting at a committed offset
                # opens a segment and fails at once; one starting past the high watermark (an empty
                # partition, NEW_ONLY) opens nothing, so the handshake goes out and the first read
                # finds the log closed: FAILED_PRECONDITION in the loop below.
                await context.abort(grpc.StatusCode.INTERNAL, PAUSED_SUBSCRIBE)
            yield _HANDSHAKE
            log_ = part.log
            repl = part.replication
            while True:
                if member is not None and member.closed:
                    return  # replaced by another subscriber of its group: Liftbridge ends it with OK
                if part.deleted:
                    await context.abort(grpc.StatusCode.NOT_FOUND, COMMIT_LOG_DELETED)
                if part.paused:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, COMMIT_LOG_CLOSED)
                if repl is None:
                    newest = log_.newest_offset
                else:
                    # This broker's own replica, up to the high watermark (a stalled broker sends nothing).
                    await cluster.until_running(self.broker)  # type: ignore[union-attr]
                    view = repl.readable(self.broker.id)
                    if view is None or (view_leader(part, self.broker) != self.broker.id and not req.readISRReplica):
                        await _abort(
                            context, ApiError(grpc.StatusCode.FAILED_PRECONDITION, "Server not partition leader")
                        )
                    log_, newest = view
                if offset <= newest:
                    if offset < log_.oldest_offset:
                        offset = log_.oldest_offset
                        if stop != _WAIT_FOREVER and stop < offset:
                            # Liftbridge ends a subscription on the message whose offset equals the
                            # stop offset; retention removed that one, so it reads on past it for good.
                            stop = _WAIT_FOREVER
                    limit = newest if stop == _WAIT_FOREVER else min(newest, stop)
                    if offset <= limit:
                        batch = log_.read(offset, min(_READ_BATCH, limit - offset + 1))
                        if member is None:
                            for body in batch:
                                yield body
                        else:
                            # A group subscription stops at the next message once replaced.
                            for body in batch:
                                if member.closed:
                                    return
                                yield body
                        offset += len(batch)
                        if offset - 1 == stop:
                            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "Stop offset reached")
                        continue
                if part.readonly:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition")
                await part.wait_change()
        finally:
            if member is not None:
                part.group_subscribers.release(member)
