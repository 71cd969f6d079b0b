"""The errors of exactly-once publishing. Each one that ends a publish carries what was written
and skipped so far (``.result``) and says whether publishing again resumes without duplicates."""

from __future__ import annotations

from ..errors import LiftbridgeError
from ..types import PartitionInfo
from .state import ExactlyOnceResult

__all__ = [
    "ConcurrentProducerError",
    "ExactlyOnceError",
    "ExactlyOncePublishError",
    "HistoryMismatchError",
    "ReplacedHistoryError",
    "SilentBrokerError",
    "TruncatedLogError",
    "UncommittedTailError",
]


class ExactlyOnceError(LiftbridgeError):
    """Base of the errors of exactly-once publishing."""


class ExactlyOncePublishError(ExactlyOnceError):
    """An exactly-once publish stopped before every record was in the stream.

    Publishing again with the same producer id resumes where this one stopped: nothing already in
    the stream is written twice.

    :ivar result: what was written and skipped before the failure.
    """

    def __init__(self, message: str, result: ExactlyOnceResult) -> None:
        super().__init__(message)
        self.result = result


class UncommittedTailError(ExactlyOncePublishError):
    """A resumption found records above a partition's high watermark (written by the leader but
    not committed) that were neither committed nor truncated within ``tail_wait`` seconds.

    Such records cannot be read yet, so whether the ones sent last are among them cannot be told,
    and nothing more was sent. Publishing again with the same producer id resumes without
    duplicates: it waits for the tail again first.

    :ivar partition: the partition whose tail did not settle.
    :ivar high_watermark: its high watermark at the last reading.
    :ivar newest_offset: its newest offset at the last reading.
    """

    def __init__(
        self, message: str, result: ExactlyOnceResult, *, partition: int, high_watermark: int, newest_offset: int
    ) -> None:
        super().__init__(message, result)
        self.partition = partition
        self.high_watermark = high_watermark
        self.newest_offset = newest_offset


class SilentBrokerError(ExactlyOncePublishError):
    """Records were sent to a broker that stopped answering before it acknowledged them, and it
    neither answered again nor went away within ``tail_wait`` seconds.

    A stopped (SIGSTOP) broker carries out what it received when it wakes, even after the client
    gave up, so those records may still be stored later: they were not sent again. Publishing
    again once the broker runs again (or is gone) resumes without duplicates; on a stream with
    optimistic concurrency control a late copy is refused in any case.

    :ivar broker: the broker's id.
    :ivar partition: the partition the records went to.
    """

    def __init__(self, message: str, result: ExactlyOnceResult, *, broker: str, partition: int) -> None:
        super().__init__(message, result)
        self.broker = broker
        self.partition = partition


class ConcurrentProducerError(ExactlyOncePublishError):
    """Another writer with the same producer id (a zombie try of the same task, still running)
    stored records while this publish ran, or kept storing them for longer than ``zombie_wait``.

    Raised instead of succeeding: on a stream without optimistic concurrency control two writers
    of one producer cannot be fenced, and a publish that wrote beside one must not report success.

    :ivar partition: where the other writer's records were seen.
    :ivar duplicates: sequence numbers stored more than once because of it (0 when this publish
        stopped before writing beside it).
    """

    def __init__(self, message: str, result: ExactlyOnceResult, *, partition: int, duplicates: int) -> None:
        super().__init__(message, result)
        self.partition = partition
        self.duplicates = duplicates


class ReplacedHistoryError(ExactlyOncePublishError):
    """A partition no longer holds what this publisher saw committed there: the replicas' histories
    diverged (Liftbridge v1.9.0-72 can cut a follower to a lagging high watermark and elect it,
    losing records acknowledged with ack policy ALL: seed 59919, docs/reliability.md), or a
    deposed leader that has not learnt of the change answered from its own, shorter, log.

    Nothing more was sent after it was seen: a re-send would store a second copy wherever a
    replica with the other history leads later. The client cannot undo the loss, and publishing
    again is no cure either: the operators fail the task without Airflow's retries (ADR 8).

    :ivar partition: the partition.
    :ivar missing: how many records this publisher counted as stored are gone, as far as it saw.
    :ivar twice: how many sequence numbers it found stored twice, as far as it saw.
    """

    def __init__(self, message: str, result: ExactlyOnceResult, *, partition: int, missing: int, twice: int) -> None:
        super().__init__(message, result)
        self.partition = partition
        self.missing = missing
        self.twice = twice


class TruncatedLogError(ReplacedHistoryError):
    """With ack policy ALL, a partition's log was found ending below an offset this publisher had
    seen committed (acknowledged with ALL, or below a high watermark it read), or an ack put one
    of its records at such an offset.

    :ivar newest_offset: the partition's newest offset as read (or the offset the ack named).
    :ivar committed_offset: the offset this publisher had seen committed before.
    :ivar missing: the offsets seen committed that no longer hold their record (after
        ``newest_offset``, or from the offset the ack named), up to ``committed_offset``;
        ``twice`` is 0: nothing was found stored twice.
    """

    def __init__(
        self,
        message: str,
        result: ExactlyOnceResult,
        *,
        partition: int,
        newest_offset: int,
        committed_offset: int,
        missing: int,
    ) -> None:
        super().__init__(message, result, partition=partition, missing=missing, twice=0)
        self.newest_offset = newest_offset
        self.committed_offset = committed_offset


class HistoryMismatchError(ReplacedHistoryError):
    """The read after a leader change (every record of this producer from its scan start to the
    high watermark) did not find each sequence number this publisher counted as stored exactly
    once.

    :ivar missing: sequence numbers counted as stored and not found.
    :ivar twice: sequence numbers found more than once (beyond copies an earlier try left).
    :ivar partition: the first partition where a difference was found (-1: only missing ones,
        which cannot be placed).
    """

    def __init__(self, message: str, result: ExactlyOnceResult, *, partition: int, missing: int, twice: int) -> None:
        super().__init__(message, result, partition=partition, missing=missing, twice=twice)


class TailNotSettled(ExactlyOnceError):
    """Internal: the wait for a partition's tail ran out (turned into :class:`UncommittedTailError`)."""

    def __init__(self, info: PartitionInfo, waited: float) -> None:
        super().__init__(f"partition {info.id} did not settle within {waited:g} s")
        self.info = info
        self.waited = waited


class BrokerStillSilent(ExactlyOnceError):
    """Internal: the broker holding records of unknown fate did not answer in time (turned into
    :class:`SilentBrokerError`)."""

    def __init__(self, broker: str, partition: int, waited: float) -> None:
        super().__init__(f"broker {broker} did not answer within {waited:g} s")
        self.broker = broker
        self.partition = partition
        self.waited = waited


class ProducerStillWriting(ExactlyOnceError):
    """Internal: records of this producer that this publisher did not send were found (turned
    into :class:`ConcurrentProducerError`).

    :ivar partition: where.
    :ivar offsets: the first and last offset of them seen.
    :ivar duplicates: how many of them repeat a sequence number already in the stream.
    :ivar waited: how long the publisher waited for them to stop (0: found after writing).
    """

    def __init__(self, partition: int, offsets: tuple[int, int], duplicates: int, waited: float) -> None:
        super().__init__(f"records of this producer kept arriving in partition {partition}")
        self.partition = partition
        self.offsets = offsets
        self.duplicates = duplicates
        self.waited = waited


class LogShorter(ExactlyOnceError):
    """Internal: with ack policy ALL, a partition ends below (or acknowledged a record at) an
    offset seen committed before (turned into :class:`TruncatedLogError`).

    :ivar how: what was read: ``"newest offset"`` or ``"ack"``.
    """

    def __init__(self, partition: int, newest_offset: int, committed_offset: int, how: str) -> None:
        super().__init__(f"partition {partition}: {how} {newest_offset}, committed offset {committed_offset}")
        self.partition = partition
        self.newest_offset = newest_offset
        self.committed_offset = committed_offset
        self.how = how


class RecountMismatch(ExactlyOnceError):
    """Internal: the read after a leader change found sequence numbers missing or twice (turned
    into :class:`HistoryMismatchError`).

    :ivar read: by partition, the offsets read (first, last), for the message.
    """

    def __init__(self, partition: int, missing: int, twice: int, read: dict[int, tuple[int, int]]) -> None:
        super().__init__(f"{missing} sequence number(s) missing and {twice} stored twice")
        self.partition = partition
        self.missing = missing
        self.twice = twice
        self.read = read
