"""Cluster mode: the ways a real Liftbridge cluster is less kind than a single process, modelled
from what was observed on a three-broker v1.9 cluster and from Liftbridge's source
(``liftbridge-semantics.md``, "Observed on a real three-broker cluster"):

- **A hung broker carries out what it received.** A SIGSTOPped broker keeps its connections open
  and answers nothing; what a client sent it sits in its socket buffer and is carried out when the
  process runs again, even if the client cancelled the call and closed the channel meanwhile.
  :func:`carried_out` does that for a unary call, :class:`HeldRequests` for the requests of a
  PublishAsync stream (up to :data:`HELD_BYTES`, a socket buffer's worth).
- **One broker is the metadata (Raft) leader** (:class:`MetadataLeader`). While it is stalled or
  dead, metadata changes (create, delete, pause, read-only; ISR changes and partition leader
  elections) wait; after ``metadata_election_timeout`` the running brokers elect another one (the
  lowest index), and the old one comes back as a follower.
- **FetchMetadata surveys the brokers** (Liftbridge's ``fetchBrokerInfo``): unless the answering
  broker's broker list is younger than ``metadata_cache_max_age``, it asks every peer over NATS and
  waits for all of them, until the caller's deadline (5 s without one). A stalled peer makes it hang
  that long; it then answers with the brokers that replied.
- **A new stream reaches the brokers one by one** (:class:`StreamPropagation`): Liftbridge applies
  CreateStream on the metadata leader and waits (best effort) for the partition leaders to start
  their partitions, so those know it at once; the other brokers (the one that forwarded the call
  included) apply the committed Raft entry themselves once they learn of the commit, which the
  leader tells them within Raft's commit timeout (``stream_propagation`` seconds here). A metadata
  leader frozen before that has told no one: the others learn it when it runs again or when a new
  leader is elected. Until then they answer "no such stream" (publish), NOT_FOUND (subscribe,
  partition metadata) and UNKNOWN_STREAM (metadata).

What is simplified is listed in docs/devserver.md ("What cluster mode still simplifies").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

import grpc

from .model import BrokerSlot, ClusterTimings

log = logging.getLogger(__name__)

T = TypeVar("T")

#: How much of a PublishAsync stream a stalled broker holds (its socket buffer): beyond this the
#: broker stops reading and HTTP/2 flow control holds the client.
HELD_BYTES = 256 * 1024
#: How long Liftbridge's broker survey waits when the caller set no deadline (``defaultPropagateTimeout``).
SURVEY_TIMEOUT = 5.0
#: Name prefix of the task that holds a call for a stalled broker (tests count them by it).
HELD_TASK_PREFIX = "held by stalled"


class FaultCluster(Protocol):
    """What the fault models ask of the cluster (:class:`~.cluster.Cluster`)."""

    timings: ClusterTimings
    #: The brokers' processes are gone (the server stopped or the cluster restarted).
    stopped: bool

    async def until_running(self, broker: BrokerSlot) -> None: ...


def _gone(cluster: FaultCluster, broker: BrokerSlot) -> bool:
    """Whether what stalled ``broker`` held is lost: it was killed while stalled, or its whole
    cluster stopped or restarted (the slot is reused by the new process, which never got it)."""
    return cluster.stopped or not broker.live


def _log_failure(task: asyncio.Task[object]) -> None:
    """Done callback of work carried out after the caller left: nobody else reads its outcome."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("work carried out after a stall failed: %r", task.exception())


async def carried_out(cluster: FaultCluster, broker: BrokerSlot, call: Callable[[], Awaitable[T]]) -> T:
    """Run ``call`` once ``broker`` runs (at once when it is not stalled).

    The work is detached from the caller: if the call is cancelled while the broker is stalled (the
    client's deadline, a cancel, a closed channel), it is still carried out when the broker resumes,
    as a SIGSTOPped process reads its socket buffer on SIGCONT. A broker killed meanwhile does
    nothing, nor does one whose whole cluster was restarted meanwhile (the work is dropped, never
    run on the stopped brokers' closed logs, and its waiter ends).

    :raises asyncio.CancelledError: the broker was killed (or its cluster restarted) before it resumed.
    """
    if not broker.stalled:
        return await call()

    async def when_resumed() -> T:
        await cluster.until_running(broker)
        if _gone(cluster, broker):
            raise asyncio.CancelledError("the broker died while stalled")
        return await call()

    task = asyncio.get_running_loop().create_task(when_resumed(), name=f"{HELD_TASK_PREFIX} {broker.id}")
    task.add_done_callback(_log_failure)
    return await asyncio.shield(task)


def frozen_gate(cluster: FaultCluster, broker: BrokerSlot, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """``handler`` as served by a broker that can be stalled: a unary call to a stalled broker is
    carried out when it resumes (:func:`carried_out`), a server-streaming one starts then;
    PublishAsync (client streaming) is left as it is, it holds what it receives itself
    (:class:`HeldRequests`)."""
    if handler.request_streaming:
        return handler
    opts = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def gated_unary(req: Any, context: Any) -> Any:
            return await carried_out(cluster, broker, lambda: unary(req, context))

        return grpc.unary_unary_rpc_method_handler(gated_unary, **opts)
    streaming = handler.unary_stream
    assert streaming is not None

    async def gated_stream(req: Any, context: Any) -> AsyncIterator[Any]:
        await cluster.until_running(broker)
        async for item in streaming(req, context):
            yield item

    return grpc.unary_stream_rpc_method_handler(gated_stream, **opts)


def parked(queue: list[Callable[[], None]], work: Callable[[], T]) -> asyncio.Future[T]:
    """``work`` put off until a stalled partition leader runs again (``queue`` is its parked work,
    what its NATS buffer holds): the future gets the result or the exception, and the work runs
    whether or not anyone still awaits the future."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody may read it

    def late() -> None:
        try:
            result = work()
        except Exception as exc:
            if not future.done():
                future.set_exception(exc)
            return
        if not future.done():
            future.set_result(result)

    queue.append(late)
    return future


class HeldRequests:
    """The requests of one PublishAsync call that a stalled broker received but has not read.

    While the broker is stalled (and until what it holds is carried out), requests are queued in
    arrival order; they are carried out when it resumes, whether or not the call is still open.
    Beyond :data:`HELD_BYTES` the reader stops taking requests (the client is held by flow control).
    """

    __slots__ = ("_broker", "_bytes", "_cluster", "_queue", "_task")

    def __init__(self, cluster: FaultCluster, broker: BrokerSlot) -> None:
        self._cluster = cluster
        self._broker = broker
        self._queue: deque[Callable[[], Awaitable[None]]] = deque()
        self._bytes = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def holding(self) -> bool:
        """Whether a new request must queue (the broker is stalled, or held requests go first)."""
        return self._broker.stalled or self._task is not None

    async def add(self, size: int, work: Callable[[], Awaitable[None]]) -> None:
        """Queue ``work`` (a request of ``size`` bytes); return at once unless the buffer is full."""
        self._queue.append(work)
        self._bytes += size
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._carry_out())
            self._task.add_done_callback(_log_failure)
        if self._bytes >= HELD_BYTES:
            await asyncio.shield(self._task)  # a cancelled reader leaves the held work running

    async def finished(self) -> None:
        """Return once every held request has been carried out (at once when none is held)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def _carry_out(self) -> None:
        try:
            await self._cluster.until_running(self._broker)
            while self._queue:
                if _gone(self._cluster, self._broker):
                    self._queue.clear()  # killed while stalled: what it held is gone
                    break
                await self._queue.popleft()()
        finally:
            self._bytes = 0
            self._task = None


class MetadataLeader:
    """Which broker is the metadata (Raft) leader, and waiting for one that serves.

    :param cluster: the cluster (its timings, and waiting for a stalled broker).
    :param brokers: the cluster's brokers.
    """

    def __init__(self, cluster: FaultCluster, brokers: list[BrokerSlot]) -> None:
        self._cluster = cluster
        self._brokers = brokers
        #: Index of the metadata leader (broker 0 when the cluster starts).
        self.index = 0
        self._election: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()
        #: Monotonic time each broker last surveyed the others (its broker list cache).
        self._surveyed: dict[int, float] = {}
        #: Monotonic time since when no metadata leader has run (``None`` while one runs).
        self.down_since: float | None = None

    @property
    def broker(self) -> BrokerSlot:
        return self._brokers[self.index]

    @property
    def available(self) -> bool:
        """Whether the metadata leader runs (metadata changes go through)."""
        b = self.broker
        return b.live and not b.stalled and not b.isolated

    async def until_available(self) -> None:
        """Return once a metadata leader runs: the stalled one resumed, or another was elected."""
        while not self.available:
            self._changed.clear()
            await self._changed.wait()

    def _wake(self) -> None:
        self._track()
        self._changed.set()

    def _track(self) -> None:
        """Note when the metadata leader stopped running (or clear it: one runs)."""
        if self.available:
            self.down_since = None
        elif self.down_since is None:
            self.down_since = time.monotonic()

    def move_to(self, index: int) -> None:
        """Make broker ``index`` the metadata leader at once (a test hook, and a controlled stop).

        :raises IndexError: no such broker.
        """
        self._brokers[index]  # noqa: B018  # IndexError for a bad index
        if index != self.index:
            log.warning("metadata leadership moves from broker %d to broker %d", self.index, index)
        self.index = index
        self._cancel_election()
        self._wake()

    def broker_lost(self, broker: BrokerSlot, *, controlled: bool) -> None:
        """``broker`` stalled, died or stopped: a controlled stop hands leadership over at once, a
        fault after ``metadata_election_timeout`` (if it is not back by then)."""
        if broker.index != self.index:
            return
        self._track()
        if controlled:
            self._elect()
            return
        if self._election is None:
            delay = self._cluster.timings.metadata_election_timeout
            self._election = asyncio.get_running_loop().call_later(delay, self._elect)

    def broker_back(self, broker: BrokerSlot) -> None:
        """``broker`` runs again: still the leader if no election happened meanwhile."""
        if broker.index == self.index:
            self._cancel_election()
        self._wake()

    def _cancel_election(self) -> None:
        if self._election is not None:
            self._election.cancel()
            self._election = None

    def _elect(self) -> None:
        self._election = None
        running = [b for b in self._brokers if b.live and not b.stalled and not b.isolated]
        if running and running[0].index != self.index:
            self.move_to(running[0].index)

    def close(self) -> None:
        self._cancel_election()

    async def survey(self, broker: BrokerSlot, time_remaining: float | None) -> None:
        """What FetchMetadata on ``broker`` waits for: unless its broker list is younger than
        ``metadata_cache_max_age``, every peer's answer, so a stalled peer holds it until the
        caller's deadline (or :data:`SURVEY_TIMEOUT`) or until the peer resumes."""
        now = time.monotonic()
        last = self._surveyed.get(broker.index)
        if last is not None and now - last <= self._cluster.timings.metadata_cache_max_age:
            return
        # A peer cut off from the others (or this broker cut off) cannot answer over NATS either.
        silent = [
            b for b in self._brokers if b is not broker and b.live and (b.stalled or b.isolated or broker.isolated)
        ]
        if not silent:
            self._surveyed[broker.index] = now
            return
        limit = SURVEY_TIMEOUT if time_remaining is None else time_remaining
        waits = asyncio.gather(*(self._answered(broker, b) for b in silent))
        try:
            await asyncio.wait_for(waits, limit)
        except TimeoutError:
            pass  # answered with the brokers that replied
        finally:
            # Liftbridge caches what the survey gathered even when the caller's deadline ended it
            # (its answer then comes too late): the next FetchMetadata on this broker is quick.
            self._surveyed[broker.index] = time.monotonic()

    async def _answered(self, asking: BrokerSlot, peer: BrokerSlot) -> None:
        """Return once ``peer`` can answer ``asking``: no cut between them, and ``peer`` runs."""
        while (peer.isolated or asking.isolated) and not self._cluster.stopped:
            await asyncio.sleep(0.05)  # a cut heals by a fault hook, with no event to wait on
        await self._cluster.until_running(peer)


class StreamPropagation:
    """Which brokers already know a just-created stream.

    The brokers other than those that know it at once apply the CreateStream entry of the metadata
    (Raft) log themselves, ``delay`` seconds after creation: the leader tells them of the commit
    with its next replication round (hashicorp/raft's ``CommitTimeout``, 50 ms by default, which
    Liftbridge keeps). If the metadata leader stopped running before then, nobody has told them:
    they apply it once a metadata leader runs again (the thawed one, or a newly elected one, whose
    first entry of its term commits everything before it).

    :param delay: seconds after creation until every broker knows it (0: at once).
    :param metadata: the metadata leader (whether one runs, and since when none has).
    """

    def __init__(self, delay: float, metadata: MetadataLeader) -> None:
        self.delay = delay
        self._metadata = metadata
        #: Stream name -> (monotonic time every broker knows it, ids of the brokers that know it already).
        self._fresh: dict[str, tuple[float, frozenset[str]]] = {}

    def created(self, name: str, known_by: Iterable[str]) -> None:
        """``name`` was just created; the brokers ``known_by`` know it at once."""
        if self.delay > 0:
            self._fresh[name] = (time.monotonic() + self.delay, frozenset(known_by))

    def forget(self, name: str) -> None:
        """``name`` was deleted."""
        self._fresh.pop(name, None)

    def known(self, name: str, broker_id: str) -> bool:
        """Whether broker ``broker_id`` knows stream ``name`` yet (any stream not just created: yes)."""
        entry = self._fresh.get(name)
        if entry is None:
            return True
        until, known_by = entry
        if broker_id in known_by:
            return True
        if time.monotonic() < until:
            return False
        down = self._metadata.down_since
        if down is not None and down < until:
            return False  # the leader froze before telling the others of the commit
        del self._fresh[name]
        return True
