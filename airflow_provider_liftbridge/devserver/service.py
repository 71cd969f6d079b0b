"""The ``proto.API`` gRPC service of one broker, served by ``grpc.aio`` or by the ``h2`` transport (``grpc_h2``).

Handlers are registered by hand (not through the generated ``add_APIServicer_to_server``)
so that hot responses can be sent as bytes already serialized: subscribers get the
stored ``Message`` bytes straight from the log, and PublishAsync acks are framed
without building a ``PublishResponse`` object.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from grpc import aio
from nats.nuid import NUID

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.codec import encode_message

from .cursors_stream import check_cursor_owner, read_cursor, write_cursor
from .errors import ApiError, ExpectedOffsetRefused
from .faults import HeldRequests, frozen_gate, parked
from .groups import ConsumerGroups, GroupsApi
from .isolation import ack_route, arriving, knows, publish_route, view_leader, view_metadata
from .model import BrokerSlot, CommitCallback, is_valid_subject
from .partition import Partition
from .publish_async import AsyncSession
from .state import ASYNC_BAD_REQUEST, ASYNC_INCORRECT_OFFSET, ASYNC_NOT_FOUND, ASYNC_READONLY, Store
from .subscribe import SubscribeApi
from .wire import async_error_bytes, build_ack

if TYPE_CHECKING:
    from .nats_ingest import NatsIngest

log = logging.getLogger(__name__)

_NONE = api_pb2.NONE
_ALL = api_pb2.ALL
#: How long a PublishAsync call waits for outstanding acks after the client half-closes (as the real server).
ASYNC_ACK_TIMEOUT = 5.0
_EMPTY_PUBLISH_RESPONSE = b""
#: The gRPC service name of the API (paths are ``/proto.API/<Method>``).
SERVICE = "proto.API"


def _serialize(msg: Any) -> bytes:
    return msg if isinstance(msg, bytes) else msg.SerializeToString()


class _Inboxes:
    """Made-up ack inboxes, shaped like the real server's (``liftbridge-default.ack.<nuid>``)."""

    def __init__(self) -> None:
        self._nuid = NUID()

    def next(self) -> str:
        return "liftbridge-default.ack." + self._nuid.next().decode()


def _resolve(fut: asyncio.Future[int], commit_ts: int) -> None:
    if not fut.done():
        fut.set_result(commit_ts)


async def _abort(context: aio.ServicerContext[Any, Any], err: ApiError) -> NoReturn:
    await context.abort(err.code, err.message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


class ApiService:
    """The API as served by one broker of the dev server.

    The methods take a ``grpc.aio.ServicerContext`` or, on the ``h2`` transport, a
    :class:`~airflow_provider_liftbridge.devserver.grpc_h2.H2ServicerContext` (the same subset of it).

    :param store: the shared state.
    :param ingest: the NATS side (acks to inboxes, PublishToSubject).
    :param broker: which broker this service answers for (leadership checks).
    :param groups: the consumer groups shared by all brokers (default: a new set, for a lone broker).
    """

    def __init__(
        self,
        store: Store,
        ingest: NatsIngest,
        broker: BrokerSlot,
        groups: ConsumerGroups | None = None,
    ) -> None:
        self.store = store
        self.ingest = ingest
        self.broker = broker
        self._inboxes = _Inboxes()
        # Consumer groups (groups.py): the four group RPCs and the groups part of FetchMetadata.
        self.groups = groups if groups is not None else ConsumerGroups(store)
        self._groups_api = GroupsApi(self.groups, broker)
        self._subscribe_api = SubscribeApi(store, broker, self._knows)

    def handler(self) -> grpc.GenericRpcHandler:
        """The generic handler to add to a ``grpc.aio`` server."""
        return grpc.method_handlers_generic_handler(SERVICE, self.method_handlers())

    def method_handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """Every method of ``proto.API`` by name, for either transport (``grpc.aio`` or ``grpc_h2``)."""
        u, s = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler
        handlers: dict[str, grpc.RpcMethodHandler] = {}

        def add(name: str, make: Callable[..., grpc.RpcMethodHandler], fn: Callable[..., Any], req: Any) -> None:
            handlers[name] = make(fn, request_deserializer=req.FromString, response_serializer=_serialize)

        add("CreateStream", u, self.CreateStream, api_pb2.CreateStreamRequest)
        add("DeleteStream", u, self.DeleteStream, api_pb2.DeleteStreamRequest)
        add("PauseStream", u, self.PauseStream, api_pb2.PauseStreamRequest)
        add("SetStreamReadonly", u, self.SetStreamReadonly, api_pb2.SetStreamReadonlyRequest)
        add("Subscribe", s, self._subscribe_api.Subscribe, api_pb2.SubscribeRequest)
        add("FetchMetadata", u, self.FetchMetadata, api_pb2.FetchMetadataRequest)
        add("FetchPartitionMetadata", u, self.FetchPartitionMetadata, api_pb2.FetchPartitionMetadataRequest)
        add("Publish", u, self.Publish, api_pb2.PublishRequest)
        add("PublishAsync", grpc.stream_stream_rpc_method_handler, self.PublishAsync, api_pb2.PublishRequest)
        add("PublishToSubject", u, self.PublishToSubject, api_pb2.PublishToSubjectRequest)
        add("SetCursor", u, self.SetCursor, api_pb2.SetCursorRequest)
        add("FetchCursor", u, self.FetchCursor, api_pb2.FetchCursorRequest)
        groups = self._groups_api
        add("JoinConsumerGroup", u, groups.JoinConsumerGroup, api_pb2.JoinConsumerGroupRequest)
        add("LeaveConsumerGroup", u, groups.LeaveConsumerGroup, api_pb2.LeaveConsumerGroupRequest)
        add(
            "FetchConsumerGroupAssignments",
            u,
            groups.FetchConsumerGroupAssignments,
            api_pb2.FetchConsumerGroupAssignmentsRequest,
        )
        add(
            "ReportConsumerGroupCoordinator",
            u,
            groups.ReportConsumerGroupCoordinator,
            api_pb2.ReportConsumerGroupCoordinatorRequest,
        )
        if self.store.cluster is not None:
            # A stalled broker answers nothing, and carries out what it received when it resumes.
            handlers = {name: frozen_gate(self.store.cluster, self.broker, h) for name, h in handlers.items()}
        return handlers

    async def _call(self, context: aio.ServicerContext[Any, Any], action: Callable[[], Awaitable[Any]]) -> Any:
        """Run a metadata change (once a metadata leader runs, in cluster mode); an ApiError aborts the call."""
        cluster = self.store.cluster
        if cluster is not None:
            await cluster.metadata.until_available()
        try:
            return await action()
        except ApiError as err:
            await _abort(context, err)

    def _knows(self, stream: str) -> bool:
        """Whether this broker knows ``stream`` yet (a just-created one reaches the others later)."""
        cluster = self.store.cluster
        return cluster is None or (cluster.propagation.known(stream, self.broker.id) and knows(self.broker, stream))

    # -- admin ----------------------------------------------------------------
    async def CreateStream(self, req: api_pb2.CreateStreamRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        stream = await self._call(context, lambda: self.store.create_stream(req))
        cluster = self.store.cluster
        if cluster is not None:
            # Applied on the metadata leader, which waits for the partition leaders (faults.py).
            leaders = {part.leader for part in stream.partitions}
            cluster.propagation.created(req.name, leaders | {cluster.metadata.broker.id})
        return api_pb2.CreateStreamResponse()

    async def DeleteStream(self, req: api_pb2.DeleteStreamRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        await self._call(context, lambda: self.store.delete_stream(req.name))
        if self.store.cluster is not None:
            self.store.cluster.propagation.forget(req.name)
        return api_pb2.DeleteStreamResponse()

    async def PauseStream(self, req: api_pb2.PauseStreamRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        if not req.partitions and req.name not in self.store.streams:
            await _abort(context, ApiError(grpc.StatusCode.NOT_FOUND, "stream not found"))
        await self._call(context, lambda: self.store.pause(req.name, req.partitions, req.resumeAll))
        return api_pb2.PauseStreamResponse()

    async def SetStreamReadonly(
        self, req: api_pb2.SetStreamReadonlyRequest, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        if not req.partitions and req.name not in self.store.streams:
            await _abort(context, ApiError(grpc.StatusCode.NOT_FOUND, "stream not found"))
        await self._call(context, lambda: self.store.set_readonly(req.name, req.partitions, req.readonly))
        return api_pb2.SetStreamReadonlyResponse()

    # -- metadata -------------------------------------------------------------
    async def FetchMetadata(self, req: api_pb2.FetchMetadataRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        store = self.store
        cluster = store.cluster
        # Right after a full-cluster restart the real brokers answer with no streams, then with
        # partitions that have no leader yet (docs/devserver.md, "Restart window").
        no_streams = cluster is not None and cluster.no_streams
        no_leaders = cluster is not None and cluster.no_leaders
        if cluster is not None:
            # Liftbridge asks every peer for its address first; a stalled one holds the answer.
            await cluster.metadata.survey(self.broker, context.time_remaining())
        hosted, led = store.leader_counts()
        resp = api_pb2.FetchMetadataResponse()
        for b in store.live_brokers():
            resp.brokers.add(
                id=b.id,
                host=b.host,
                port=b.port,
                partitionCount=hosted.get(b.id, 0),
                leaderCount=0 if no_leaders else led.get(b.id, 0),
            )
        for name in req.streams or ([] if no_streams else [n for n in store.streams if self._knows(n)]):
            stream = None if no_streams or not self._knows(name) else store.streams.get(name)
            if stream is None:
                resp.streamMetadata.add(name=name, error=api_pb2.StreamMetadata.UNKNOWN_STREAM)
                continue
            sm = resp.streamMetadata.add(name=name, subject=stream.subject, creationTimestamp=stream.creation_timestamp)
            for part in stream.partitions:
                pm = sm.partitions[part.id]
                pm.CopyFrom(view_metadata(part, self.broker))
                if no_leaders:
                    pm.leader = ""
                    del pm.isr[:]
        self.groups.fill_metadata(resp, req.groups)
        return resp

    async def FetchPartitionMetadata(
        self, req: api_pb2.FetchPartitionMetadataRequest, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        part = self.store.get_partition(req.stream, req.partition)
        cluster = self.store.cluster
        if part is None or (cluster is not None and (cluster.no_streams or not self._knows(req.stream))):
            await _abort(context, ApiError(grpc.StatusCode.NOT_FOUND, "partition not found"))
        leader = view_leader(part, self.broker)
        if part.paused or leader != self.broker.id or (cluster is not None and cluster.no_leaders):
            # A paused partition is closed on its leader: the real server answers as for a non-leader.
            await _abort(
                context, ApiError(grpc.StatusCode.FAILED_PRECONDITION, "The request should be sent to partition leader")
            )
        return api_pb2.FetchPartitionMetadataResponse(metadata=view_metadata(part, self.broker))

    # -- publishing -----------------------------------------------------------
    def _publish_target(self, req: api_pb2.PublishRequest) -> Partition:
        """The partition a publish goes to, checked as the real server checks it.

        :raises ApiError: with the gRPC code and the PublishAsync code of the refusal.
        """
        if not req.stream:
            raise ApiError(grpc.StatusCode.INVALID_ARGUMENT, "no stream provided", ASYNC_BAD_REQUEST)
        stream = self.store.streams.get(req.stream)
        cluster = self.store.cluster
        if stream is None or (cluster is not None and (cluster.no_leaders or not self._knows(req.stream))):
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"no such stream: {req.stream}", ASYNC_NOT_FOUND)
        if not 0 <= req.partition < len(stream.partitions):
            raise ApiError(grpc.StatusCode.NOT_FOUND, f"no such partition: {req.partition}", ASYNC_NOT_FOUND)
        part = stream.partitions[req.partition]
        if part.readonly:
            raise ApiError(grpc.StatusCode.FAILED_PRECONDITION, f"readonly partition: {req.partition}", ASYNC_READONLY)
        if stream.occ and req.ackPolicy == _NONE:
            raise ApiError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "stream with concurrency control must have AckPolicy set",
                ASYNC_BAD_REQUEST,
            )
        return part

    async def Publish(self, req: api_pb2.PublishRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        try:
            part = self._publish_target(req)
        except ApiError as err:
            await _abort(context, err)
        if part.paused:
            await self.store.resume_for_publish(part)
        inbox = req.ackInbox or self._inboxes.next()
        # Without a deadline the real server does not wait: fire and forget, even with LEADER/ALL.
        wait = req.ackPolicy != _NONE and context.time_remaining() is not None
        repl = part.replication
        now = time.time_ns()
        route, delay = publish_route(part, self.broker)
        try:
            if route == "lost":
                # Nobody takes the partition's messages: the real publish is lost and its ack never comes.
                await self._no_ack(context, wait)
                return _EMPTY_PUBLISH_RESPONSE
            if route == "park" or delay:
                # Forwarded through NATS to a stalled leader, or over a slow link: appended when it
                # arrives (a stalled leader: when it runs again, still leader), whether or not this
                # call is still waiting.
                def take() -> int:
                    return part.append(req.key, req.value, req.headers, part.subject, "", req.expectedOffset, now)

                assert repl is not None
                offset = await (parked(repl.parked, take) if route == "park" else arriving(delay, take))
            else:
                offset = part.append(req.key, req.value, req.headers, part.subject, "", req.expectedOffset, now)
        except ExpectedOffsetRefused:
            if not wait:
                return _EMPTY_PUBLISH_RESPONSE
            if repl is not None and ack_route(part, self.broker) is None:  # the refusal is an ack too
                await self._no_ack(context, wait)
            await context.abort(grpc.StatusCode.UNKNOWN, "incorrect expected offset")
        if not wait:
            return _EMPTY_PUBLISH_RESPONSE
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if repl is not None and req.ackPolicy == _ALL:
            repl.after_hw(offset, _resolve, fut)  # ALL: once the whole ISR has it
        else:
            part.after_commit(_resolve, fut)
        commit_ts = await fut
        late = ack_route(part, self.broker)  # the ack travels from the leader to this broker over NATS
        if late is None:
            await self._no_ack(context, wait)
        elif late:
            await asyncio.sleep(late)
        ack = build_ack(
            part.stream.name,
            part.stream.subject,
            part.subject,
            offset,
            inbox,
            req.correlationId,
            req.ackPolicy,
            now,
            commit_ts,
        )
        if req.ackInbox:
            self.ingest.send_ack(inbox, ack)  # the real server's ack travels through NATS to that inbox
        return api_pb2.PublishResponse(ack=ack)

    @staticmethod
    async def _no_ack(context: aio.ServicerContext[Any, Any], wait: bool) -> None:
        """A publish whose ack never comes: the call ends at its deadline (at once without one)."""
        if wait:
            await asyncio.sleep(max(0.0, context.time_remaining() or 0.0))
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    async def PublishAsync(
        self, requests: AsyncIterator[api_pb2.PublishRequest], context: aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        session = AsyncSession(self._inboxes.next())
        reader = asyncio.get_running_loop().create_task(self._publish_async_reader(requests, session))
        reader.add_done_callback(session.reader_done)
        drain_deadline: float | None = None
        cluster = self.store.cluster
        try:
            while True:
                if cluster is not None and self.broker.stalled:
                    await cluster.until_running(self.broker)  # a frozen process sends nothing
                if session.out:
                    out, session.out = session.out, []
                    for item in out:
                        yield item
                    continue
                if reader.done():
                    if reader.cancelled() or reader.exception() is not None or session.inflight <= 0:
                        break
                    loop_time = asyncio.get_running_loop().time()
                    drain_deadline = drain_deadline or loop_time + ASYNC_ACK_TIMEOUT
                    if loop_time >= drain_deadline:
                        break
                    session.wakeup.clear()
                    try:
                        await asyncio.wait_for(session.wakeup.wait(), drain_deadline - loop_time)
                    except TimeoutError:
                        break
                    continue
                session.wakeup.clear()
                await session.wakeup.wait()
        finally:
            if not reader.done():
                reader.cancel()

    async def _publish_async_reader(
        self, requests: AsyncIterator[api_pb2.PublishRequest], session: AsyncSession
    ) -> None:
        cluster = self.store.cluster
        if cluster is None:
            async for req in requests:
                await self._publish_one(req, session)
            return
        # A stalled broker holds what it received and carries it out when it runs again, even
        # after the call ended (faults.py): the held requests outlive this reader.
        held = HeldRequests(cluster, self.broker)
        async for req in requests:
            if held.holding:
                await held.add(req.ByteSize(), lambda r=req: self._publish_one(r, session))  # type: ignore[misc]
            else:
                await self._publish_one(req, session)
        await held.finished()  # the call stays open while its requests wait for a stalled broker

    async def _publish_one(self, req: api_pb2.PublishRequest, session: AsyncSession) -> None:
        """Take one PublishAsync request: append it, or queue its refusal; its ack goes to ``session``."""
        try:
            part = self._publish_target(req)
        except ApiError as err:
            session.out.append(async_error_bytes(req.correlationId, err.async_code, err.message))
            session.wakeup.set()
            return
        if part.paused:
            await self.store.resume_for_publish(part)
        repl = part.replication
        route, delay = publish_route(part, self.broker)
        if repl is not None and (route != "take" or delay):
            if route != "lost":
                # Forwarded to a stalled leader, or over a slow link: taken when it runs again (and
                # still leads) or arrives, even if the call has ended by then. Counted as owed so
                # the call waits for its ack.
                session.inflight += 1

                def late() -> None:
                    session.inflight -= 1
                    self._take(req, part, session, time.time_ns())

                if route == "park":
                    repl.parked.append(late)
                else:
                    asyncio.get_running_loop().call_later(delay, late)
            return  # a dead leader: lost on the way, no response, the client times out
        self._take(req, part, session, time.time_ns())

    def _take(self, req: api_pb2.PublishRequest, part: Partition, session: AsyncSession, now: int) -> None:
        """Append one PublishAsync request to ``part`` and arrange its ack (or refusal) on ``session``."""
        repl = part.replication
        policy = req.ackPolicy
        try:
            offset = part.append(req.key, req.value, req.headers, part.subject, "", req.expectedOffset, now)
        except ExpectedOffsetRefused:
            # Through the commit queue, so the refusal keeps its place among earlier acks.
            session.inflight += 1
            refused = (
                session.refused if repl is None else functools.partial(self._ack_back, session, part, session.refused)
            )
            part.after_commit(refused, (req.correlationId, ASYNC_INCORRECT_OFFSET, "incorrect expected offset"))
            return
        if policy != _NONE:
            session.inflight += 1
            # Cluster mode: the ack travels from the leader to this broker over NATS (isolation.py).
            done = (
                session.committed
                if repl is None
                else functools.partial(self._ack_back, session, part, session.committed)
            )
            if repl is not None and policy == _ALL:
                repl.after_hw(offset, done, (part, offset, req.correlationId, policy, now))
            else:
                part.after_commit(done, (part, offset, req.correlationId, policy, now))

    def _ack_back(
        self, session: AsyncSession, part: Partition, deliver: CommitCallback, arg: Any, commit_ts: int
    ) -> None:
        """A PublishAsync ack (or refusal) sent by ``part``'s leader: it reaches this broker at once,
        late or never, as the NATS links between say (isolation.py)."""
        late = ack_route(part, self.broker)
        if late is None:
            session.inflight -= 1  # never answered: the client times out
            session.wakeup.set()
        elif late:
            asyncio.get_running_loop().call_later(late, deliver, arg, commit_ts)
        else:
            deliver(arg, commit_ts)

    async def PublishToSubject(
        self, req: api_pb2.PublishToSubjectRequest, context: aio.ServicerContext[Any, Any]
    ) -> Any:
        if not is_valid_subject(req.subject):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Subject is invalid")
        inbox = req.ackInbox or self._inboxes.next()
        msg = api_pb2.Message(
            key=req.key,
            value=req.value,
            subject=req.subject,
            headers=req.headers,
            ackInbox=inbox,
            correlationId=req.correlationId,
            ackPolicy=req.ackPolicy,
        )
        wait = req.ackPolicy != _NONE and context.time_remaining() is not None
        fut = self.ingest.wait_for_ack(inbox) if wait else None
        try:
            await self.ingest.publish(req.subject, encode_message(msg))
            if fut is None:
                return api_pb2.PublishToSubjectResponse()
            # No stream on that subject means no ack: the client's deadline ends the call.
            return api_pb2.PublishToSubjectResponse(ack=await fut)
        finally:
            if fut is not None:
                self.ingest.forget_ack_waiter(inbox, fut)

    # -- cursors --------------------------------------------------------------
    async def SetCursor(self, req: api_pb2.SetCursorRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        owner = await self._check_cursor_request(req, context)
        cursor = (req.cursorId, req.stream, req.partition)
        try:
            await write_cursor(self.store, owner, cursor, req.offset, context.time_remaining())
        except ApiError as err:
            await _abort(context, err)
        return api_pb2.SetCursorResponse()

    async def FetchCursor(self, req: api_pb2.FetchCursorRequest, context: aio.ServicerContext[Any, Any]) -> Any:
        owner = await self._check_cursor_request(req, context)
        cursor = (req.cursorId, req.stream, req.partition)
        return api_pb2.FetchCursorResponse(offset=read_cursor(self.store, self.broker, owner, cursor))

    async def _check_cursor_request(
        self, req: api_pb2.SetCursorRequest | api_pb2.FetchCursorRequest, context: aio.ServicerContext[Any, Any]
    ) -> Partition:
        """Both cursor calls need a stream and a cursor id (INVALID_ARGUMENT, as Liftbridge answers),
        then go to the leader of the ``__cursors`` partition owning the cursor (``cursors_stream.py``),
        which this returns."""
        if not req.stream:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "No stream provided")
        if not req.cursorId:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "No cursorId provided")
        try:
            return check_cursor_owner(self.store, self.broker, req.cursorId, req.stream, req.partition)
        except ApiError as err:
            await _abort(context, err)
