"""ADR 8 rule 5 for publishers that write side by side and report to one place (the tasks of a
Spark job): what each left unread between its acknowledged records, and the one read of it that
the place they report to makes once they are all done.

A publisher opened with ``defer_check=True`` does not read, before a call returns, the offsets
between its own acknowledged records that it has not read (rule 5): it keeps them, with the
offsets it was acknowledged for, in an :class:`Unread`. :func:`check_unread` takes the
:class:`Unread` of every publisher of one job and reads only the offsets no one of them was
acknowledged for. An offset holds one record, so an offset acknowledged to a sibling holds the
sibling's record, never a second copy of ours: with tasks side by side each used to read about one
sibling record per record it wrote, and now nothing is read unless someone else wrote there.

No Airflow, no PySpark. See ``docs/exactly-once.md`` and ADR 8.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..column_subscription import subscribe_stored
from ..sync_client import LiftbridgeClient
from ..types import PartitionInfo
from .errors import ConcurrentProducerError, UncommittedTailError
from .identity import PRODUCER_HEADER, SEQ_HEADER
from .state import ExactlyOnceResult, ProducerState
from .tail import Timer

__all__ = ["Unread", "check_unread", "residual", "runs_of", "unread_of"]

Runs = list[tuple[int, int]]


@dataclass(frozen=True)
class Unread:
    """What one exactly-once publisher (``defer_check=True``) left for :func:`check_unread`.

    :ivar producer_id: its producer id.
    :ivar gaps: by partition, the offsets between its acknowledged records that it has not read,
        as sorted inclusive runs.
    :ivar acked: by partition, every offset it was acknowledged for, as sorted inclusive runs.
    """

    producer_id: str
    gaps: dict[int, Runs] = field(default_factory=dict)
    acked: dict[int, Runs] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (partition numbers as strings)."""
        return {
            "producer_id": self.producer_id,
            "gaps": {str(p): [list(r) for r in runs] for p, runs in self.gaps.items()},
            "acked": {str(p): [list(r) for r in runs] for p, runs in self.acked.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Unread:
        """The inverse of :meth:`to_json`."""

        def parts(raw: Mapping[str, Any]) -> dict[int, Runs]:
            return {int(p): [(int(a), int(b)) for a, b in runs] for p, runs in raw.items()}

        return cls(str(data["producer_id"]), parts(data["gaps"]), parts(data["acked"]))


def unread_of(state: ProducerState) -> Unread:
    """A publisher's :class:`Unread` from its state (kept with ``keep_acked``)."""
    gaps: dict[int, Runs] = {}
    for p, part in state.parts.items():
        top = part.unread_own
        if top >= 0:
            own = [(max(low, part.scanned_to + 1), high) for low, high in part.own.runs() if high > part.scanned_to]
            left = _minus([(part.scanned_to + 1, top)], own)
            if left:
                gaps[p] = left
    acked = {p: kept.runs() for p, kept in (state.acked or {}).items() if len(kept)}
    return Unread(state.producer_id, gaps, acked)


def runs_of(offsets: Iterable[int]) -> Runs:
    """``offsets`` as sorted inclusive runs of consecutive values (duplicates merged)."""
    ordered = sorted(set(offsets))
    runs: Runs = []
    for value in ordered:
        if runs and runs[-1][1] == value - 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def _union(all_runs: Iterable[Runs]) -> Runs:
    merged: Runs = []
    for low, high in sorted(r for runs in all_runs for r in runs):
        if merged and low <= merged[-1][1] + 1:
            if high > merged[-1][1]:
                merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    return merged


def _minus(runs: Runs, taken: Runs) -> Runs:
    """The offsets of ``runs`` not in ``taken`` (both sorted, ``taken`` disjoint)."""
    starts = [low for low, _ in taken]
    left: Runs = []
    for low, high in runs:
        i = max(0, bisect.bisect_right(starts, low) - 1)
        while low <= high:
            if i < len(taken) and taken[i][1] < low:
                i += 1
                continue
            if i >= len(taken) or taken[i][0] > high:
                left.append((low, high))
                break
            t_low, t_high = taken[i]
            if t_low > low:
                left.append((low, t_low - 1))
            low = t_high + 1
            i += 1
    return left


def residual(unread: Sequence[Unread]) -> dict[int, dict[str, Runs]]:
    """By partition and producer id, the gaps no publisher of ``unread`` was acknowledged for:
    the offsets :func:`check_unread` reads (empty partitions and producers left out)."""
    partitions = sorted({p for u in unread for p in u.gaps})
    out: dict[int, dict[str, Runs]] = {}
    for p in partitions:
        taken = _union(u.acked.get(p, []) for u in unread)
        for u in unread:
            left = _minus(u.gaps.get(p, []), taken)
            if left:
                out.setdefault(p, {}).setdefault(u.producer_id, []).extend(left)
    return out


def check_unread(
    client: LiftbridgeClient,
    stream: str,
    unread: Sequence[Unread],
    *,
    tail_wait: float = 30.0,
    settle: float = 0.2,
    timer: Timer | None = None,
) -> int:
    """Read what every publisher of ``unread`` left unread between its acknowledged records and no
    publisher of ``unread`` was acknowledged for (:func:`residual`), once committed. A record of a
    publisher's own producer id found in its own gaps is a second copy (it counted each of its
    sequence numbers once, from an ack or a read elsewhere) or another writer of that producer
    id: either fails. Returns how many records were read.

    Give it every publisher that wrote the data set (a publisher left out counts as someone else,
    and its records are read: slower, never wrong).

    :raises ConcurrentProducerError: a record of a producer was found in its own gaps.
    :raises UncommittedTailError: a partition's high watermark did not reach those offsets within
        ``tail_wait`` seconds.
    :raises LiftbridgeError: a read failed.
    """
    timer = timer or Timer()
    read = 0
    for partition, by_producer in sorted(residual(unread).items()):
        owned = {
            producer.encode(): (sorted(runs), [low for low, _ in sorted(runs)])
            for producer, runs in by_producer.items()
        }
        top = max(high for runs, _ in owned.values() for _, high in runs)
        _wait_committed(client, stream, partition, top, tail_wait, settle, timer)
        for first, last in _union(by_producer.values()):
            for pb in client._transport.drive(
                subscribe_stored(client._core, stream, partition=partition, start_at=first, stop_at=last)
            ):
                read += 1
                mine = owned.get(pb.headers.get(PRODUCER_HEADER, b""))
                if mine is None:
                    continue
                runs, starts = mine
                i = bisect.bisect_right(starts, pb.offset) - 1
                if i >= 0 and pb.offset <= runs[i][1]:
                    owner = pb.headers[PRODUCER_HEADER].decode(errors="replace")
                    seq = pb.headers.get(SEQ_HEADER, b"?").decode(errors="replace")
                    raise ConcurrentProducerError(
                        f"exactly-once publish of producer {owner!r} to stream {stream!r}: offset {pb.offset} of "
                        f"partition {partition}, between the records this producer was acknowledged for, holds a "
                        f"record of this producer (sequence number {seq}) that it neither wrote nor read: another "
                        "writer of the same producer id (a zombie try of the same task, or a late copy from a "
                        "stopped broker) stored it, a second copy of a record already counted. Not reported as a "
                        "success.",
                        ExactlyOnceResult(stream, owner),
                        partition=partition,
                        duplicates=1,
                    )
    return read


def _wait_committed(
    client: LiftbridgeClient, stream: str, partition: int, offset: int, tail_wait: float, settle: float, timer: Timer
) -> None:
    """Wait until ``partition``'s high watermark reaches ``offset`` (or the log, committed, ends below it)."""
    started = timer.now()
    while True:
        info: PartitionInfo = client.fetch_partition_metadata(stream, partition)
        if info.high_watermark >= min(offset, info.newest_offset):
            return
        if timer.now() - started >= tail_wait:
            raise UncommittedTailError(
                f"stream {stream!r} partition {partition}: offsets up to {offset} were not committed within "
                f"{tail_wait:g} s (newest offset {info.newest_offset}, high watermark {info.high_watermark}), so "
                "whether they hold a second copy of a record cannot be read yet",
                ExactlyOnceResult(stream, ""),
                partition=partition,
                high_watermark=info.high_watermark,
                newest_offset=info.newest_offset,
            )
        timer.sleep(settle if settle > 0 else 0.2)
