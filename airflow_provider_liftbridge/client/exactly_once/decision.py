"""The resend decision: after a failed send, whether to resume (wait, re-read, send what is
missing) or stop, and with which error; and which broker may still hold records whose fate is
unknown. No I/O of its own: the caller passes the step to run and the reads it needs.

- A lost connection, a timeout, a leader change, an optimistic-concurrency refusal or a server
  error is resumed up to ``max_resumes`` times in a row, with backoff.
- "No such stream / partition" is resumed only for a stream the publisher has seen, until
  metadata confirms it is gone (:mod:`..presence`): a restarting cluster answers that for a while.
- Anything else (read-only partition, message too large, bad argument, cursors off) fails at once.
- A failed send whose ack timed out over gRPC leaves its records in the broker it went to (the
  partition's leader), which may be stopped: that broker is a *suspect* until it answers again or
  is gone (see :mod:`.tail`). A try resuming an earlier one suspects the replicas out of the ISR
  of the partitions that try wrote to: one may be its stopped former leader.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Mapping

from ..errors import (
    AckTimeoutError,
    IncorrectOffsetError,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    NotSentError,
    PublishError,
    RequestTimeoutError,
    ServerError,
    UnavailableError,
)
from ..types import PartitionInfo
from .errors import (
    BrokerStillSilent,
    ConcurrentProducerError,
    ExactlyOnceError,
    ExactlyOncePublishError,
    HistoryMismatchError,
    LogShorter,
    ProducerStillWriting,
    RecountMismatch,
    SilentBrokerError,
    TailNotSettled,
    TruncatedLogError,
    UncommittedTailError,
)
from .state import ExactlyOnceResult
from .tail import Timer

__all__ = ["MISSING", "RESUMABLE", "Resumption", "suspects_after", "suspects_at_start", "unwrap"]

log = logging.getLogger("airflow_provider_liftbridge.client.exactly_once")

#: Errors after which a send is worth resuming (re-scan, then send what is missing).
RESUMABLE = (UnavailableError, RequestTimeoutError, NotLeaderError, IncorrectOffsetError, ServerError)
#: Resumable only for a stream this publisher has seen, until metadata confirms it is gone.
MISSING = (NoSuchStreamError, NoSuchPartitionError)


def unwrap(exc: PublishError) -> LiftbridgeError:
    """The typed error behind a ``PublishError``: the failed record's own, else the cause, else the
    first record's that says more than "not sent" (every record without an ack is named, and the
    ones the call never sent only say that it stopped: what stopped it is the cause), else that of
    the ``PublishError`` it was raised from. Failing all of these, by type: a connection's error
    (``OSError``) is :class:`UnavailableError`; otherwise records were handed over and nothing says
    what became of them, which is an :class:`AckTimeoutError` (may or may not be stored: the
    reading that suspects their leader, see :func:`suspects_after`)."""
    if exc.index is not None and exc.index in exc.errors:
        return exc.errors[exc.index]
    cause = exc.__cause__
    if isinstance(cause, LiftbridgeError) and not isinstance(cause, PublishError):
        return cause
    telling = [i for i, e in exc.errors.items() if not isinstance(e, NotSentError)]
    if telling:
        return exc.errors[min(telling)]
    if isinstance(cause, PublishError):
        return unwrap(cause)
    return UnavailableError(str(exc)) if isinstance(cause, OSError) else AckTimeoutError(str(exc))


def suspects_after(
    error: LiftbridgeError, path: str, partitions: Iterable[int], leaders: Mapping[int, str]
) -> dict[int, set[str]]:
    """Partition -> brokers that may still store records of ``partitions`` later: after an ack
    timeout over gRPC, the leader they were sent to (it may be stopped, with the records unread
    in its socket; it forwards them when it wakes). Over NATS the records wait in the leader's
    NATS subscription, which a leader that lost its leadership meanwhile does not append to."""
    if path == "nats" or not isinstance(error, RequestTimeoutError):
        return {}
    return {p: {leaders[p]} for p in partitions if leaders.get(p)}


def suspects_at_start(partitions: Mapping[int, PartitionInfo], resumed: Iterable[int]) -> dict[int, set[str]]:
    """Partition -> replicas out of the ISR, for the ``resumed`` partitions (an earlier try wrote
    there): one of them may be a former leader that was stopped with that try's records unread
    and has not woken yet. A healthy partition has none."""
    return {p: set(info.replicas) - set(info.isr) for p, info in partitions.items() if p in resumed}


class Resumption:
    """Runs a step until it succeeds, resuming after resumable failures; builds the final errors.

    :param producer_id: / :param stream: for the messages.
    :param max_resumes: failures in a row resumed before giving up.
    :param backoff: first wait after a failure, seconds (doubled per failure, at most 5 s).
    :param timer: the clock.
    :param missing_for_sure: whether a "no such stream" answer is to be believed now.
    """

    def __init__(
        self,
        producer_id: str,
        stream: str,
        *,
        max_resumes: int,
        backoff: float,
        timer: Timer,
        missing_for_sure: Callable[[], bool],
    ) -> None:
        self.producer_id = producer_id
        self.stream = stream
        self.max_resumes = max_resumes
        self.backoff = backoff
        self.timer = timer
        self.missing_for_sure = missing_for_sure

    def run(self, result: ExactlyOnceResult, step: Callable[[], object], what: str) -> None:
        """Run ``step`` until it succeeds, resuming after resumable failures, with backoff.

        :raises ExactlyOncePublishError: (or a subclass) it failed in a way a resumption cannot
            fix, or more than ``max_resumes`` times in a row.
        """
        failures = 0
        while True:
            try:
                step()
                return
            except LiftbridgeError as exc:
                self._stop_unless_resumable(result, what, exc)
                failures += 1
                if failures > self.max_resumes:
                    raise self.failed(result, what, exc, after=failures - 1) from exc
                result.resumes += 1
                wait = min(5.0, self.backoff * 2 ** (failures - 1)) * random.uniform(0.75, 1.0)
                log.warning(
                    "Producer %r on stream %r: %s failed (%s: %s); resuming in %.1f s (%d of %d)",
                    self.producer_id,
                    self.stream,
                    what,
                    type(exc).__name__,
                    exc,
                    wait,
                    failures,
                    self.max_resumes,
                )
                self.timer.sleep(wait)

    def _stop_unless_resumable(self, result: ExactlyOnceResult, what: str, exc: LiftbridgeError) -> None:
        if isinstance(exc, TailNotSettled):
            raise self.unsettled(result, what, exc) from None
        if isinstance(exc, BrokerStillSilent):
            raise self.silent(result, what, exc) from None
        if isinstance(exc, ProducerStillWriting):
            raise self.concurrent(result, what, exc) from None
        if isinstance(exc, LogShorter):
            raise self.truncated(result, what, exc) from None
        if isinstance(exc, RecountMismatch):
            raise self.mismatch(result, what, exc) from None
        if isinstance(exc, MISSING) and self.missing_for_sure():
            raise self.failed(result, what, exc) from exc
        if isinstance(exc, ExactlyOnceError) or not isinstance(exc, RESUMABLE + MISSING):
            raise self.failed(result, what, exc) from exc

    def _so_far(self, result: ExactlyOnceResult) -> str:
        return f"{result.written} record(s) written and {result.skipped} skipped so far"

    def unsettled(self, result: ExactlyOnceResult, what: str, exc: TailNotSettled) -> UncommittedTailError:
        """The error for a tail that did not settle in time."""
        info = exc.info
        return UncommittedTailError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped while {what}: "
            f"partition {info.id} holds {info.newest_offset - info.high_watermark} record(s) above its high "
            f"watermark (newest offset {info.newest_offset}, high watermark {info.high_watermark}) that were "
            f"neither committed nor truncated within {exc.waited:g} s (a replica is stalled or the leader is "
            "failing over). Those records cannot be read yet, so whether they include ours cannot be told, and "
            f"nothing more was sent. {self._so_far(result)}; publishing again with the same producer id resumes "
            "without duplicates once the partition has settled (raise tail_wait to wait longer).",
            result,
            partition=info.id,
            high_watermark=info.high_watermark,
            newest_offset=info.newest_offset,
        )

    def silent(self, result: ExactlyOnceResult, what: str, exc: BrokerStillSilent) -> SilentBrokerError:
        """The error for a broker holding records of unknown fate that stayed silent."""
        return SilentBrokerError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped while {what}: "
            f"records sent to broker {exc.broker!r} (partition {exc.partition}) got no ack, and that broker has "
            f"neither answered again nor gone away within {exc.waited:g} s. A stopped broker carries out what it "
            "received when it wakes, even after the client gave up, so those records may still be stored: they "
            f"were not sent again. {self._so_far(result)}; check broker {exc.broker!r}, then publish again with the "
            "same producer id once it runs again or is gone: that resumes without duplicates (a stream created with "
            "optimistic_concurrency_control=True refuses a late copy in any case).",
            result,
            broker=exc.broker,
            partition=exc.partition,
        )

    def concurrent(self, result: ExactlyOnceResult, what: str, exc: ProducerStillWriting) -> ConcurrentProducerError:
        """The error for another writer of this producer id."""
        first, last = exc.offsets
        if exc.duplicates:
            happened = (
                f"{exc.duplicates} of its sequence numbers are now in the stream twice (between offsets {first} and "
                f"{last} of partition {exc.partition})"
            )
        else:
            happened = (
                f"its records kept arriving in partition {exc.partition} (offsets {first} to {last}) for "
                f"{exc.waited:g} s, so nothing was written beside them"
            )
        return ConcurrentProducerError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped while {what}: "
            f"another writer with the same producer id is publishing (a zombie try of this task still running, or "
            f"a stopped broker that delivered records late); {happened}. {self._so_far(result)}. Stop the other try "
            "(find the task process still running for this task instance), then publish again with the same "
            "producer id: it skips what is in the stream. A stream created with optimistic_concurrency_control=True "
            "fences such a writer.",
            result,
            partition=exc.partition,
            duplicates=exc.duplicates,
        )

    #: What a caller can do about a replaced history (TruncatedLogError, HistoryMismatchError).
    _REPLACED_ADVICE = (
        "Nothing more was sent. Publishing again with the same producer id sends again whatever the partition's "
        "current leader lacks; first check that every broker names the same leader (a deposed one answers from its "
        "own, shorter, log until it learns of the change) and that the replicas hold the same records: on "
        "Liftbridge v1.9.0-72 a follower cut to a lagging high watermark can be elected after fast leader changes "
        "(docs/reliability.md, seed 59919), and a replica that kept the other history may lead later, with those "
        "records then stored twice."
    )

    def truncated(self, result: ExactlyOnceResult, what: str, exc: LogShorter) -> TruncatedLogError:
        """The error for a partition that lost records seen committed (ack policy ALL)."""
        if exc.how == "ack":
            seen = (
                f"an ack put one of this producer's records at offset {exc.newest_offset}, at or below offset "
                f"{exc.committed_offset}, which this publisher had already seen committed"
            )
        else:
            seen = (
                f"the partition now ends at offset {exc.newest_offset}, below offset {exc.committed_offset}, which "
                "this publisher had seen committed"
            )
        return TruncatedLogError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped while {what}: "
            f"partition {exc.partition}: {seen} (acknowledged with ack policy ALL, or below a high watermark it "
            f"read). So records acknowledged with ALL are no longer there: the replicas' histories diverged, or a "
            f"deposed leader answered. {self._so_far(result)}. {self._REPLACED_ADVICE}",
            result,
            partition=exc.partition,
            newest_offset=exc.newest_offset,
            committed_offset=exc.committed_offset,
            # An ack's own offset held a committed record too; a newest offset still holds one.
            missing=exc.committed_offset - exc.newest_offset + (1 if exc.how == "ack" else 0),
        )

    def mismatch(self, result: ExactlyOnceResult, what: str, exc: RecountMismatch) -> HistoryMismatchError:
        """The error for a read after a leader change that did not find each record exactly once."""
        read = ", ".join(f"partition {p} offsets {a} to {b}" for p, (a, b) in sorted(exc.read.items()))
        return HistoryMismatchError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} failed while {what}: "
            f"a partition's leader changed during the call, and reading this producer's records again ({read}) "
            f"found {exc.missing} sequence number(s) counted as stored missing and {exc.twice} stored twice. The "
            f"stream's history was replaced under the call (with ack policy LEADER, records acknowledged by a "
            f"failed leader alone are lost this way; with ALL, the replicas diverged). {self._so_far(result)}. "
            f"{self._REPLACED_ADVICE}",
            result,
            partition=exc.partition,
            missing=exc.missing,
            twice=exc.twice,
        )

    def failed(
        self, result: ExactlyOnceResult, what: str, exc: LiftbridgeError, after: int | None = None
    ) -> ExactlyOncePublishError:
        """The error for a failure that resuming did not (or cannot) fix."""
        tries = f" after {after} resumption(s)" if after is not None else ""
        hint = ""
        if isinstance(exc, IncorrectOffsetError):
            hint = (
                " Another writer kept moving the partition (optimistic concurrency control refused the expected "
                "offset): stop the other writer, or publish to another partition."
            )
        # A resumable cause clears by itself; any other (cursors off, read-only, too large) must be fixed first.
        again = "publishing again" if isinstance(exc, RESUMABLE + MISSING) else "once that is fixed, publishing again"
        return ExactlyOncePublishError(
            f"exactly-once publish of producer {self.producer_id!r} to stream {self.stream!r} stopped{tries} while "
            f"{what}: {type(exc).__name__}: {str(exc).rstrip('.')}. {self._so_far(result)}; {again} with the same "
            f"producer id resumes without duplicates.{hint}",
            result,
        )
