"""The cluster-wide side of replication: broker faults, the ISR and leader checks, the restart
window (see :mod:`.replication` for the model and what is simplified).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from .cursors import CursorIndex
from .faults import MetadataLeader, StreamPropagation
from .isolation import remember
from .log import PartitionLog
from .model import LOST_TO_PEERS, SLOW_DELAY, BrokerLink, BrokerSlot, ClusterTimings, RestartHold
from .partition import Partition, Stream
from .replication import Replica, Replication

#: The internal cursors stream (``cursors_stream.CURSORS_STREAM``, which imports the store).
CURSORS_STREAM = "__cursors"

log = logging.getLogger(__name__)


class ClusterStore(Protocol):
    """What the cluster asks of the store (:class:`~.state.Store`)."""

    streams: dict[str, Stream]
    brokers: list[BrokerSlot]
    cursors: CursorIndex

    def save(self) -> None: ...

    def leadership_moved(self, part: Partition) -> None: ...

    def broker_by_id(self, broker_id: str) -> BrokerSlot | None: ...


def replication_of(part: Partition) -> Replication:
    """``part``'s replication with its whole interface (the partition itself sees it as a
    :class:`~.partition.PartitionReplication`); only for partitions of a cluster."""
    repl = part.replication
    assert isinstance(repl, Replication), part
    return repl


class Cluster:
    """The cluster-wide side of replication: broker faults, the ISR and leader checks, the restart window.

    :param store: the server's state (its brokers and streams).
    :param timings: time-outs and the minimum ISR.
    """

    def __init__(self, store: ClusterStore, timings: ClusterTimings) -> None:
        self.store = store
        self.timings = timings
        #: How often the leader checks its followers and followers check their leader.
        self.tick = max(0.01, min(timings.replica_max_lag_time, timings.replica_max_leader_timeout) / 4)
        #: How long a caught-up follower waits before checking in with the leader.
        self.idle_wait = max(0.01, timings.replica_max_lag_time / 3)
        self._task: asyncio.Task[None] | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        self._window_end: asyncio.TimerHandle | None = None
        self._commit_kicks: dict[Replication, None] = {}
        self._kick_handle: asyncio.Handle | None = None
        #: Monotonic time of the last full-cluster restart (the restart window runs from it).
        self.restarted_at: float | None = None
        #: While not None, the restart window reads as this long after the restart (a test hook:
        #: :meth:`hold_restart_window`); it runs on from there when released.
        self._window_held_at: float | None = None
        self._resumed: dict[int, asyncio.Event] = {}
        #: Followers fetch again only after this (monotonic): see :meth:`nats_lost`.
        self.fetch_paused_until = 0.0
        #: The metadata (Raft) leader: metadata changes wait while it does not run (faults.py).
        self.metadata = MetadataLeader(self, store.brokers)
        #: Which brokers know a just-created stream (faults.py).
        self.propagation = StreamPropagation(timings.stream_propagation, self.metadata)
        #: Set by :meth:`stop`: these brokers' processes are gone (the server stops, or the whole
        #: cluster restarts with new ones), and with them whatever a stalled broker held.
        self.stopped = False

    async def until_running(self, broker: BrokerSlot) -> None:
        """Return once ``broker`` is not stalled (at once when it is not), or once this cluster
        stopped (:attr:`stopped`: the caller must then drop what it held, see ``faults.py``)."""
        while broker.stalled and not self.stopped:
            event = self._resumed.get(broker.index)
            if event is None:
                event = self._resumed[broker.index] = asyncio.Event()
            await event.wait()

    # -- restart window ---------------------------------------------------------
    def _since_restart(self) -> float | None:
        if self.restarted_at is None:
            return None
        if self._window_held_at is not None:
            return self._window_held_at
        elapsed = time.monotonic() - self.restarted_at
        if elapsed >= self.timings.restart_hw_unknown:
            self.restarted_at = None
            return None
        return elapsed

    @property
    def no_streams(self) -> bool:
        """FetchMetadata lists no streams; partition lookups answer NOT_FOUND."""
        e = self._since_restart()
        return e is not None and e < self.timings.restart_no_streams

    @property
    def no_leaders(self) -> bool:
        """Partitions have no leader yet; Publish answers "no such stream"."""
        e = self._since_restart()
        return e is not None and e < self.timings.restart_no_leaders

    @property
    def hw_unknown(self) -> bool:
        """High watermarks read -1 and nothing commits."""
        return self._since_restart() is not None

    def begin_restart_window(self, hold: RestartHold | None = None) -> None:
        """Start the restart window; with ``hold`` it stays at the start of that phase until
        :meth:`release_restart_window`: ``"no-leaders"`` (streams listed, no partition leader) or
        ``"no-commits"`` (leaders elected, high watermarks -1, nothing commits)."""
        self.restarted_at = time.monotonic()
        if hold is not None:
            phases = {"no-leaders": self.timings.restart_no_streams, "no-commits": self.timings.restart_no_leaders}
            if hold not in phases:
                raise ValueError(f"hold must be one of {sorted(phases)}, got {hold!r}")
            self._window_held_at = phases[hold]

    def release_restart_window(self) -> None:
        """Let a held restart window run on from where it was held (nothing when none is held)."""
        held, self._window_held_at = self._window_held_at, None
        if held is None or self.restarted_at is None:
            return
        self.restarted_at = time.monotonic() - held
        if self._task is not None and self._window_end is None:  # started: settle it when it ends
            remaining = self.timings.restart_hw_unknown - held
            self._window_end = asyncio.get_running_loop().call_later(max(0.0, remaining), self._restart_settled)

    # -- running ----------------------------------------------------------------
    def attach(self, part: Partition, logs: dict[str, PartitionLog], saved: Mapping[str, Any]) -> None:
        """Give ``part`` its replicas (one open log per replica broker) and the epochs ``saved`` holds."""
        part.replication = Replication(
            part,
            self,
            logs,
            epoch=int(saved.get("epoch", 0)),
            epoch_starts=[(int(e), int(o)) for e, o in saved.get("epoch_starts", [])] or None,
            replica_epochs={str(b): int(e) for b, e in saved.get("replica_epochs", {}).items()},
        )

    def start(self) -> None:
        """Start the followers' fetch loops and the periodic checks (on the running loop)."""
        for part in self.partitions():
            if not part.paused:
                replication_of(part).start_followers()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._monitor(), name="cluster monitor")
        self._checkpoints = loop.create_task(self._checkpoint_loop(), name="high watermark checkpoints")
        if self.restarted_at is not None and self._window_held_at is None:
            remaining = self.restarted_at + self.timings.restart_hw_unknown - time.monotonic()
            self._window_end = loop.call_later(max(0.0, remaining), self._restart_settled)

    def _restart_settled(self) -> None:
        """The restart window is over: commit what the ISRs have and wake who waits for it."""
        self._window_end = None
        self.restarted_at = None
        for part in self.partitions():
            replication_of(part).update_hw()
            part.notify()  # subscribers that waited with a high watermark of -1

    def stop(self) -> None:
        """Stop the checks and the followers; wake every wait for a stalled broker, which then
        finds the cluster stopped. (The broker slots outlive a restart and read running again
        then, but the new cluster's brokers are other processes: what a stalled one held before
        the restart is lost, never carried out on this cluster's closed logs.)"""
        self.stopped = True
        resumed, self._resumed = self._resumed, {}
        for event in resumed.values():
            event.set()
        self.metadata.close()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._checkpoints is not None:
            self._checkpoints.cancel()
            self._checkpoints = None
        if self._window_end is not None:
            self._window_end.cancel()
            self._window_end = None
        if self._kick_handle is not None:
            self._kick_handle.cancel()
            self._kick_handle = None
        for part in self.partitions():
            replication_of(part).stop_followers()

    def nats_lost(self) -> None:
        """The brokers lost their NATS connection: as Liftbridge's followers do, they fetch again
        only ``replica_max_idle_wait`` later, so commits and ALL acks stall meanwhile."""
        wait = self.timings.replica_max_idle_wait
        log.warning("NATS connection lost: followers fetch again in %g s (replica.max.idle.wait)", wait)
        self.fetch_paused_until = time.monotonic() + wait

    def broker_by_id(self, broker_id: str) -> BrokerSlot | None:
        return self.store.broker_by_id(broker_id)

    def partitions(self) -> list[Partition]:
        return [p for s in self.store.streams.values() for p in s.partitions if p.replication is not None]

    def kick_commit(self, repl: Replication) -> None:
        """Re-check ``repl``'s high watermark at the end of this loop turn."""
        self._commit_kicks[repl] = None
        if self._kick_handle is None:
            self._kick_handle = asyncio.get_running_loop().call_soon(self._run_kicks)

    def _run_kicks(self) -> None:
        self._kick_handle = None
        kicks, self._commit_kicks = self._commit_kicks, {}
        for repl in kicks:
            repl.update_hw()

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            try:
                self.check()
            except Exception:
                log.exception("cluster check failed")

    async def _checkpoint_loop(self) -> None:
        while True:
            await asyncio.sleep(self.timings.hw_checkpoint_interval)
            try:
                self.checkpoint_all()
            except Exception:
                log.exception("checkpointing high watermarks failed")

    def checkpoint_all(self) -> None:
        """Every running broker checkpoints the high watermarks of its replicas (Liftbridge's
        ``checkpointHWLoop``, one per log; a stalled process's ticker does not run)."""
        running = [b.id for b in self.store.brokers if b.live and not b.stalled]
        for part in self.partitions():
            repl = replication_of(part)
            for bid in running:
                repl.checkpoint(bid)

    def check(self) -> None:
        """Shrink the ISR of followers that fell behind; replace leaders that are gone too long.
        Both are metadata changes: they wait while no metadata leader runs."""
        if not self.metadata.available:
            return
        now = time.monotonic()
        lag = self.timings.replica_max_lag_time
        changed = False
        for part in self.partitions():
            repl = replication_of(part)
            leader = repl.leader
            if leader is None or not leader.serving:
                if repl.leader_down_since is None:
                    repl.leader_down_since = now
                elif now - repl.leader_down_since >= self.timings.replica_max_leader_timeout:
                    changed |= self._elect(part, repl)
                continue
            repl.leader_down_since = None
            for bid in list(part.isr):
                rep = repl.replicas.get(bid)
                if rep is None or rep is leader:
                    continue
                if now - rep.last_seen > lag or now - rep.last_caught_up > lag:
                    log.warning("replica %s of %s/%d fell behind; removed from the ISR", bid, part.stream.name, part.id)
                    part.isr.remove(bid)
                    changed = True
                    repl.update_hw()  # fewer members may commit more
        if changed:
            self.store.save()

    def _elect(self, part: Partition, repl: Replication) -> bool:
        candidates = [
            repl.replicas[b]
            for b in sorted(part.isr, key=lambda b: repl.replicas[b].broker.index if b in repl.replicas else 1 << 30)
            if b in repl.replicas and b != part.leader and repl.replicas[b].serving
        ]
        if not candidates:
            return False  # no live ISR member: the partition stays without a usable leader
        old = part.leader
        new = candidates[0]
        if old in part.isr:
            part.isr.remove(old)
        log.warning("leader %s of %s/%d is gone; %s leads now", old, part.stream.name, part.id, new.id)
        self._lead(part, repl, new)
        return True

    def _lead(self, part: Partition, repl: Replication, new: Replica) -> None:
        """Make ``new`` the leader of ``part``; a broker that becomes leader of a ``__cursors``
        partition forgets the cursors it cached (Liftbridge's ``BecomePartitionLeader``)."""
        repl.become_leader(new)
        if part.stream.name == CURSORS_STREAM:
            self.store.cursors.purge(new.id)
        self.store.leadership_moved(part)

    def expand_isr(self, repl: Replication, rep: Replica) -> None:
        part = repl.part
        part.isr.append(rep.id)
        part.isr.sort(key=lambda b: part.replicas.index(b) if b in part.replicas else len(part.replicas))
        self.store.save()
        part.notify()

    # -- broker faults ----------------------------------------------------------
    def broker_stopped(self, broker: BrokerSlot, *, controlled: bool) -> None:
        """``broker`` stopped serving. A controlled stop hands its leaderships over at once (after
        the new leader caught up) and leaves the ISRs; a kill leaves everything to the time-outs."""
        self.metadata.broker_lost(broker, controlled=controlled)
        if not controlled:
            for part in self.partitions():
                repl = replication_of(part)
                repl.broker_killed(broker.id)  # its replicas' high watermarks: the last checkpoint
                if part.leader == broker.id and repl.leader_down_since is None:
                    repl.leader_down_since = time.monotonic()
            return
        for part in self.partitions():
            replication_of(part).checkpoint(broker.id)  # a clean stop writes the checkpoint
        changed = False
        for part in self.partitions():
            repl = replication_of(part)
            if broker.id in part.isr and part.leader != broker.id:
                part.isr.remove(broker.id)
                changed = True
                repl.update_hw()
            if part.leader == broker.id:
                candidates = [
                    r for r in repl.replicas.values() if r.id in part.isr and r is not repl.leader and r.serving
                ]
                if not candidates:
                    continue
                new = min(candidates, key=lambda r: r.broker.index)
                # A controlled shutdown lets the successor catch up before it takes over.
                while repl.fetch(new, max_batches=64):
                    pass
                part.isr.remove(broker.id)
                self._lead(part, repl, new)
                changed = True
        if changed:
            self.store.save()

    def broker_started(self, broker: BrokerSlot) -> None:
        """``broker`` serves again, a new process: its replicas catch up (cut back first if
        leadership moved) and rejoin; it has no cursors cached. Partitions it still leads start
        from its checkpointed high watermarks, and their followers fetch from it again only
        ``replica_max_idle_wait`` later (:meth:`~.replication.Replication.leader_restarted`)."""
        self.metadata.broker_back(broker)
        self.store.cursors.purge(broker.id)
        for part in self.partitions():
            repl = replication_of(part)
            rep = repl.replicas.get(broker.id)
            if rep is None:
                continue
            if part.leader == broker.id:
                repl.leader_down_since = None
                repl.leader_restarted(self.timings.replica_max_idle_wait)
                continue
            rep.last_seen = rep.last_caught_up = time.monotonic()
            if repl.leader_serving:
                while repl.fetch(rep, max_batches=64):
                    pass
            repl.start_followers()

    def broker_stalled(self, broker: BrokerSlot) -> None:
        """``broker`` freezes (like SIGSTOP): it stops fetching, serving fetches and answering calls."""
        broker.stalled = True
        self._lost(broker)

    def broker_isolated(self, broker: BrokerSlot, how: str, kind: str = "cut") -> None:
        """``broker`` is cut off from its peers (``how``: ``"nats"``, from NATS and so from them;
        ``"peers"``, from them only) and still answers its clients (isolation.py). ``kind`` says
        what happens to its NATS messages (:data:`~.model.KINDS`). Cut both ways or one way,
        its peers treat it as gone (its leaderships move after the leader timeout, it leaves the
        ISRs after the lag time, the metadata leadership after the election timeout) and, unless
        cut out only, it keeps the view it has now. Slow or lossy, its peers keep it.

        :raises ValueError: ``how`` or ``kind`` is not one of :data:`~.model.ISOLATIONS` /
            :data:`~.model.KINDS`.
        """
        link = BrokerLink(how, kind, delay=min(SLOW_DELAY, self.timings.replica_max_lag_time / 8))
        if broker.link is not None:
            self.broker_rejoined(broker)  # one cut at a time: the new one replaces the old
        remember(broker, self.partitions())
        broker.link = link
        if kind in LOST_TO_PEERS:
            broker.isolated = how
            self._lost(broker)

    def _lost(self, broker: BrokerSlot) -> None:
        """Its peers lose ``broker`` without a word: the metadata leader counts it gone, and the
        leader timeout of each partition it leads starts now."""
        self.metadata.broker_lost(broker, controlled=False)
        now = time.monotonic()
        for part in self.partitions():
            repl = replication_of(part)
            if part.leader == broker.id and repl.leader_down_since is None:
                repl.leader_down_since = now

    def broker_rejoined(self, broker: BrokerSlot) -> None:
        """The cut of ``broker`` healed: it learns the metadata; a former leader cuts back the tail
        the new leader never had and follows; followers of what it still leads fetch again."""
        broker.isolated, broker.known, broker.link = "", {}, None
        self.metadata.broker_back(broker)
        for part in self.partitions():
            repl = replication_of(part)
            if part.leader == broker.id:
                repl.leader_down_since = None
            for rep in repl.replicas.values():
                if (part.leader == broker.id or rep.broker is broker) and rep.wakeup is not None:
                    rep.wakeup.set()
            repl.start_followers()
            repl.update_hw()
            part.notify()

    def history_replaced(self, part: Partition, broker: BrokerSlot, keep_to: int) -> int:
        """A test hook, a model of Liftbridge v1.9.0-72's wrong truncation (docs/devserver.md, "A
        replaced history"): ``broker``'s replica of ``part``, a running follower, cuts its log after
        offset ``keep_to`` (its fallback to a lagging high watermark), committed records included,
        and is elected leader at once, in a new epoch starting after ``keep_to``. The other replicas
        follow its history, so they cut back there too. Returns how many records its log lost.

        :raises ValueError: ``broker`` holds no replica of ``part``, leads it, or is not running.
        """
        repl = replication_of(part)
        rep = repl.replicas.get(broker.id)
        if rep is None or part.leader == broker.id or not rep.serving:
            raise ValueError(
                f"broker {broker.index} must be a running follower of {part.stream.name}/{part.id} "
                f"(replicas {part.replicas}, leader {part.leader})"
            )
        rep.log.flush()
        cut = rep.log.truncate(keep_to + 1)
        if broker.id not in part.isr:
            part.isr.append(broker.id)
        log.warning("replica %s of %s/%d cut %d records and leads now", broker.id, part.stream.name, part.id, cut)
        self._lead(part, repl, rep)
        for other in repl.replicas.values():  # no replica knows a high watermark past its own log now
            other.hw = min(other.hw, other.log.newest_offset)
        self.store.save()
        part.notify()
        return cut

    def broker_resumed(self, broker: BrokerSlot) -> None:
        """A stalled broker runs again: parked work of partitions it still leads goes through."""
        broker.stalled = False
        event = self._resumed.pop(broker.index, None)
        if event is not None:
            event.set()
        self.metadata.broker_back(broker)
        for part in self.partitions():
            repl = replication_of(part)
            if part.leader == broker.id:
                repl.leader_down_since = None
                parked, repl.parked = repl.parked, []
                for work in parked:
                    work()
            rep = repl.replicas.get(broker.id)
            if rep is not None and rep.wakeup is not None:
                rep.wakeup.set()
            part.notify()
