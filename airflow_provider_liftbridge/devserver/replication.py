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

What is simplified: replication runs in-process (no NATS replication subjects, no fetch requests
on the wire, no Raft: the metadata changes happen at once); a follower learns the leader's high
watermark at once rather than on its next fetch; the fetch loop wakes on every leader write
instead of sleeping ``replica.max.idle.wait``. See docs/devserver.md.

"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .log import PartitionLog
from .model import BrokerSlot, ClusterTimings, CommitCallback
from .partition import Partition

log = logging.getLogger(__name__)

_FETCH_BATCH = 4096


class Replica:
    """One broker's copy of a partition: its log, the last leader epoch it knew, and what the
    leader knows about it (when it last fetched, when it was last caught up)."""

    __slots__ = ("broker", "epoch", "last_caught_up", "last_seen", "log", "task", "wakeup")

    def __init__(self, broker: BrokerSlot, log_: PartitionLog, epoch: int) -> None:
        self.broker = broker
        self.log = log_
        self.epoch = epoch
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
        """Whether this replica's broker is running and not stalled."""
        return self.broker.live and not self.broker.stalled


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
        for bid, plog in logs.items():
            broker = cluster.broker_by_id(bid)
            assert broker is not None, bid
            self.replicas[bid] = Replica(broker, plog, (replica_epochs or {}).get(bid, epoch))
        self.epoch = epoch
        self.epoch_starts = list(epoch_starts or [(epoch, 0)])
        # What every ISR member has (after a restart, what they all wrote counts as committed).
        in_sync = [self.replicas[b].log.newest_offset for b in part.isr if b in self.replicas]
        self.hw = min(in_sync) if in_sync else part.log.newest_offset
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
    def leader_serving(self) -> bool:
        """Whether the partition has a leader that is running and not stalled."""
        rep = self.replicas.get(self.part.leader)
        return rep is not None and rep.serving

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
        copy up to the high watermark), or ``None`` when that broker holds no replica."""
        rep = self.replicas.get(broker_id)
        if rep is None:
            return None
        if self.cluster.hw_unknown:
            return rep.log, -1
        return rep.log, min(self.hw, rep.log.newest_offset)

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
        """Move the high watermark to the last offset every ISR member has (never backwards within
        a leader epoch), then send the ALL acks it covers and wake subscribers."""
        if self.cluster.hw_unknown:
            return
        leader = self.leader
        if leader is None:
            return
        isr = self.part.isr
        if len(isr) < self.min_isr():
            return  # Liftbridge's commit loop: below the minimum ISR nothing commits
        newest = leader.log.newest_offset
        for bid in isr:
            rep = self.replicas.get(bid)
            if rep is not None and rep is not leader:
                newest = min(newest, rep.log.newest_offset)
        if newest <= self.hw and not self._waiting:
            return
        if newest > self.hw:
            self.hw = newest
        waiting = self._waiting
        if waiting and waiting[0][0] <= self.hw:
            now = time.time_ns()
            while waiting and waiting[0][0] <= self.hw:
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
            paused = self.cluster.fetch_paused_until - time.monotonic()
            if paused > 0:
                await asyncio.sleep(paused)  # lost NATS: Liftbridge's follower sleeps before fetching again
                continue
            if rep.id != self.part.leader and rep.serving and self.leader_serving:
                try:
                    copied = self.fetch(rep)
                except Exception:
                    log.exception("replicating %s/%d to %s failed", self.part.stream.name, self.part.id, rep.id)
                    copied = 0
                if copied:
                    continue
            try:
                await asyncio.wait_for(wakeup.wait(), idle)
            except TimeoutError:
                pass  # check in with the leader anyway, as Liftbridge's followers do

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
        if rep.log.newest_offset >= leader.log.newest_offset:
            rep.last_caught_up = now
            if rep.id not in self.part.isr and rep.id in self.part.replicas:
                self.cluster.expand_isr(self, rep)
        if copied:
            cfg = self.part.stream.config
            if cfg.retention_max_messages or cfg.retention_max_bytes:
                rep.log.enforce_retention(max_messages=cfg.retention_max_messages, max_bytes=cfg.retention_max_bytes)
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
        """Make ``new`` the leader in a new epoch starting at its log end; followers restart."""
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
        # The new leader commits what every ISR member has (never less than before).
        self.hw = min(self.hw, new.log.newest_offset)
        self.start_followers()
        self.update_hw()

    def close(self) -> None:
        self.stop_followers()
        self._waiting.clear()
        for rep in self.replicas.values():
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
