"""The streaming source's offsets as Spark keeps them in a query's checkpoint, and the check that a
checkpoint still matches the stream it reads.

An offset names the stream incarnation it was taken from (the stream's name, its
``creationTimestamp`` from ``FetchMetadata`` and its partition count) and the next offset to read
in each partition::

    {"stream": "orders", "creationTimestamp": 1764095532123456789, "partitionCount": 2,
     "offsets": {"0": 120, "1": 98}}

When a checkpoint no longer matches the stream, going on from it would skip or re-read messages
without a word: the stream was deleted and created again (its offsets start again at 0), a
checkpointed offset is beyond what the partition holds, or retention removed messages the query
had not read yet. :func:`resolve_starts` finds these, and what to read instead: each affected
partition from its earliest available offset. The caller fails the query (``failOnDataLoss``,
the default, as Spark's Kafka source) or logs them and goes on. An end offset that starts some
partitions elsewhere than the previous end says so in ``resetFrom``, so a micro-batch that Spark
replays from its offset log reads the very same offsets.

A checkpoint written before identities were recorded holds the bare ``{"0": 120, "1": 98}``: it
is read as offsets of an unknown incarnation (a recreated stream cannot be told apart; the offset
checks still apply), and the next micro-batch's offsets carry the identity.

Pure logic: no PySpark, no I/O.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SparkDataLossError, SparkOptionError, SparkStreamError

Offsets = dict[str, int]
FAIL_ON_DATA_LOSS = "failOnDataLoss"


@dataclass(frozen=True)
class StreamIdentity:
    """What tells one incarnation of a stream from another: deleting and creating a stream again
    gives it a new creation timestamp (epoch ns, set by the server)."""

    stream: str
    creation_timestamp: int
    partition_count: int

    def describe(self) -> str:
        created = dt.datetime.fromtimestamp(self.creation_timestamp / 1e9, tz=dt.UTC)
        when = created.isoformat(timespec="milliseconds")
        return f"stream {self.stream!r} created {when} with {self.partition_count} partition(s)"


@dataclass(frozen=True)
class SourceOffset:
    """One source offset of a micro-batch boundary.

    :param identity: the stream incarnation the offsets belong to (``None``: an old checkpoint).
    :param next: per partition id (a string, as JSON keys are), the next offset to read.
    :param reset_from: in an end offset, the partitions whose micro-batch starts elsewhere than
        the previous end (a partition new to the query, or a reset after data loss).
    """

    identity: StreamIdentity | None
    next: Offsets
    reset_from: Offsets = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SourceOffset:
        """An offset from its JSON form; an old checkpoint's bare partition map has no identity.

        :raises SparkStreamError: when it is neither form (a checkpoint of another source).
        """
        try:
            if "offsets" not in raw:
                return cls(None, {str(p): int(o) for p, o in raw.items()})
            identity = StreamIdentity(str(raw["stream"]), int(raw["creationTimestamp"]), int(raw["partitionCount"]))
            reset = {str(p): int(o) for p, o in raw.get("resetFrom", {}).items()}
            return cls(identity, {str(p): int(o) for p, o in raw["offsets"].items()}, reset)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise SparkStreamError(
                f"the checkpoint holds a source offset this source cannot read: {dict(raw)!r}; was the "
                "checkpointLocation written by another query? Give the query a checkpoint of its own"
            ) from None

    def to_json(self) -> dict[str, Any]:
        """The JSON form Spark stores (keys in a fixed order: Spark compares offsets as text)."""
        out: dict[str, Any] = {}
        if self.identity is not None:
            out["stream"] = self.identity.stream
            out["creationTimestamp"] = self.identity.creation_timestamp
            out["partitionCount"] = self.identity.partition_count
        out["offsets"] = _sorted(self.next)
        if self.reset_from:
            out["resetFrom"] = _sorted(self.reset_from)
        return out if self.identity is not None or self.reset_from else _sorted(self.next)

    def start_of(self, partition: str, previous: SourceOffset) -> int:
        """Where the micro-batch ending at this offset starts reading ``partition``."""
        if partition in self.reset_from:
            return self.reset_from[partition]
        return previous.next.get(partition, 0)


def _sorted(offsets: Mapping[str, int]) -> Offsets:
    return {p: offsets[p] for p in sorted(offsets, key=int)}


@dataclass(frozen=True)
class PartitionNow:
    """One partition as the source sees it at a trigger.

    :param next_offset: high watermark + 1: the first offset not committed yet.
    :param newest_offset: the last offset written (``-1``: none).
    """

    next_offset: int
    newest_offset: int


@dataclass(frozen=True)
class Resolution:
    """Where a micro-batch starts in each partition, and what went missing on the way.

    :param starts: per partition, the first offset to read.
    :param losses: one sentence per problem found (empty: the checkpoint matches).
    :param added: partitions the checkpoint does not know, read from their earliest offset.
    """

    starts: Offsets
    losses: list[str]
    added: list[str]


def resolve_starts(
    previous: SourceOffset,
    current: StreamIdentity,
    now: Mapping[str, PartitionNow],
    earliest: Callable[[str], int],
) -> Resolution:
    """Check ``previous`` (the checkpoint's last offset) against the stream as it is ``now``.

    :param current: the stream's identity now.
    :param now: the partitions the query reads, as they are now.
    :param earliest: the earliest available offset of a partition (asked only when needed: it
        costs a subscription).
    """
    losses: list[str] = []
    added: list[str] = []
    starts: Offsets = {}
    was = previous.identity
    if was is not None and was != current:
        losses.append(describe_change(was, current))
        return Resolution({p: earliest(p) for p in now}, losses, added)
    for p, part in now.items():
        if p not in previous.next:
            added.append(p)
            starts[p] = earliest(p)
            continue
        start = previous.next[p]
        newest_next = max(part.newest_offset + 1, part.next_offset)
        if start > newest_next:
            losses.append(
                f"partition {p}: the checkpoint's next offset {start} is beyond the partition's newest "
                f"offset {newest_next - 1} (its log was truncated or replaced)"
            )
            starts[p] = earliest(p)
        elif start < part.next_offset and start < (first := earliest(p)):
            losses.append(
                f"partition {p}: offsets {start}..{first - 1} were removed (retention) before the query "
                f"read them; the earliest available offset is {first}"
            )
            starts[p] = first
        else:
            starts[p] = start
    return Resolution(starts, losses, added)


def describe_change(was: StreamIdentity, now: StreamIdentity) -> str:
    """One sentence on how the stream ``was`` differs from the stream ``now``."""
    if was.stream != now.stream:
        return f"the checkpoint was written for {was.describe()}, but the query now reads {now.describe()}"
    if was.creation_timestamp != now.creation_timestamp:
        return (
            f"the stream was deleted and created again since the checkpoint was written (then: "
            f"{was.describe()}; now: {now.describe()}); its offsets started again at 0"
        )
    return f"the stream's partition count changed from {was.partition_count} to {now.partition_count}"


def data_loss_error(stream: str, losses: list[str]) -> SparkDataLossError:
    """The error that fails a query whose checkpoint no longer matches ``stream``."""
    return SparkDataLossError(
        f"the streaming query's checkpoint no longer matches stream {stream!r}: " + "; ".join(losses) + ". "
        "Going on would skip or re-read messages without notice. Either start the query with a new "
        "checkpointLocation (it then starts at startingOffsets), or set the source option "
        f"{FAIL_ON_DATA_LOSS}=false to log this and carry on from the earliest available offsets"
    )


def parse_fail_on_data_loss(raw: str | None) -> bool:
    """The ``failOnDataLoss`` option (default true).

    :raises SparkOptionError: when it is not true/false.
    """
    if raw is None or raw.strip() == "":
        return True
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise SparkOptionError(f"option '{FAIL_ON_DATA_LOSS}' must be 'true' or 'false', got {raw!r}")
    return value == "true"
