"""Where a call goes: the seed and learned brokers, the metadata cache, partition leaders and the
owners of cursors. Also holds the configuration both clients share (:class:`ClientCore`); no I/O
happens here."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

from .errors import InvalidArgumentError
from .partitioners import partition_for_key
from .presence import StreamSightings
from .retry import RetryPolicy
from .settings import ConnectionSettings
from .types import AckPolicy, BrokerInfo, Metadata, PartitionInfo, StreamInfo

#: The shortest default wait for an ack with policy ALL (seconds; a call's ``timeout=`` wins). An
#: ALL ack waits for every in-sync replica, and a Liftbridge follower that loses its NATS server
#: (or misses a fetch) sleeps ``replica.max.idle.wait`` (10 s by default) before fetching again, so
#: commits stall for 11-13 s on a real cluster while nothing is wrong with the records. A shorter
#: wait gives up on records being stored: a re-send then stores them twice (issue 24 saw up to
#: 1,931 duplicates with the former 10 s). 20 s outlasts the stall with room for a loaded cluster.
ALL_ACK_WAIT = 20.0

#: The internal stream whose partitions hold the cursors; each cursor lives in one of them.
CURSORS_STREAM = "__cursors"

#: How long the client trusts that the cluster has no cursors stream in its metadata before
#: asking again, in seconds (a cluster without one takes cursor calls on any broker).
CURSORS_RECHECK = 30.0


class MetadataCache:
    """What the client last learned about brokers and streams; thread-safe, replaced wholesale."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._brokers: dict[str, BrokerInfo] = {}
        self._streams: dict[str, StreamInfo] = {}

    def update(self, md: Metadata, requested: Sequence[str] | None) -> None:
        """Merge a FetchMetadata answer. Requested streams absent from it are forgotten."""
        with self._lock:
            self._brokers = {b.id: b for b in md.brokers}
            if not requested:
                self._streams = dict(md.streams)
            else:
                for name in requested:
                    self._streams.pop(name, None)
                self._streams.update(md.streams)

    def forget(self, stream: str) -> None:
        with self._lock:
            self._streams.pop(stream, None)

    def stream(self, name: str) -> StreamInfo | None:
        with self._lock:
            return self._streams.get(name)

    def broker_address(self, broker_id: str) -> str | None:
        with self._lock:
            b = self._brokers.get(broker_id)
        return b.address if b else None

    def addresses(self) -> list[str]:
        with self._lock:
            return [b.address for b in self._brokers.values()]


class ClientCore:
    """Configuration and state shared by both clients; no I/O happens here.

    :param settings: how to reach the cluster: the one place the connection options are read
        (validated when the settings were made).
    """

    def __init__(self, settings: ConnectionSettings) -> None:
        #: The connection options this core was built from.
        self.settings = settings
        self.seeds = list(settings.brokers)
        self.timeout = settings.timeout
        self.retry = RetryPolicy(settings.max_retries, settings.backoff_base, settings.backoff_max)
        self.ack_policy = settings.ack_policy
        self.resubscribe_wait = settings.resubscribe_wait
        self.cache = MetadataCache()
        #: NATS URLs: when given, ``publish_many`` takes the NATS-direct bulk path (see ``bulk``).
        self.nats_servers: tuple[str, ...] = settings.nats_servers
        self.rng = random.Random()
        #: The clock of retry budgets (monotonic seconds); tests driving operations step by step
        #: replace it with a virtual one advanced by the backoffs they answer.
        self.clock: Callable[[], float] = time.monotonic
        #: When metadata last showed no cursors stream (monotonic seconds), or None.
        self.cursors_absent_since: float | None = None
        #: Streams some metadata answer has listed, or this client created: a "no such stream" about
        #: them is only believed once confirmed, and not at all while they are fresh (``presence.py``).
        self.seen_streams = StreamSightings()
        self._good = 0  # index (in known_addresses()) of the broker that answered last
        #: Whether some broker has answered a call of this client: until then, brokers that cannot
        #: be reached are more likely a wrong address than a restart (``unary`` waits less).
        self.reached = False
        self._lock = threading.Lock()

    # --- broker cycling ---------------------------------------------------------------------

    def known_addresses(self) -> list[str]:
        """Seed brokers first, then brokers learned from metadata."""
        out = list(self.seeds)
        out.extend(a for a in self.cache.addresses() if a not in out)
        return out

    def address_for_attempt(self, attempt: int, preferred: str | None = None) -> str:
        """The broker to try on attempt ``attempt`` (0-based): the preferred one first (e.g. a
        leader), then the last broker that answered, then the others in turn."""
        addrs = self.known_addresses()
        if preferred is not None:
            if attempt == 0:
                return preferred
            attempt -= 1
        with self._lock:
            start = self._good
        return addrs[(start + attempt) % len(addrs)]

    def mark_good(self, address: str) -> None:
        self.reached = True
        addrs = self.known_addresses()
        if address in addrs:
            with self._lock:
                self._good = addrs.index(address)

    def suspect(self, address: str, stream: str) -> None:
        """``address`` took records of ``stream`` and acknowledged none in time: forget the stream's
        cached leaders, and ask another broker than ``address`` for metadata next. A broker cut off
        from its peers still answers, naming the leaders it last knew (itself) long after the
        others elected a new one; asked again, it would send the next publish back to itself."""
        self.cache.forget(stream)
        addrs = self.known_addresses()
        with self._lock:
            if addrs and addrs[self._good % len(addrs)] == address:
                self._good = (self._good + 1) % len(addrs)

    def backoff(self, attempt: int) -> float:
        return self.retry.backoff(attempt, self.rng)

    def retry_wait(self, retry: int, until: float | None) -> float | None:
        """The backoff before retry number ``retry`` (1-based) of a call that must be over by
        ``until`` (on :attr:`clock`; ``None``: bounded by the count alone), or ``None`` when the
        call gives up: at once when ``max_retries`` is 0; within the first ``max_retries``
        retries, once ``until`` has passed; after those, once the wait would not end before
        ``until`` (so the call's time, not a count, bounds how long it waits out a cluster
        electing leaders).

        The first retries are made however short the timeout, but none starts after ``until``: a
        call whose attempts each run into their deadline (a broker that takes the request and
        never answers in time, such as a SetCursor whose commit never comes) then ends at most
        one backoff and one attempt after ``until``, not after ``max_retries + 1`` attempts'
        deadlines (seed 5006 of the fault campaign: 9 attempts of 5 s, for each of 9 resumes)."""
        if self.retry.max_retries == 0:
            return None
        wait = self.backoff(retry)
        if until is None:
            return wait if retry <= self.retry.max_retries else None
        now = self.clock()
        if now + wait < until or (retry <= self.retry.max_retries and now < until):
            return wait
        return None

    def call_deadline(self, timeout: float | None) -> float:
        """When a call given ``timeout`` (``None``: the client's) stops retrying, on :attr:`clock`.

        :raises InvalidArgumentError: ``timeout`` is not a positive number.
        """
        return self.clock() + self.call_timeout(timeout)

    def call_timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.timeout
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return float(timeout)

    def ack_wait(self, timeout: float | None, ack_policy: AckPolicy) -> float:
        """How long to wait for an ack: ``timeout`` when given; else the client's timeout, and with
        ack policy ALL at least :data:`ALL_ACK_WAIT` (why: see there)."""
        if timeout is None and ack_policy == AckPolicy.ALL:
            return max(self.timeout, ALL_ACK_WAIT)
        return self.call_timeout(timeout)

    def resolve_ack_policy(self, ack_policy: AckPolicy | None) -> AckPolicy:
        return self.ack_policy if ack_policy is None else AckPolicy(ack_policy)

    # --- routing ----------------------------------------------------------------------------

    def partition_info(self, stream: str, partition: int) -> PartitionInfo | None:
        info = self.cache.stream(stream)
        return info.partitions.get(partition) if info else None

    def cursors_partition(self, cursor_id: str, stream: str, partition: int) -> int | None:
        """The partition of the cursors stream that owns cursor (``cursor_id``, ``stream``,
        ``partition``), as the server and the Go client compute it: CRC-32 (IEEE) of
        ``"<cursor_id>,<stream>,<partition>"`` modulo the cursors stream's partition count.
        ``None`` when the cache does not know the cursors stream."""
        info = self.cache.stream(CURSORS_STREAM)
        if info is None or not info.partitions:
            return None
        return partition_for_key(f"{cursor_id},{stream},{partition}".encode(), len(info.partitions))

    def cursors_unknown(self) -> bool:
        """True when the cursors stream should be looked up: not cached, and not found absent
        within the last :data:`CURSORS_RECHECK` seconds."""
        if self.cache.stream(CURSORS_STREAM) is not None:
            return False
        absent = self.cursors_absent_since
        return absent is None or time.monotonic() - absent >= CURSORS_RECHECK

    def route(self, stream: str, partition: int, *, read_isr_replica: bool = False) -> str | None:
        """The address serving ``stream``/``partition``: its leader, or a random in-sync replica
        when ``read_isr_replica``; ``None`` when the cache cannot tell."""
        part = self.partition_info(stream, partition)
        if part is None:
            return None
        candidates = [part.leader]
        if read_isr_replica and part.isr:
            candidates = [self.rng.choice(part.isr)]
        for broker_id in candidates:
            addr = self.cache.broker_address(broker_id)
            if addr:
                return addr
        return None


class OutageBudget:
    """The retry budget of one outage (a stretch without progress), for calls that run longer than
    their timeout (a long batch): it opens at the first failure after progress, lasts ``wait``
    seconds (at least ``max_retries`` retries, :meth:`ClientCore.retry_wait`), and closes when the
    caller says it :meth:`progressed` (an ack came), so each outage gets a whole budget."""

    __slots__ = ("_core", "_wait", "_retries", "_until")

    def __init__(self, core: ClientCore, wait: float) -> None:
        self._core, self._wait = core, wait
        self._retries = 0
        self._until: float | None = None

    @property
    def until(self) -> float | None:
        """When the open budget ends (on ``ClientCore.clock``): for the calls made within it;
        ``None`` when no budget is open or time does not bound it (see :meth:`retry`)."""
        return self._until if self._core.reached else None

    def progressed(self) -> None:
        """Progress: the next failure opens a new budget."""
        self._retries, self._until = 0, None

    def retry(self) -> float | None:
        """The backoff before the next retry, or ``None`` when the budget is spent. Time bounds it
        only once some broker has answered this client (a wrong address fails after the count)."""
        if self._until is None:
            self._until = self._core.clock() + self._wait
        self._retries += 1
        return self._core.retry_wait(self._retries, self.until)
