"""What a publish did, kept small: counts and first/last offsets per partition, never the acks.

The one summary type of the provider: ``BatchPublisher.publish`` returns it, the publishing
operators return its :meth:`PublishSummary.to_dict` as XCom, Spark jobs report it, and the offset
and ack sensors read that shape::

    {"stream": "orders", "count": 3, "acknowledged": 3, "ack_policy": "LEADER",
     "partitions": {"0": {"first_offset": 10, "last_offset": 12, "count": 3}}}

Partition numbers are strings there because XCom values travel as JSON.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..types import Ack, AckPolicy

__all__ = ["PartitionRange", "PublishSummary"]


@dataclass
class PartitionRange:
    """First and last acknowledged offsets of one partition, and how many acks it got."""

    first_offset: int
    last_offset: int
    count: int = 1

    def add(self, offset: int) -> None:
        """Count one more acknowledged offset."""
        self.first_offset = min(self.first_offset, offset)
        self.last_offset = max(self.last_offset, offset)
        self.count += 1

    def merge(self, other: PartitionRange) -> None:
        """Add another range of the same partition."""
        self.first_offset = min(self.first_offset, other.first_offset)
        self.last_offset = max(self.last_offset, other.last_offset)
        self.count += other.count


@dataclass
class PublishSummary:
    """Running totals of one publish.

    :param stream: the stream published to.
    :param ack_policy: the policy used; with ``NONE`` nothing is acknowledged and offsets are unknown.
    :param count: records handled.
    :param acknowledged: records acknowledged (with exactly-once: in the stream, written now or before).
    :param partitions: acknowledged offsets per partition.
    :param producer_id: set by exactly-once publishing; ``written`` / ``skipped`` then count the
        records this try put into the stream / found there already (``count`` is their sum).
    :param bytes: payload bytes published (key + value + header values), when the caller counts them.
    :param seconds: wall time of the publish, when the caller measures it.
    :param extra: further JSON-safe facts a caller reports (Spark: ``spark_partitions``), added
        to :meth:`to_dict`.
    """

    stream: str
    ack_policy: AckPolicy
    count: int = 0
    acknowledged: int = 0
    partitions: dict[int, PartitionRange] = field(default_factory=dict)
    producer_id: str | None = None
    written: int = 0
    skipped: int = 0
    bytes: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Records per second over :attr:`seconds` (0 when not measured)."""
        return self.count / self.seconds if self.seconds > 0 else 0.0

    def add_acks(self, acks: Iterable[Ack], sent: int) -> None:
        """Account for ``sent`` records and the acks that came back for them (none with ack
        policy ``NONE``)."""
        for ack in acks:
            self.note(ack.partition, ack.offset)
        self.count += sent

    def note(self, partition: int, offset: int) -> None:
        """Count one acknowledged record at ``offset`` of ``partition``."""
        self.acknowledged += 1
        current = self.partitions.get(partition)
        if current is None:
            self.partitions[partition] = PartitionRange(offset, offset)
        else:
            current.add(offset)

    def add_range(self, partition: int, span: PartitionRange) -> None:
        """Merge a range of acknowledged offsets (its records already counted elsewhere)."""
        current = self.partitions.get(partition)
        if current is None:
            self.partitions[partition] = PartitionRange(span.first_offset, span.last_offset, span.count)
        else:
            current.merge(span)

    def merge(self, other: PublishSummary) -> None:
        """Add another summary of the same stream (e.g. one file's, one Spark partition's)."""
        self.count += other.count
        self.acknowledged += other.acknowledged
        self.producer_id = self.producer_id or other.producer_id
        self.written += other.written
        self.skipped += other.skipped
        for partition, span in other.partitions.items():
            self.add_range(partition, span)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-safe summary (shape in the module docstring; exactly-once publishing adds
        ``producer_id``, ``written`` and ``skipped``; a measured publish ``bytes`` and ``seconds``;
        then :attr:`extra`)."""
        eo = (
            {"producer_id": self.producer_id, "written": self.written, "skipped": self.skipped}
            if self.producer_id is not None
            else {}
        )
        measured = {"bytes": self.bytes, "seconds": round(self.seconds, 3)} if self.seconds > 0 else {}
        return (
            eo
            | {
                "stream": self.stream,
                "count": self.count,
                "acknowledged": self.acknowledged,
                "ack_policy": self.ack_policy.name,
                "partitions": {
                    str(p): {"first_offset": r.first_offset, "last_offset": r.last_offset, "count": r.count}
                    for p, r in sorted(self.partitions.items())
                },
            }
            | measured
            | self.extra
        )
