"""The tail reader: reads what a partition holds beyond what this producer has seen, and waits
until reading it is safe, before anything is sent again.

A partition is *settled* for a resumption when a reading shows

- no uncommitted tail: ``newest_offset == high_watermark``, and the high watermark not below one
  read before (a cluster still loading after a restart reads -1 for seconds);
- a newest offset that did not move since the reading ``settle`` seconds before (a record the
  server still held has landed), or, with other producers writing, ``timeout`` seconds of trying;
- no record of this producer arriving from elsewhere for ``quiet`` seconds (a zombie try of the
  same task still writing, or a late copy from a stopped broker); for at most ``zombie_wait``;
- an answer from the broker the records of unknown fate were sent to (it runs again, so it has
  carried out what it held), or proof that it is gone (its port refuses connections): a stopped
  broker delivers what it received when it wakes, even after the client gave up on it.

Between readings it reads the newly committed records (a scan) and notes this producer's
sequence numbers. No sends happen here. See ``docs/exactly-once.md`` and ADR 8.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from airflow_provider_liftbridge._proto import api_pb2

from ..column_subscription import subscribe_stored
from ..diagnostics import probe_port
from ..sync_client import LiftbridgeClient
from ..types import PartitionInfo
from .errors import BrokerStillSilent, LogShorter, ProducerStillWriting, TailNotSettled
from .identity import seq_of
from .state import Found, PartitionState, ProducerState

__all__ = ["Timer", "TailReader", "Waits", "read_producer_records"]

log = logging.getLogger("airflow_provider_liftbridge.client.exactly_once")


@dataclass
class Timer:
    """The clock and the sleep of the waits; a scripted test runs them on a virtual clock."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class Waits:
    """How long the tail reader waits for what (seconds); see :class:`ExactlyOncePublisher`."""

    settle: float = 0.2
    timeout: float = 10.0
    tail_wait: float = 30.0
    quiet: float = 1.0
    zombie_wait: float = 600.0

    @property
    def poll(self) -> float:
        """The pause between two rounds of readings in a wait: ``settle``, or 0.2 s when that is 0."""
        return self.settle if self.settle > 0 else 0.2


@dataclass
class _Watch:
    """One partition's readings during one wait."""

    previous: int | None = None  # the newest offset of the reading before
    arrived_first: float | None = None  # when records of this producer from elsewhere were first seen
    arrived_last: float | None = None  # ... and last seen
    offsets: list[int] = field(default_factory=list)  # their offsets
    duplicates: int = 0
    read: bool = False  # whether the partition has been read once during this wait
    warned: bool = False  # whether waiting for another writer was logged


def read_producer_records(
    client: LiftbridgeClient, stream: str, producer_id: str, partition: int, start: int, stop: int
) -> Iterator[tuple[int, int]]:
    """Yield ``(offset, seq)`` of ``producer_id``'s records in ``partition`` between offsets
    ``start`` and ``stop`` (inclusive). Nothing when ``stop < start``.

    :raises LiftbridgeError: the subscription failed (see ``LiftbridgeClient.subscribe``).
    """
    if stop < start:
        return
    producer = producer_id.encode()
    for message in client.subscribe(stream, partition=partition, start_at=start, stop_at=stop):
        seq = seq_of(message.headers, producer)
        if seq is not None:
            yield message.offset, seq
        if message.offset >= stop:
            return


#: A run of this publisher's own acknowledged records at least this long is not read back: a
#: scan subscribes again after it (a subscription costs about as much as reading this many).
SKIP_OWN_RUN = 64


def unread_ranges(state: PartitionState, stop: int) -> list[tuple[int, int]]:
    """The offsets a scan of a partition reads, from after ``state.scanned_to`` up to ``stop``, as
    inclusive ranges: all of them but the long runs of this publisher's acknowledged records, which
    hold its records and nothing else (an offset holds one record). Between such runs lie the
    records other producers wrote meanwhile."""
    ranges: list[tuple[int, int]] = []
    start = state.scanned_to + 1
    if stop < start:
        return ranges
    for low, high in state.own.runs():
        if high < start:
            continue
        if low > stop:
            break
        if high - max(low, start) + 1 < SKIP_OWN_RUN:
            continue  # read through it
        if low > start:
            ranges.append((start, low - 1))
        start = high + 1
    if start <= stop:
        ranges.append((start, stop))
    return ranges


class TailReader:
    """Reads one stream's partitions for one producer (see module doc).

    :param client: the caller's client (metadata, subscriptions).
    :param stream: the stream.
    :param state: the producer's state, updated by every scan.
    :param waits: the wait bounds.
    :param timer: the clock.
    :param acks_all: the records are sent with ack policy ALL: an offset seen acknowledged or read is
        committed, so a log found ending below it lost committed records (:meth:`check_length`).
    """

    def __init__(
        self,
        client: LiftbridgeClient,
        stream: str,
        state: ProducerState,
        waits: Waits,
        timer: Timer,
        *,
        acks_all: bool = False,
    ) -> None:
        self.client = client
        self.acks_all = acks_all
        self.stream = stream
        self.state = state
        self.waits = waits
        self.timer = timer
        #: Broker id -> (host, port), from the last metadata read (to tell a stopped broker from a dead one).
        self.addresses: dict[str, tuple[str, int]] = {}
        #: Records of this producer that scans found written by someone else while this publisher ran.
        self.arrivals = 0
        self._probed: dict[str, float] = {}  # broker -> when its port was last tried
        #: Whether a reading found a partition led by another broker than before (the client's
        #: routing cache may still name the old one: see ExactlyOncePublisher._recover).
        self.leader_moved = False
        #: How many times a reading found a partition led by another broker than before (a call
        #: that saw it change reads its records again before it returns: :mod:`.recount`).
        self.leader_changes = 0

    def scan(
        self, partition: int, wanted: Container[int], info: PartitionInfo, watch: _Watch | None = None
    ) -> dict[int, int]:
        """Read ``partition`` from after the last scanned offset up to ``info``'s high watermark;
        add this producer's sequence numbers to the seen set. Return ``{seq: offset}`` of the
        ``wanted`` ones found; records of this producer written by someone else go to ``watch``.

        Progress is kept per message, so a scan cut short by a failure continues where it stopped.
        """
        state = self.state.parts[partition]
        found: dict[int, int] = {}
        if self.check_length(partition, info):
            # A new leader truncated records that only the old leader had, acknowledged ones
            # included (ack policy LEADER). Read again from the high watermark; the lost ones cannot
            # be told apart and stay counted as written.
            state.scanned_to = info.high_watermark
        take = self.state.take
        for first, last in unread_ranges(state, info.high_watermark):
            for pb in self.stored(partition, first, last):
                offset = pb.offset
                if offset > state.scanned_to:
                    state.scanned_to = offset
                kind = take(partition, offset, pb.headers, wanted, found)
                if watch is not None and kind in (Found.EARLIER, Found.DUPLICATE):
                    watch.offsets.append(offset)
                    watch.duplicates += kind is Found.DUPLICATE
            state.scanned_to = max(state.scanned_to, last)
        state.scanned_to = max(state.scanned_to, info.high_watermark)
        # Never above what was seen: with optimistic concurrency control, an expected offset past
        # an unread record would let the server store a second copy of it.
        state.next_offset = state.scanned_to + 1
        return found

    def check_length(self, partition: int, info: PartitionInfo) -> bool:
        """Whether ``info`` shows ``partition`` ending below the last offset this publisher read or
        was acknowledged for there (the log is shorter than what it knew of it).

        :raises LogShorter: so, with ack policy ALL: that offset was committed, so the partition
            lost committed records (or a deposed leader answered from its own, shorter, log).
        """
        state = self.state.parts[partition]
        if info.newest_offset >= state.scanned_to:
            return False
        if self.acks_all:
            raise LogShorter(partition, info.newest_offset, state.scanned_to, "newest offset")
        log.warning(
            "Producer %r: stream %r partition %d now ends at offset %d, below offset %d this producer had "
            "seen acknowledged; records acknowledged by the old leader alone were lost (use ack policy ALL)",
            self.state.producer_id,
            self.stream,
            partition,
            info.newest_offset,
            state.scanned_to,
        )
        return True

    def check_acks(self, lows: Mapping[int, int]) -> LogShorter | None:
        """Check acks that put records of this publisher in partitions at offsets from ``lows``
        (partition -> its lowest acknowledged offset), before they are counted.

        :returns: with ack policy ALL, the breach of the first partition whose lowest ack is at or
            below an offset already read or acknowledged there (that offset was committed with
            another record, which is gone); else None. The caller counts every ack, then raises it.
        """
        if not self.acks_all:
            return None
        parts = self.state.parts
        for partition, low in lows.items():
            if low <= parts[partition].scanned_to:
                return LogShorter(partition, low, parts[partition].scanned_to, "ack")
        return None

    def stored(self, partition: int, first: int, last: int) -> Iterator[api_pb2.Message]:
        """The messages of offsets ``first`` to ``last`` as stored: no Message each, since a scan
        looks at two headers only (which compression leaves plain), and after a publish beside
        other producers it reads about as many of their records as this publisher wrote."""
        client = self.client
        return client._transport.drive(
            subscribe_stored(client._core, self.stream, partition=partition, start_at=first, stop_at=last)
        )

    def settle(
        self,
        partitions: Sequence[int],
        wanted: Container[int] = (),
        *,
        history: bool = False,
        observe: float = 0.0,
        suspects: Mapping[int, Iterable[str]] | None = None,
        unreachable_ok: bool = False,
    ) -> dict[int, dict[int, int]]:
        """Wait until each of ``partitions`` has settled (see module doc), reading it meanwhile;
        return ``{partition: {seq: offset}}`` of the ``wanted`` sequence numbers found.

        :param history: the first read's records are an earlier try's, not a writer running now
            (the scan at the start of a try).
        :param observe: read for at least this long (a try resuming an earlier one looks for a
            zombie that is still writing).
        :param suspects: partition -> brokers that may hold records of this partition unread (one
            that got records and stopped answering before acknowledging them; a replica out of the
            ISR when an earlier try's records are in the partition).
        :param unreachable_ok: a suspect whose host does not answer at all counts as gone (for
            the replicas suspected at the start of a try, which may simply be down).
        :raises TailNotSettled: a tail was still uncommitted after ``tail_wait``.
        :raises BrokerStillSilent: a suspect broker neither answered nor went away in ``tail_wait``.
        :raises ProducerStillWriting: records of this producer kept arriving for ``zombie_wait``,
            or were found more than once.
        """
        waits, now = self.waits, self.timer.now
        started = now()
        suspected = {p: set(brokers) for p, brokers in (suspects or {}).items() if brokers}
        watches = {p: _Watch() for p in partitions}
        found: dict[int, dict[int, int]] = {p: {} for p in partitions}
        while True:
            # Every partition is read in every round, and the wait ends only in a round that finds
            # them all settled: a verdict kept while others are waited for goes stale. Seed 59968
            # (docs/reliability.md): a partition settled, then 11 s later, while another was still
            # waited for, an earlier send's records reached its leader late, and they were sent again.
            waiting: list[PartitionInfo] = []
            for p in partitions:
                info = self.client.fetch_partition_metadata(self.stream, p)
                watch, state = watches[p], self.state.parts[p]
                self._note_leader(state, info)
                # A high watermark below one read before is a cluster still loading after a
                # restart (it reads -1 for seconds), not a partition that lost committed records.
                committed = state.hw_seen <= info.high_watermark >= info.newest_offset
                state.hw_seen = max(state.hw_seen, info.high_watermark)
                if state.hw_seen == info.high_watermark:
                    self._read(p, wanted, info, watch, found[p], history=history and not watch.read)
                    watch.read = True
                if not self._ready(p, info, watch, committed, now() - started, observe, suspected, unreachable_ok):
                    watch.previous = info.newest_offset
                    waiting.append(info)
            if not waiting:
                return found
            self._check_bounds(waiting, watches, suspected, now() - started)
            self.timer.sleep(waits.poll)

    def _note_leader(self, state: PartitionState, info: PartitionInfo) -> None:
        if info.leader and info.leader != state.leader:
            if state.leader:
                self.leader_moved = True
                self.leader_changes += 1
            state.leader = info.leader

    def read_between_own(self, partitions: Sequence[int]) -> bool:
        """Read each of ``partitions`` once its high watermark has reached this publisher's last
        acknowledged record there, so every offset between its records is read (ADR 8 rule 5).
        Nothing else is waited for: those offsets are taken, so nothing can land there later.
        Returns whether records of this producer written by someone else were found (the caller
        then watches for ``quiet`` seconds).

        :raises ProducerStillWriting: a sequence number of this producer was found twice.
        :raises TailNotSettled: a high watermark did not reach those records within ``tail_wait``.
        """
        arrived = False

        def ready(p: int, info: PartitionInfo) -> bool:
            state = self.state.parts[p]
            self._note_leader(state, info)
            # Wait while records of ours may still commit (acknowledged by the leader alone), or
            # the high watermark reads below one read before (a cluster still loading). A log
            # that ends below them, all committed, was truncated: the scan says so.
            tail = info.high_watermark < min(state.unread_own, info.newest_offset)
            return not (tail or info.high_watermark < state.hw_seen)

        own = [p for p in partitions if self.state.parts[p].unread_own >= 0]
        for p, info in self.when_committed(own, ready):
            state = self.state.parts[p]
            state.hw_seen = max(state.hw_seen, info.high_watermark)
            watch = _Watch()
            self._read(p, (), info, watch, {}, history=False)
            arrived = arrived or bool(watch.offsets)
        return arrived

    def when_committed(
        self, partitions: Sequence[int], ready: Callable[[int, PartitionInfo], bool]
    ) -> Iterator[tuple[int, PartitionInfo]]:
        """Yield each of ``partitions`` with its metadata as soon as ``ready`` (which may note or
        check the reading, and raise) finds its high watermark where the caller needs it; read the
        others again every ``settle`` seconds.

        :raises TailNotSettled: one was not ready within ``tail_wait``.
        """
        started = self.timer.now()
        left = list(partitions)
        while left:
            behind: list[PartitionInfo] = []
            for p in left:
                info = self.client.fetch_partition_metadata(self.stream, p)
                if ready(p, info):
                    yield p, info
                else:
                    behind.append(info)
            if behind and self.timer.now() - started >= self.waits.tail_wait:
                raise TailNotSettled(
                    max(behind, key=lambda i: i.newest_offset - i.high_watermark), self.waits.tail_wait
                )
            left = [i.id for i in behind]
            if left:
                self.timer.sleep(self.waits.poll)

    def _read(
        self, p: int, wanted: Container[int], info: PartitionInfo, watch: _Watch, found: dict[int, int], *,
        history: bool,
    ) -> None:  # fmt: skip
        """Scan ``p`` up to ``info``'s high watermark; note records of this producer from elsewhere.

        :raises ProducerStillWriting: one of them repeats a sequence number (not in ``history``).
        """
        before = len(watch.offsets)
        found.update(self.scan(p, wanted, info, watch))
        if history:  # an earlier try's records (duplicates among them were logged): the baseline
            watch.offsets.clear()
            watch.duplicates = 0
        elif len(watch.offsets) > before:
            self.arrivals += len(watch.offsets) - before
            at = self.timer.now()
            if watch.arrived_first is None:
                watch.arrived_first = at
            watch.arrived_last = at
            if watch.duplicates:
                raise ProducerStillWriting(p, (watch.offsets[0], watch.offsets[-1]), watch.duplicates, 0.0)

    def _ready(
        self,
        p: int,
        info: PartitionInfo,
        watch: _Watch,
        committed: bool,
        elapsed: float,
        observe: float,
        suspects: dict[int, set[str]],
        unreachable_ok: bool,
    ) -> bool:
        waits = self.waits
        if not committed or elapsed < observe:
            return False
        if watch.arrived_last is not None and self.timer.now() - watch.arrived_last < waits.quiet:
            if not watch.warned:  # this producer's records are still arriving from elsewhere
                watch.warned = True
                log.warning(
                    "Producer %r: records of this producer id are arriving on stream %r partition %d from another "
                    "writer (a zombie try of the same task, or a late copy from a stopped broker); waiting until "
                    "none has come for %g s, at most %g s in all (zombie_wait), before publishing more",
                    self.state.producer_id,
                    self.stream,
                    p,
                    waits.quiet,
                    waits.zombie_wait,
                )
            return False
        brokers = suspects.get(p)
        if brokers:
            brokers.difference_update([b for b in brokers if self._answered(b, info, unreachable_ok)])
            if brokers:
                return False
            watch.previous = None  # they may have delivered just now: see the newest offset hold still
            return False
        return waits.settle <= 0 or watch.previous == info.newest_offset or elapsed >= waits.timeout

    def _answered(self, broker: str, info: PartitionInfo, unreachable_ok: bool) -> bool:
        """Whether ``broker`` has carried out what it held: it answers as the leader (only the
        leader answers partition metadata), is in the ISR under another leader (it runs and has
        caught up), or is gone: its port refuses connections, so nothing it held will be
        delivered (or, with ``unreachable_ok``, does not answer at all: the host is down, which is
        not the stopped process this waits for). Ports are tried at most once a second."""
        if info.leader == broker or (broker in info.isr and info.leader != broker):
            return True
        address = self.addresses.get(broker)
        now = self.timer.now()
        if address is None or now - self._probed.get(broker, -1e9) < 1.0:
            return False
        self._probed[broker] = now
        found = probe_port(*address, timeout=min(1.0, self.waits.timeout))
        return found == "refused" or (unreachable_ok and found == "silent")

    def _check_bounds(
        self, waiting: list[PartitionInfo], watches: dict[int, _Watch], suspects: dict[int, set[str]], elapsed: float
    ) -> None:
        waits, now = self.waits, self.timer.now()
        for info in waiting:
            watch = watches[info.id]
            arriving = watch.arrived_last is not None and now - watch.arrived_last < waits.quiet
            if arriving and elapsed >= waits.zombie_wait:
                raise ProducerStillWriting(info.id, (watch.offsets[0], watch.offsets[-1]), watch.duplicates, elapsed)
        if elapsed < waits.tail_wait:
            return
        parts = self.state.parts
        tails = [i for i in waiting if not parts[i.id].hw_seen <= i.high_watermark >= i.newest_offset]
        if tails:
            raise TailNotSettled(max(tails, key=lambda i: i.newest_offset - i.high_watermark), waits.tail_wait)
        silent = [i.id for i in waiting if suspects.get(i.id)]
        if silent:
            raise BrokerStillSilent(min(suspects[silent[0]]), silent[0], waits.tail_wait)
        if all(watches[i.id].arrived_last is None for i in waiting):
            raise TailNotSettled(waiting[0], waits.tail_wait)
