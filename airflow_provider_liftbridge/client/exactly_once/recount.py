"""The read after a leader change: before a call that saw a partition's leader move returns, every
record of its producer is read again, from each partition's scan start (the first offset the
producer can have written to) to the high watermark, and each sequence number the publisher
counts as stored must be there exactly once.

Why: on Liftbridge v1.9.0-72 a follower cut to a lagging high watermark can be elected, so
records acknowledged with ack policy ALL go, and a resumption that read the old history before
the change sends records again into the new one (seed 59919, docs/reliability.md: 300 missing
and 300 twice, and the call returned success). No reading of the tail can see that; counting
what is stored can. A mismatch fails the call; nothing is sent again by it (a replica holding
the other history may lead next).

Cost: one read of everything from the scan start to the high watermark of each partition the
producer has a scan start in (other producers' records between its own included), only in calls
that saw a leader change. :class:`Recount` is the counting, with no I/O; :func:`recount` the read.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from ..types import PartitionInfo
from .errors import RecountMismatch
from .identity import seq_of
from .state import SeqSet
from .tail import TailReader

__all__ = ["Recount", "overlap", "recount"]

log = logging.getLogger("airflow_provider_liftbridge.client.exactly_once")


def overlap(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """How many values two sorted lists of disjoint inclusive runs have in common."""
    i = j = common = 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if low <= high:
            common += high - low + 1
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return common


class Recount:
    """Counts one producer's sequence numbers as they are read back.

    :param producer: the producer id, encoded.
    :param expected: the sequence numbers counted as stored.
    :param known_twice: those already known to be stored more than once (an earlier try's
        duplicates, reported by the try that stored them): not counted again.
    """

    def __init__(self, producer: bytes, expected: SeqSet, known_twice: SeqSet) -> None:
        self.producer = producer
        self.expected = expected
        self.known_twice = known_twice
        self.found = SeqSet()
        #: Sequence numbers found again (beyond ``known_twice``).
        self.twice = 0
        #: The first partition where one was found again (-1: none).
        self.twice_in = -1

    def take(self, partition: int, headers: Mapping[str, bytes]) -> None:
        """Count the message with ``headers`` read from ``partition``."""
        seq = seq_of(headers, self.producer)
        if seq is None or self.found.add(seq) or seq in self.known_twice:
            return
        self.twice += 1
        if self.twice_in < 0:
            self.twice_in = partition

    @property
    def missing(self) -> int:
        """Expected sequence numbers not found."""
        return len(self.expected) - overlap(self.expected.runs(), self.found.runs())


def recount(reader: TailReader, partitions: Sequence[int]) -> None:
    """Read ``partitions`` again from their scan starts (see module doc), once each one's high
    watermark has reached the last offset this publisher wrote or read there.

    :raises RecountMismatch: a sequence number counted as stored is missing, or one is stored twice.
    :raises LogShorter: with ack policy ALL, a partition ends below an offset seen committed.
    :raises TailNotSettled: a high watermark did not get there within ``tail_wait``.
    """
    state = reader.state
    counted = Recount(state.producer, state.seen, state.doubled)
    read: dict[int, tuple[int, int]] = {}

    def ready(p: int, info: PartitionInfo) -> bool:
        reader.check_length(p, info)
        return info.high_watermark >= min(state.parts[p].next_offset - 1, info.newest_offset)

    for p, info in reader.when_committed(partitions, ready):
        start = state.parts[p].scan_start
        if info.high_watermark < start:
            continue  # nothing committed there since the scan start: nothing of ours to count
        read[p] = (start, info.high_watermark)
        for pb in reader.stored(p, start, info.high_watermark):
            counted.take(p, pb.headers)
    missing = counted.missing
    log.info(
        "Producer %r: a partition's leader changed during the call; read its records again (%s): %d missing, %d twice",
        state.producer_id,
        ", ".join(f"partition {p} offsets {a}-{b}" for p, (a, b) in sorted(read.items())),
        missing,
        counted.twice,
    )
    if missing or counted.twice:
        raise RecountMismatch(counted.twice_in, missing, counted.twice, read)
