"""Where a call goes: the seed and learned brokers, the metadata cache, partition leaders and the
owners of cursors. Also holds the configuration both clients share (:class:`ClientCore`); no I/O
happens here."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

from airflow_provider_liftbridge.nats_security import check_nats_url

from .errors import InvalidArgumentError
from .partitioners import partition_for_key
from .retry import RetryPolicy
from .types import AckPolicy, BrokerInfo, Metadata, PartitionInfo, StreamInfo

#: The internal stream whose partitions hold the cursors; each cursor lives in one of them.
CURSORS_STREAM = "__cursors"

#: How long the client trusts that the cluster has no cursors stream in its metadata before
#: asking again, in seconds (a cluster without one takes cursor calls on any broker).
CURSORS_RECHECK = 30.0


def parse_brokers(brokers: str | Sequence[str]) -> list[str]:
    """Normalise ``"h:p"``, ``"h1:p1,h2:p2"`` or a list of those into a list of ``host:port``.

    :raises InvalidArgumentError: no address, or one without a numeric port.
    """
    items = brokers.split(",") if isinstance(brokers, str) else [b for part in brokers for b in part.split(",")]
    out: list[str] = []
    for raw in items:
        addr = raw.strip()
        if not addr:
            continue
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgumentError(f"broker address {addr!r} is not host:port; write it like '127.0.0.1:9292'")
        if addr not in out:
            out.append(addr)
    if not out:
        raise InvalidArgumentError(f"no broker address in {brokers!r}; give at least one 'host:port'")
    return out


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


def _nats_urls(servers: str | Sequence[str]) -> tuple[str, ...]:
    """The NATS URLs, checked (a URL that is not one would otherwise read as a host name and the
    NATS path fail later, or quietly fall back to gRPC).

    :raises InvalidArgumentError: one is not a NATS URL.
    """
    entries = [s for s in servers.split(",") if s.strip()] if isinstance(servers, str) else list(servers)
    try:
        return tuple(check_nats_url(entry) for entry in entries)
    except ValueError as exc:
        raise InvalidArgumentError(f"nats_servers: {exc}") from None


class ClientCore:
    """Configuration and state shared by both clients; no I/O happens here."""

    def __init__(
        self,
        brokers: str | Sequence[str],
        *,
        timeout: float,
        max_retries: int,
        ack_policy: AckPolicy,
        resubscribe_wait: float,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        nats_servers: Sequence[str] = (),
    ) -> None:
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be 0 or more, got {max_retries!r}")
        if resubscribe_wait < 0:
            raise InvalidArgumentError(f"resubscribe_wait must be 0 or more seconds, got {resubscribe_wait!r}")
        self.seeds = parse_brokers(brokers)
        self.timeout = float(timeout)
        self.retry = RetryPolicy(max_retries, backoff_base, backoff_max)
        self.ack_policy = AckPolicy(ack_policy)
        self.resubscribe_wait = float(resubscribe_wait)
        self.cache = MetadataCache()
        #: NATS URLs: when given, ``publish_many`` takes the NATS-direct bulk path (see ``bulk``).
        self.nats_servers: tuple[str, ...] = _nats_urls(nats_servers)
        self.rng = random.Random()
        #: When metadata last showed no cursors stream (monotonic seconds), or None.
        self.cursors_absent_since: float | None = None
        #: Streams some metadata answer has listed: a "no such stream" about them is only believed
        #: once confirmed (see ``presence.py``), since a restarting cluster answers that for a while.
        self.seen_streams: set[str] = set()
        self._good = 0  # index (in known_addresses()) of the broker that answered last
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
        addrs = self.known_addresses()
        if address in addrs:
            with self._lock:
                self._good = addrs.index(address)

    def backoff(self, attempt: int) -> float:
        return self.retry.backoff(attempt, self.rng)

    def call_timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.timeout
        if timeout <= 0:
            raise InvalidArgumentError(f"timeout must be a positive number of seconds, got {timeout!r}")
        return float(timeout)

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
