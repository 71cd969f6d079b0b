"""Write statistics from acks: latency from publish to leader reception and to commit, and throughput.

A Liftbridge ack carries ``reception_timestamp`` (the leader received the message) and
``commit_timestamp`` (the ISR has it), both nanoseconds of the server's clock. :class:`WriteStats`
takes, per acknowledged record, the time the publisher sent it and the ack, and keeps two latency
histograms (publish → reception, publish → commit) with logarithmic buckets 2 % wide, so memory stays
small whatever the number of records, histograms merge (Spark executors send theirs to the driver
as JSON), and p50/p99 are exact to within 2 %; ``max`` is exact. Latencies below zero (a client
clock ahead of the server's) count as zero.
"""

from __future__ import annotations

import bisect
import math
import operator
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["LatencyHistogram", "WriteStats", "summary_line"]

_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
_RECEPTION = operator.attrgetter("reception_timestamp")
_COMMIT = operator.attrgetter("commit_timestamp")


def summary_line(s: Mapping[str, Any]) -> str:
    """A :meth:`WriteStats.summary` in one line for a task log."""
    lead, com = s["to_leader_ms"], s["to_commit_ms"]
    resent = s.get("resent", 0)
    return (
        f"{s['acks']} ack(s) in {s['seconds']:.3f} s ({s['records_per_second']:.0f} records/s, "
        f"{s['bytes_per_second'] / 1e6:.2f} MB/s); publish->leader ms p50 {lead['p50']} p99 {lead['p99']} "
        f"max {lead['max']}; publish->commit ms p50 {com['p50']} p99 {com['p99']} max {com['max']}"
        + (f"; {resent} record(s) re-sent (at-least-once: possibly stored twice)" if resent else "")
    )


def _bucket(ns: int) -> int:
    """The histogram bucket of a latency (non-decreasing in ``ns``; -1 below 1 ns)."""
    return int(math.log(ns) / _LOG_GROWTH) if ns >= 1 else -1


class LatencyHistogram:
    """Counts of nanosecond latencies in buckets ``[g**i, g**(i+1))`` (``g`` = 1.02), plus the max."""

    __slots__ = ("buckets", "count", "max_ns")

    def __init__(self) -> None:
        self.buckets: dict[int, int] = {}
        self.count = 0
        self.max_ns = 0

    def add(self, ns: int) -> None:
        ns = max(ns, 0)
        index = _bucket(ns)
        self.buckets[index] = self.buckets.get(index, 0) + 1
        self.count += 1
        if ns > self.max_ns:
            self.max_ns = ns

    def add_many(self, latencies: Sequence[int]) -> None:
        """:meth:`add` each of ``latencies``, at the cost of a sort: the bucket of a latency grows
        with it, so each bucket is a run of the sorted latencies, found by bisection (a few
        logarithms per bucket rather than one per latency)."""
        if not latencies:
            return
        ordered = sorted(latencies)
        buckets, pos, n = self.buckets, 0, len(ordered)
        while pos < n:
            index = _bucket(ordered[pos])
            end = bisect.bisect_right(ordered, index, lo=pos, key=_bucket)
            buckets[index] = buckets.get(index, 0) + end - pos
            pos = end
        self.count += n
        self.max_ns = max(self.max_ns, ordered[-1])

    def merge(self, other: LatencyHistogram) -> None:
        for index, n in other.buckets.items():
            self.buckets[index] = self.buckets.get(index, 0) + n
        self.count += other.count
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile(self, q: float) -> int:
        """The ``q``-quantile (0 < q <= 1) in nanoseconds: the upper edge of its bucket, capped at the max."""
        if not self.count:
            return 0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                upper = 0 if index < 0 else math.ceil(_GROWTH ** (index + 1))
                return min(upper, self.max_ns)
        return self.max_ns

    def summary_ms(self) -> dict[str, float]:
        """``{"p50", "p99", "max"}`` in milliseconds (3 decimals)."""
        return {
            "p50": round(self.percentile(0.50) / 1e6, 3),
            "p99": round(self.percentile(0.99) / 1e6, 3),
            "max": round(self.max_ns / 1e6, 3),
        }

    def to_json(self) -> dict[str, Any]:
        return {"buckets": {str(k): v for k, v in self.buckets.items()}, "count": self.count, "max_ns": self.max_ns}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LatencyHistogram:
        hist = cls()
        hist.buckets = {int(k): int(v) for k, v in data.get("buckets", {}).items()}
        hist.count = int(data.get("count", 0))
        hist.max_ns = int(data.get("max_ns", 0))
        return hist


class WriteStats:
    """Latencies and throughput of one publishing run (or the merge of several).

    :param clock: nanoseconds since the epoch (the server stamps acks with the same kind of time).
    """

    def __init__(self, clock: Any = time.time_ns) -> None:
        self._clock = clock
        self.to_reception = LatencyHistogram()
        self.to_commit = LatencyHistogram()
        self.first_sent_ns = 0
        self.last_ack_ns = 0
        self.bytes = 0
        #: Records published again after a lost ack or connection (each may be stored twice).
        self.resent = 0

    def now(self) -> int:
        """The time to note when a record is sent."""
        return int(self._clock())

    def sent(self, at_ns: int) -> None:
        """Note that sending started (for throughput: records over first send to last ack)."""
        if not self.first_sent_ns or at_ns < self.first_sent_ns:
            self.first_sent_ns = at_ns

    def acked(self, sent_ns: int, ack: Any, size: int = 0) -> None:
        """Count one ack (an :class:`~.types.Ack`) of a record sent at ``sent_ns`` (``size`` bytes on the wire)."""
        self.sent(sent_ns)
        self.to_reception.add(int(ack.reception_timestamp) - sent_ns)
        self.to_commit.add(int(ack.commit_timestamp) - sent_ns)
        self.last_ack_ns = max(self.last_ack_ns, self.now())
        self.bytes += size

    def acked_many(self, sent_ns: Sequence[int], acks: Sequence[Any], size: int = 0) -> None:
        """Count a batch's acks at once: ``acks[i]`` of a record sent at ``sent_ns[i]`` (0: not
        noted, counted as sent now), ``size`` bytes on the wire in all; the same as :meth:`acked`
        per ack, in one pass per histogram."""
        if not acks:
            return
        now = self.now()
        sent = [t or now for t in sent_ns]
        self.sent(min(sent))
        self.to_reception.add_many([r - t for r, t in zip(map(_RECEPTION, acks), sent, strict=True)])
        self.to_commit.add_many([c - t for c, t in zip(map(_COMMIT, acks), sent, strict=True)])
        self.last_ack_ns = max(self.last_ack_ns, now)
        self.bytes += size

    def note_resent(self, records: int) -> None:
        """Count ``records`` re-sends (a record sent a third time counts twice)."""
        self.resent += records

    def merge(self, other: WriteStats) -> None:
        self.to_reception.merge(other.to_reception)
        self.to_commit.merge(other.to_commit)
        if other.first_sent_ns and (not self.first_sent_ns or other.first_sent_ns < self.first_sent_ns):
            self.first_sent_ns = other.first_sent_ns
        self.last_ack_ns = max(self.last_ack_ns, other.last_ack_ns)
        self.bytes += other.bytes
        self.resent += other.resent

    @property
    def acks(self) -> int:
        return self.to_commit.count

    def summary(self) -> dict[str, Any]:
        """JSON-safe, small: ``{"acks", "seconds", "records_per_second", "bytes", "bytes_per_second",
        "to_leader_ms": {"p50", "p99", "max"}, "to_commit_ms": {...}, "resent"}`` (``resent``: records
        published again after a lost ack or connection, each possibly stored twice)."""
        seconds = max(self.last_ack_ns - self.first_sent_ns, 0) / 1e9 if self.acks else 0.0
        rate = self.acks / seconds if seconds > 0 else 0.0
        return {
            "acks": self.acks,
            "seconds": round(seconds, 3),
            "records_per_second": round(rate, 1),
            "bytes": self.bytes,
            "bytes_per_second": round(self.bytes / seconds, 1) if seconds > 0 else 0.0,
            "to_leader_ms": self.to_reception.summary_ms(),
            "to_commit_ms": self.to_commit.summary_ms(),
            "resent": self.resent,
        }

    def log_line(self) -> str:
        """The summary in one line for the task log (:func:`summary_line`)."""
        return summary_line(self.summary())

    def to_json(self) -> dict[str, Any]:
        """Everything, JSON-safe, for :meth:`from_json` on another process (Spark executors)."""
        return {
            "to_reception": self.to_reception.to_json(),
            "to_commit": self.to_commit.to_json(),
            "first_sent_ns": self.first_sent_ns,
            "last_ack_ns": self.last_ack_ns,
            "bytes": self.bytes,
            "resent": self.resent,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WriteStats:
        stats = cls()
        stats.to_reception = LatencyHistogram.from_json(data.get("to_reception", {}))
        stats.to_commit = LatencyHistogram.from_json(data.get("to_commit", {}))
        stats.first_sent_ns = int(data.get("first_sent_ns", 0))
        stats.last_ack_ns = int(data.get("last_ack_ns", 0))
        stats.bytes = int(data.get("bytes", 0))
        stats.resent = int(data.get("resent", 0))
        return stats
