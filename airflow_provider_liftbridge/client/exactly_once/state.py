"""The producer's state: which of its sequence numbers are in the stream, what it knows of each
partition (scan start, how far it has read, the offset its next record must get, which offsets
hold its own acknowledged records), and the outcome it reports. No I/O."""

from __future__ import annotations

import bisect
import logging
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..publishing.columns import RecordColumns
from ..publishing.summary import PartitionRange
from .identity import seq_of

__all__ = ["Batch", "ExactlyOnceResult", "Found", "PartitionState", "ProducerState", "SeqSet", "merge", "note"]

log = logging.getLogger("airflow_provider_liftbridge.client.exactly_once")


class SeqSet:
    """A set of non-negative ints kept as sorted, disjoint, non-adjacent ``[start, end]`` runs.

    A producer's records are mostly one run per attempt, so this stays tiny where a plain ``set``
    of millions of sequence numbers would not.
    """

    def __init__(self, values: Iterable[int] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._size = 0
        for v in values:
            self.add(v)

    def __len__(self) -> int:
        return self._size

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int):
            return False
        i = bisect.bisect_right(self._starts, value) - 1
        return i >= 0 and value <= self._ends[i]

    def add(self, value: int) -> bool:
        """Add ``value``; return ``False`` if it was there already."""
        i = bisect.bisect_right(self._starts, value) - 1
        if i >= 0 and value <= self._ends[i]:
            return False
        self._size += 1
        joins_left = i >= 0 and self._ends[i] == value - 1
        joins_right = i + 1 < len(self._starts) and self._starts[i + 1] == value + 1
        if joins_left and joins_right:
            self._ends[i] = self._ends[i + 1]
            del self._starts[i + 1], self._ends[i + 1]
        elif joins_left:
            self._ends[i] = value
        elif joins_right:
            self._starts[i + 1] = value
        else:
            self._starts.insert(i + 1, value)
            self._ends.insert(i + 1, value)
        return True

    def top(self) -> int:
        """The largest value, or -1 when empty (a value above it is certainly not in the set)."""
        return self._ends[-1] if self._ends else -1

    def add_run_above(self, first: int, last: int) -> None:
        """Add ``first..last`` (inclusive), all above :meth:`top` (checked)."""
        if first <= self.top() or last < first:
            raise ValueError(f"run {first}..{last} is not above {self.top()}")
        if self._ends and self._ends[-1] == first - 1:
            self._ends[-1] = last
        else:
            self._starts.append(first)
            self._ends.append(last)
        self._size += last - first + 1

    def add_ascending(self, values: Sequence[int]) -> None:
        """Add ``values``, given in ascending order, a run at a time where they lie above :meth:`top`."""
        i, n = 0, len(values)
        while i < n:
            j = i
            while j + 1 < n and values[j + 1] == values[j] + 1:
                j += 1
            if values[i] > self.top():
                self.add_run_above(values[i], values[j])
            else:
                for value in values[i : j + 1]:
                    self.add(value)
            i = j + 1

    def runs(self) -> list[tuple[int, int]]:
        """The runs, as inclusive ``(start, end)`` pairs in order."""
        return list(zip(self._starts, self._ends, strict=True))


def merge(ranges: dict[int, PartitionRange], partition: int, more: PartitionRange) -> None:
    """Add ``more`` to ``ranges[partition]``."""
    got = ranges.get(partition)
    if got is None:
        ranges[partition] = more
    else:
        got.merge(more)


def note(ranges: dict[int, PartitionRange], partition: int, offset: int) -> None:
    """Add one offset to ``ranges[partition]``."""
    got = ranges.get(partition)
    if got is None:
        ranges[partition] = PartitionRange(offset, offset)
    else:
        got.add(offset)


@dataclass
class ExactlyOnceResult:
    """The outcome of an exactly-once publish (YDB's written / skipped acks, summed up).

    :ivar stream: the stream.
    :ivar producer_id: the producer id.
    :ivar written: records this call put into the stream.
    :ivar skipped: records that were in the stream already (an earlier attempt wrote them).
    :ivar partitions: offsets of the records written by this call, by partition.
    :ivar resumes: how many times a failed send was resumed (re-scan, send the rest).
    """

    stream: str
    producer_id: str
    written: int = 0
    skipped: int = 0
    partitions: dict[int, PartitionRange] = field(default_factory=dict)
    resumes: int = 0

    @property
    def count(self) -> int:
        """Records handled: ``written + skipped``."""
        return self.written + self.skipped

    def to_dict(self) -> dict[str, Any]:
        """A small JSON-safe dict (partition numbers as strings, as XCom wants)."""
        return {
            "stream": self.stream,
            "producer_id": self.producer_id,
            "written": self.written,
            "skipped": self.skipped,
            "resumes": self.resumes,
            "partitions": {
                str(p): {"first_offset": r.first_offset, "last_offset": r.last_offset, "count": r.count}
                for p, r in sorted(self.partitions.items())
            },
        }

    def add(self, other: ExactlyOnceResult) -> None:
        """Add ``other``'s counts and offsets to these."""
        self.written += other.written
        self.skipped += other.skipped
        self.resumes += other.resumes
        for p, r in other.partitions.items():
            merge(self.partitions, p, PartitionRange(r.first_offset, r.last_offset, r.count))


@dataclass
class PartitionState:
    """What the producer knows of one partition.

    :ivar scan_start: the cursor: where this producer's records can start.
    :ivar scanned_to: the last offset read (or known to hold nothing unknown of ours).
    :ivar next_offset: the offset the next record sent here must get (OCC).
    :ivar hw_seen: the highest high watermark read: committed records never go away.
    :ivar own: offsets above ``scanned_to`` acknowledged to this publisher: a scan passing them
        knows them; anything else of this producer it finds there was written by someone else.
    :ivar leader: the partition's leader as last read.
    """

    scan_start: int
    scanned_to: int
    next_offset: int
    hw_seen: int = -1
    own: SeqSet = field(default_factory=SeqSet)
    leader: str = ""

    def acked(self, offset: int) -> None:
        """An ack put one of this publisher's records at ``offset``."""
        if offset == self.scanned_to + 1:
            self.scanned_to = offset  # nothing unread below it: no need to read it back
        elif offset > self.scanned_to:
            self.own.add(offset)
        self.next_offset = max(self.next_offset, offset + 1)

    def acked_run(self, low: int, high: int, count: int) -> bool:
        """Acks put ``count`` of this publisher's records between ``low`` and ``high``: the usual
        case, one unbroken run right after what was read, is taken in one step (``True``);
        otherwise nothing is changed (``False``: add the offsets one by one)."""
        if low != self.scanned_to + 1 or high - low + 1 != count:
            return False
        self.scanned_to = high
        self.next_offset = max(self.next_offset, high + 1)
        return True

    @property
    def unread_own(self) -> int:
        """The last offset of this publisher's records above ``scanned_to`` (-1: none)."""
        return self.own.top() if self.own.top() > self.scanned_to else -1


class Found(Enum):
    """What a scan made of one of this producer's records (see :meth:`ProducerState.take`)."""

    MINE = "acknowledged to this publisher"
    WANTED = "a record being resumed (stored, its ack lost)"
    EARLIER = "written by someone else, not seen before"
    DUPLICATE = "a sequence number seen before"


class ProducerState:
    """The sequence numbers of one producer found in the stream (or acknowledged), and what it
    knows of each partition.

    :ivar seen: sequence numbers in the stream.
    :ivar parts: the partitions this producer has a scan start in.
    :ivar found: offsets of this producer's records written by someone else (earlier attempts).
    :ivar duplicates_seen: sequence numbers found more than once.
    :ivar doubled: which ones (a later read of the same records does not count them again).
    :ivar acked: with ``keep_acked``, by partition, every offset acknowledged to this publisher
        (its siblings' check skips them: :mod:`.between`); else ``None``.
    """

    def __init__(self, producer_id: str, *, keep_acked: bool = False) -> None:
        self.producer_id = producer_id
        self.producer = producer_id.encode()
        self.seen = SeqSet()
        self.parts: dict[int, PartitionState] = {}
        self.found: dict[int, PartitionRange] = {}
        self.duplicates_seen = 0
        self.doubled = SeqSet()
        self.acked: dict[int, SeqSet] | None = {} if keep_acked else None

    def note_acked(self, partition: int, low: int, high: int, offsets: Sequence[int]) -> None:
        """Keep ``offsets`` (from ``low`` to ``high``, ascending) as acknowledged, if asked to."""
        if self.acked is None:
            return
        kept = self.acked.setdefault(partition, SeqSet())
        if high - low + 1 == len(offsets) and low > kept.top():
            kept.add_run_above(low, high)
        else:
            kept.add_ascending(offsets if offsets == sorted(offsets) else sorted(offsets))

    def take(
        self, partition: int, offset: int, headers: Mapping[str, bytes], wanted: Container[int],
        found: dict[int, int],
    ) -> Found | None:  # fmt: skip
        """Account for the message at ``offset`` of ``partition`` read by a scan; ``None`` when
        another producer wrote it. A ``wanted`` sequence number goes into ``found`` (seq ->
        offset)."""
        seq = seq_of(headers, self.producer)
        if seq is None:
            return None
        if offset in self.parts[partition].own:
            return Found.MINE
        if not self.seen.add(seq):
            self.duplicates_seen += 1
            self.doubled.add(seq)
            log.warning(
                "Producer %r: sequence number %d is in stream partition %d more than once (offset %d); two "
                "writers of this producer (a zombie try, or a late copy from a stopped broker) stored it",
                self.producer_id,
                seq,
                partition,
                offset,
            )
            return Found.DUPLICATE
        if seq in wanted:
            found[seq] = offset
            return Found.WANTED
        note(self.found, partition, offset)
        return Found.EARLIER


class Batch:
    """Records waiting for their acks: their sequence numbers, and the records as columns
    (value, partition, encoded headers, key) without the expected offset each send gives them.
    A record object per record would cost more than framing it does; the columns go to the batch
    publisher as they are."""

    __slots__ = ("seqs", "records")

    def __init__(self, seqs: Sequence[int] = (), records: RecordColumns | None = None) -> None:
        self.seqs = seqs
        self.records = records if records is not None else RecordColumns([], [], [])

    def __len__(self) -> int:
        return len(self.seqs)

    def take(self, indices: Sequence[int]) -> Batch:
        """The records at ``indices``, in that order."""
        return Batch([self.seqs[i] for i in indices], self.records.take(indices))

    def without(self, seqs: Container[int]) -> Batch:
        """The records whose sequence numbers are not in ``seqs``."""
        return self.take([i for i, seq in enumerate(self.seqs) if seq not in seqs])
