"""Cluster mode: a replica of each partition per broker, followers fetching from the leader, the ISR,
the high watermark, leader election and the restart window of a real Liftbridge cluster.

Only a server with more than one broker has any of this (``Partition.replication`` is ``None`` on a
single broker, whose only log is committed as soon as it is written).

The model follows Liftbridge's replication protocol (its ``partition.go`` and ``replicator.go``,
and what was observed on a three-broker cluster, ``liftbridge-semantics.md``):

- Every replica is its own :class:`~.log.PartitionLog`. The leader appends what publishers send;
  each follower runs a fetch loop that copies the records it does not have from the leader's log
  (same offsets, same bytes, same timestamps) and then waits for the leader's next write.
- ``high_watermark`` is the last offset every ISR member has; ``newest_offset`` is the end of the
  leader's log and can be ahead. Subscribers read up to the high watermark only; acks with policy
  ALL go out when the high watermark reaches the message, LEADER acks once the leader wrote it.
- While the ISR is smaller than the minimum ISR (the stream's ``minIsr``, else the server's
  ``min.insync.replicas``) nothing commits: the leader still appends and LEADER acks still go out,
  but the high watermark stands still (Liftbridge's commit loop, source).
- A follower that has not fetched, or not caught up with the leader's log end, for
  ``replica_max_lag_time`` leaves the ISR; it rejoins once it is caught up again.
- A leader that is dead or stalled for ``replica_max_leader_timeout`` is replaced by a live ISR
  member (the lowest broker index: Liftbridge's choice is not specified). Each leadership starts a
  new leader epoch at the new leader's log end; a replica that followed an older epoch cuts its log
  back to where that epoch ended in the new leader's history before fetching again, so an
  uncommitted tail the new leader never had is lost, as in Liftbridge.

- Every replica knows its own high watermark (:attr:`Replica.hw`), as every Liftbridge log does:
  the leader's is the committed one (metadata reports it, and it bounds what subscribers read on
  the leader); a follower takes the leader's from the answer to its fetch, and that answer carries
  the high watermark from before the fetch counted (Liftbridge's commit loop runs apart from the
  replication answer), so a follower is one fetch behind. The leader counts a follower's offset
  only as its fetch requests report it (:attr:`Replica.offset`), -1 until the first fetch of a
  leadership, as Liftbridge's ISR map starts.
- Every ``hw_checkpoint_interval`` (and on a clean stop) each running broker writes its replicas'
  high watermarks to ``replication-offset-checkpoint`` in the replica's directory (Liftbridge's
  commit log). A killed broker comes back with those values; a full-cluster restart reads them.
- A newly elected leader starts from the high watermark it knew as a follower, and commits more
  only once its followers fetch from it. A leader killed and back before the leader timeout
  starts from its checkpoint, and its followers, whose fetches failed meanwhile, fetch from it
  again only ``replica_max_idle_wait`` after it is back (Liftbridge's follower sleeps
  ``replica.max.idle.wait`` less up to 2 s of jitter after a failed fetch): until then its high
  watermark, what it reports and what its subscribers read, stays at the checkpoint.

What is simplified: replication runs in-process (no NATS replication subjects, no fetch requests
on the wire, no Raft: the metadata changes happen at once); the fetch loop of a caught-up follower
wakes on every leader write and otherwise checks in every ``replica_max_lag_time / 3`` instead of
``replica.max.idle.wait`` less jitter; after a leader's restart its followers wait exactly
``replica_max_idle_wait`` (on Liftbridge it depends on where their sleep was when it died).
See docs/devserver.md.

"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .isolation import travel
from .log import PartitionLog
from .model import BrokerLink, BrokerSlot, ClusterTimings, CommitCallback
from .partition import Partition

log = logging.getLogger(__name__)

_FETCH_BATCH = 4096
#: The file in a replica's directory holding its checkpointed high watermark (Liftbridge's name).
HW_CHECKPOINT_FILE = "replication-offset-checkpoint"


def read_hw_checkpoint(log_: PartitionLog) -> int | None:
    """The high watermark checkpointed in ``log_``'s directory; ``None`` when there is none."""
    try:
        return int((log_.directory / HW_CHECKPOINT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def write_hw_checkpoint(log_: PartitionLog, hw: int) -> None:
    """Write ``hw`` to ``log_``'s checkpoint file atomically (a failure is logged, not raised)."""
    path = log_.directory / HW_CHECKPOINT_FILE
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(str(hw))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot checkpoint the high watermark in %s: %s", log_.directory, exc)


class Replica:
    """One broker's copy of a partition: its log, the last leader epoch it knew, the high
    watermark it knows and last checkpointed, and what the leader knows about it (the offset its
    last fetch reported, when it last fetched, when it was last caught up)."""

    __slots__ = (
        "broker",
        "checkpoint",
        "epoch",
        "hw",
        "last_caught_up",
        "last_seen",
        "log",
        "offset",
        "task",
        "wakeup",
    )

    def __init__(self, broker: BrokerSlot, log_: PartitionLog, epoch: int, hw: int, checkpoint: int | None) -> None:
        self.broker = broker
        self.log = log_
        self.epoch = epoch
        #: The high watermark this replica knows (the leader's is the partition's).
        self.hw = hw
        #: The last high watermark checkpointed (what the broker comes back with after a kill;
        #: ``None``: none yet, it comes back with -1 as Liftbridge without the file).
        self.checkpoint = checkpoint
        #: The newest offset this replica's last fetch reported to the current leader (-1: none yet).
        self.offset = -1
        now = time.monotonic()
        self.last_seen = now
        self.last_caught_up = now
        self.task: asyncio.Task[None] | None = None
        self.wakeup: asyncio.Event | None = None

    @property
    def id(self) -> str:
        return self.broker.id

    @property
    def serving(self) -> bool:
        """Whether this replica's broker runs for its peers: running, not stalled, not cut off from
        them (an isolated broker still answers its clients, isolation.py)."""
        b = self.broker
        return b.live and not b.stalled and not b.isolated


class ReplicationCluster(Protocol):
    """What a partition's replication asks of the cluster (:class:`~.cluster.Cluster`)."""

    timings: ClusterTimings
    idle_wait: float
    #: Monotonic time before which followers do not fetch (they lost NATS: ``replica.max.idle.wait``).
    fetch_paused_until: float

    @property
    def hw_unknown(self) -> bool: ...

    @property
    def no_leaders(self) -> bool: ...

    def kick_commit(self, repl: Replication) -> None: ...

    def expand_isr(self, repl: Replication, rep: Replica) -> None: ...

    def broker_by_id(self, broker_id: str) -> BrokerSlot | None: ...


class Replication:
    """The replicas of one partition and the state the leader keeps about them (see the module docstring).

    :param part: the partition (its ``leader``, ``replicas`` and ``isr`` lists are the metadata).
    :param cluster: the cluster the partition belongs to.
    :param logs: one open log per replica broker id.
    :param epoch: the current leader epoch.
    :param epoch_starts: first offset of every leader epoch, oldest first.
    :param replica_epochs: the last epoch each replica followed or led.
    """

    def __init__(
        self,
        part: Partition,
        cluster: ReplicationCluster,
        logs: dict[str, PartitionLog],
        *,
        epoch: int = 0,
        epoch_starts: list[tuple[int, int]] | None = None,
        replica_epochs: dict[str, int] | None = None,
    ) -> None:
        self.part = part
        self.cluster = cluster
        self.replicas: dict[str, Replica] = {}
        # Without a checkpoint (a data directory of an earlier dev server) a replica starts from
        # what every ISR member has.
        in_sync = [logs[b].newest_offset for b in part.isr if b in logs]
        fallback = min(in_sync) if in_sync else part.log.newest_offset
        for bid, plog in logs.items():
            broker = cluster.broker_by_id(bid)
            assert broker is not None, bid
            saved = read_hw_checkpoint(plog)
            self.replicas[bid] = Replica(
                broker, plog, (replica_epochs or {}).get(bid, epoch), fallback if saved is None else saved, saved
            )
        self.epoch = epoch
        self.epoch_starts = list(epoch_starts or [(epoch, 0)])
        #: Monotonic time before which followers do not fetch from this partition's leader (it was
        #: killed and came back: their failed fetch sends them to sleep, see :meth:`leader_restarted`).
        self.fetch_resume_at = 0.0
        #: ALL acks waiting for the high watermark: (offset, callback, argument), in offset order.
        self._waiting: deque[tuple[int, CommitCallback, Any]] = deque()
        #: Monotonic time the leader was found dead or stalled (None while it serves).
        self.leader_down_since: float | None = None
        #: Work held for a stalled leader (NATS messages it would find buffered on resuming).
        self.parked: list[Callable[[], None]] = []

    # -- views ------------------------------------------------------------------
    @property
    def leader(self) -> Replica | None:
        return self.replicas.get(self.part.leader)

    @property
    def hw(self) -> int:
        """The partition's high watermark: its leader replica's (-1 without one)."""
        rep = self.replicas.get(self.part.leader)
        return -1 if rep is None else rep.hw

    @property
    def leader_serving(self) -> bool:
        """Whether the partition has a leader that is running and not stalled."""
        rep = self.replicas.get(self.part.leader)
        return rep is not None and rep.serving

    @property
    def leader_broker(self) -> BrokerSlot | None:
        rep = self.replicas.get(self.part.leader)
        return None if rep is None else rep.broker

    @property
    def leader_link(self) -> BrokerLink | None:
        """The leader's cut link (isolation.py); ``None`` while it has none."""
        rep = self.replicas.get(self.part.leader)
        return None if rep is None else rep.broker.link

    @property
    def leader_live(self) -> bool:
        rep = self.replicas.get(self.part.leader)
        return rep is not None and rep.broker.live

    @property
    def leader_stalled(self) -> bool:
        rep = self.replicas.get(self.part.leader)
        return rep is not None and rep.broker.live and rep.broker.stalled

    @property
    def no_leaders(self) -> bool:
        """The cluster's restart window: partitions have no leader yet."""
        return self.cluster.no_leaders

    def replica_logs(self) -> list[PartitionLog]:
        """Every replica's log (the leader's among them)."""
        return [rep.log for rep in self.replicas.values()]

    def reported_hw(self) -> int:
        """The high watermark as metadata shows it (-1 while a restart has not settled)."""
        return -1 if self.cluster.hw_unknown else self.hw

    def readable(self, broker_id: str) -> tuple[PartitionLog, int] | None:
        """The log a subscriber on ``broker_id`` reads and the last offset it may read (its replica's
        copy up to the high watermark that replica knows: the leader's is the partition's), or
        ``None`` when that broker holds no replica."""
        rep = self.replicas.get(broker_id)
        if rep is None:
            return None
        if self.cluster.hw_unknown:
            return rep.log, -1
        return rep.log, min(rep.hw, rep.log.newest_offset)

    def local_hw(self, broker_id: str) -> tuple[PartitionLog, int] | None:
        """``broker_id``'s replica log and the high watermark that replica knows (not hidden by the
        restart window: what Liftbridge's ``log.HighWatermark()`` returns), or ``None``."""
        rep = self.replicas.get(broker_id)
        return None if rep is None else (rep.log, min(rep.hw, rep.log.newest_offset))

    def min_isr(self) -> int:
        return self.part.stream.config.min_isr or self.cluster.timings.min_insync_replicas

    # -- commit -----------------------------------------------------------------
    def after_hw(self, offset: int, callback: CommitCallback, arg: Any) -> None:
        """Call ``callback(arg, commit_timestamp_ns)`` once the high watermark reaches ``offset``
        (an ack with policy ALL). Dropped if leadership changes first: the publisher times out."""
        self._waiting.append((offset, callback, arg))
        self.cluster.kick_commit(self)

    def leader_wrote(self) -> None:
        """The leader's log grew: wake the followers, and commit if the ISR is the leader alone."""
        for rep in self.replicas.values():
            if rep.wakeup is not None:
                rep.wakeup.set()
        self.update_hw()

    def update_hw(self) -> None:
        """Move the leader's high watermark to the last offset every ISR member reported having
        (never backwards), then send the ALL acks it covers and wake subscribers (Liftbridge's
        commit loop). A leader that does not run commits nothing."""
        if self.cluster.hw_unknown:
            return
        leader = self.leader
        if leader is None or not leader.serving:
            return
        isr = self.part.isr
        if len(isr) < self.min_isr():
            return  # Liftbridge's commit loop: below the minimum ISR nothing commits
        newest = leader.log.newest_offset
        for bid in isr:
            rep = self.replicas.get(bid)
            if rep is not None and rep is not leader:
                newest = min(newest, rep.offset)
        hw = leader.hw
        if newest <= hw and not self._waiting:
            return
        if newest > hw:
            leader.hw = hw = newest
        waiting = self._waiting
        if waiting and waiting[0][0] <= hw:
            now = time.time_ns()
            while waiting and waiting[0][0] <= hw:
                _, fn, arg = waiting.popleft()
                try:
                    fn(arg, now)
                except Exception:  # one broken consumer of acks must not stop the others
                    log.exception("ALL-ack callback failed")
        self.part.notify()

    def drop_waiting(self) -> None:
        """Forget the ALL acks not sent yet (leadership moved: Liftbridge drops its commit queue)."""
        self._waiting.clear()

    # -- followers --------------------------------------------------------------
    def start_followers(self) -> None:
        """Run a fetch loop for every replica that is not the leader (idempotent)."""
        loop = asyncio.get_running_loop()
        for rep in self.replicas.values():
            if rep.id != self.part.leader and (rep.task is None or rep.task.done()):
                rep.wakeup = asyncio.Event()
                rep.task = loop.create_task(self._follow(rep), name=f"follow {self.part.stream.name}/{self.part.id}")

    def stop_followers(self) -> None:
        for rep in self.replicas.values():
            if rep.task is not None:
                rep.task.cancel()
                rep.task = None
            rep.wakeup = None

    async def _follow(self, rep: Replica) -> None:
        """A follower's fetch loop: copy what the leader has, then wait for its next write."""
        idle = self.cluster.idle_wait
        while not self.part.deleted:
            wakeup = rep.wakeup
            if wakeup is None:
                return
            wakeup.clear()
            paused = max(self.cluster.fetch_paused_until, self.fetch_resume_at) - time.monotonic()
            if paused > 0:
                await asyncio.sleep(paused)  # lost NATS: Liftbridge's follower sleeps before fetching again
                continue
            if self._fetching(rep):
                copied = await self._round(rep)
                if copied:
                    continue
            try:
                await asyncio.wait_for(wakeup.wait(), idle)
            except TimeoutError:
                pass  # check in with the leader anyway, as Liftbridge's followers do

    def _fetching(self, rep: Replica) -> bool:
        """Whether ``rep`` fetches from the leader now: a follower that runs (cut off or not: its
        link decides what arrives), of a leader that serves."""
        b = rep.broker
        return rep.id != self.part.leader and b.live and not b.stalled and self.leader_serving

    async def _round(self, rep: Replica) -> int:
        """One fetch of ``rep`` over its broker's and the leader's NATS links (isolation.py): the
        request may be lost, or arrive and be counted with its answer lost (a follower cut in);
        on a slow link it comes late. Return how many records it copied."""
        leader = self.leader
        assert leader is not None
        request = travel(((rep.broker, "out"), (leader.broker, "in")))
        if request is None:
            return 0
        answer = travel(((leader.broker, "out"), (rep.broker, "in")))
        if request or answer:
            await asyncio.sleep(request + (answer or 0.0))
            if not self._fetching(rep) or self.leader is not leader:
                return 0
        try:
            if answer is None:
                self.requested(rep)
                return 0
            return self.fetch(rep)
        except Exception:
            log.exception("replicating %s/%d to %s failed", self.part.stream.name, self.part.id, rep.id)
            return 0

    def requested(self, rep: Replica) -> None:
        """A fetch request of ``rep`` reached the leader and its answer was lost: the leader counts
        the request (unless it is of an older leader epoch: Liftbridge drops those)."""
        leader = self.leader
        if leader is None or leader is rep or rep.epoch != self.epoch:
            return
        now = rep.last_seen = time.monotonic()
        rep.offset = rep.log.newest_offset
        if rep.log.newest_offset >= leader.log.newest_offset:
            rep.last_caught_up = now
            if rep.id not in self.part.isr and rep.id in self.part.replicas:
                self.cluster.expand_isr(self, rep)
        if rep.id in self.part.isr:
            self.update_hw()

    def fetch(self, rep: Replica, max_batches: int = 1) -> int:
        """One fetch of ``rep`` from the leader (truncating first if it followed an older epoch);
        return how many records it copied. The leader notes the fetch for the ISR check."""
        leader = self.leader
        if leader is None or leader is rep:
            return 0
        if rep.epoch != self.epoch:
            self.truncate_to_epoch(rep)
        now = time.monotonic()
        rep.last_seen = now
        # The request reports the follower's log end; the answer carries the leader's high
        # watermark as it is before this request is counted (Liftbridge commits apart from answering).
        rep.offset = rep.log.newest_offset
        answer_hw = leader.hw
        copied = 0
        for _ in range(max_batches):
            start = rep.log.next_offset
            if start > leader.log.newest_offset:
                break
            if start < leader.log.oldest_offset:
                # Retention removed what this replica still needs: it cannot catch up (a simplification;
                # Liftbridge would truncate it and fetch from the leader's oldest offset) and leaves the ISR.
                break
            bodies, stamps = leader.log.read_copies(start, _FETCH_BATCH)
            if not bodies:
                break
            rep.log.extend_copied(start, bodies, stamps)
            rep.log.flush()
            copied += len(bodies)
        if answer_hw > rep.hw:
            rep.hw = answer_hw
            self.part.notify()  # subscribers reading this follower's copy
        if rep.log.newest_offset >= leader.log.newest_offset:
            rep.last_caught_up = now
            if rep.id not in self.part.isr and rep.id in self.part.replicas:
                self.cluster.expand_isr(self, rep)
        if rep.id in self.part.isr:
            self.update_hw()
        return copied

    def truncate_to_epoch(self, rep: Replica) -> None:
        """Cut ``rep``'s log back to where its last epoch ended in the leader's history (what the
        current leader has of that epoch), then make it a follower of the current epoch."""
        end = self.epoch_end(rep.epoch)
        if end is not None and rep.log.next_offset > end:
            rep.log.flush()  # a former leader's last appends, if any are still buffered, go with the tail
            cut = rep.log.truncate(end)
            if cut:
                log.warning(
                    "replica %s of %s/%d dropped %d records the leader never committed",
                    rep.id,
                    self.part.stream.name,
                    self.part.id,
                    cut,
                )
        rep.epoch = self.epoch

    def epoch_end(self, epoch: int) -> int | None:
        """The first offset after leader epoch ``epoch`` in the current leader's history (``None``
        for the current epoch: nothing to cut)."""
        for e, start in self.epoch_starts:
            if e > epoch:
                return start
        return None

    # -- leadership -------------------------------------------------------------
    def become_leader(self, new: Replica) -> None:
        """Make ``new`` the leader in a new epoch starting at its log end, from the high watermark
        it knew as a follower; it knows nothing of its followers' offsets yet; followers restart."""
        self.stop_followers()
        self.drop_waiting()
        self.epoch += 1
        self.epoch_starts.append((self.epoch, new.log.next_offset))
        new.epoch = self.epoch
        self.part.leader = new.id
        self.part.log = new.log
        self.leader_down_since = None
        self.parked.clear()
        for rep in self.replicas.values():
            if rep is not new and rep.serving:
                self.truncate_to_epoch(rep)
            now = time.monotonic()
            rep.last_seen = rep.last_caught_up = now
            rep.offset = -1
        self.fetch_resume_at = 0.0
        self.start_followers()
        self.update_hw()

    def leader_restarted(self, refetch_after: float) -> None:
        """The leader's broker was killed and serves again, still leader: a new process, which
        knows none of its followers' offsets; they fetch from it again ``refetch_after`` seconds
        from now (their fetches failed while it was gone). Its high watermark is its checkpoint
        (:meth:`broker_killed`) until then."""
        leader = self.leader
        now = time.monotonic()
        for rep in self.replicas.values():
            if rep is not leader:
                rep.offset = -1
                rep.last_seen = rep.last_caught_up = now  # Liftbridge's replicators start afresh
        self.fetch_resume_at = now + refetch_after
        self.start_followers()

    # -- high watermark checkpoints ---------------------------------------------
    def checkpoint(self, broker_id: str) -> None:
        """``broker_id`` checkpoints the high watermark its replica knows (written when it changed)."""
        rep = self.replicas.get(broker_id)
        if rep is not None and rep.checkpoint != rep.hw and not self.part.deleted:
            rep.checkpoint = rep.hw
            write_hw_checkpoint(rep.log, rep.hw)

    def broker_killed(self, broker_id: str) -> None:
        """``broker_id``'s process died: its replica's high watermark is what it checkpointed last."""
        rep = self.replicas.get(broker_id)
        if rep is not None:
            rep.hw = -1 if rep.checkpoint is None else rep.checkpoint

    def close(self) -> None:
        """A clean stop: every running replica checkpoints its high watermark, the logs close."""
        self.stop_followers()
        self._waiting.clear()
        for rep in self.replicas.values():
            if not rep.log.closed:
                self.checkpoint(rep.id)  # a killed broker's is unchanged: nothing to write
            rep.log.close()

    def destroy(self) -> None:
        self.stop_followers()
        self._waiting.clear()
        for rep in self.replicas.values():
            rep.log.destroy()

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "epoch_starts": [list(e) for e in self.epoch_starts],
            "replica_epochs": {bid: rep.epoch for bid, rep in self.replicas.items()},
        }
