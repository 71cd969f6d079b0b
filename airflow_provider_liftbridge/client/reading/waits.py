"""What a reading waits for before it plans, as a value: :class:`Wait` says how to look once
(:meth:`Wait.ready`), how to wait in this process (:meth:`Wait.poll`) and which trigger waits
instead (:attr:`Wait.trigger`, :meth:`Wait.trigger_arguments`). The strategies
(:mod:`.strategies`) make them: :class:`MessagesWait` for ``min_messages``, :class:`IntervalWait`
for an interval to be complete.

Imports neither Airflow nor PySpark.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import Any

from ..errors import LiftbridgeError, NotLeaderError, PartitionPausedError, RequestTimeoutError, UnavailableError
from .interval import IntervalBounds, IntervalPlanner
from .plan import RangePlanner

__all__ = [
    "MESSAGES_POLL",
    "TRANSIENT_LOOK_ERRORS",
    "IntervalWait",
    "MessagesWait",
    "Wait",
    "WaitTimedOutError",
]

#: Seconds between two looks at the stream while a wait runs in the reading process.
MESSAGES_POLL = 1.0
#: Failures of one look at the stream that the in-process ``min_messages`` wait outlasts (no broker
#: reachable after the client's retries, e.g. while one restarts; a deadline missed under load; a
#: leader or a pause moving): it looks again until the timeout. The look is only a way to stop
#: waiting early, so it never fails the task by itself (as the deferred wait leaves it to the trigger).
TRANSIENT_LOOK_ERRORS = (UnavailableError, RequestTimeoutError, NotLeaderError, PartitionPausedError)


class WaitTimedOutError(LiftbridgeError):
    """What a reading waited for did not come within its time (the message names it and the fix)."""


class Wait(ABC):
    """What a reading waits for before it plans. :meth:`ready` is one cheap look (no loop);
    :meth:`poll` waits in this process; :attr:`trigger` names the trigger that waits instead and
    :meth:`trigger_arguments` gives its arguments (to call only after :meth:`ready` said no)."""

    #: The trigger that waits for the same condition: ``"offset"`` or ``"interval"``.
    trigger: str
    #: Seconds the deferred wait may take (``None``: as long as the trigger runs).
    timeout: float | None = None

    @abstractmethod
    def ready(self) -> bool:
        """One look: whether the condition holds now."""

    @abstractmethod
    def trigger_arguments(self) -> dict[str, Any]:
        """The trigger's arguments (``stream``, partition(s), target), but not the connection."""

    @abstractmethod
    def poll(self) -> None:
        """Return once the condition holds, looking every :data:`MESSAGES_POLL` seconds.

        :raises WaitTimedOutError: it did not hold in time.
        """


class MessagesWait(Wait):
    """Wait until ``wanted`` messages are there to read on the planner's partitions."""

    trigger = "count"

    def __init__(
        self, planner: RangePlanner, partitions: list[int], wanted: int, timeout: float, log: logging.Logger
    ) -> None:
        self.planner, self.partitions, self.wanted, self.timeout, self.log = planner, partitions, wanted, timeout, log
        self._pending: dict[int, int] = {}

    def ready(self) -> bool:
        self._pending = self.planner.pending(self.partitions)
        return sum(self._pending.values()) >= self.wanted

    def trigger_arguments(self) -> dict[str, Any]:
        """Wait for the messages still missing on all the partitions together: each counts from its
        position + 1 (or, without a position, from where its pending messages start)."""
        planner = self.planner
        pending = self._pending or planner.pending(self.partitions)
        missing = self.wanted - sum(pending.values())
        starts = {}
        for partition, waiting in pending.items():
            position = planner.client.fetch_cursor(planner.position_cursor, planner.stream, partition)
            starts[partition] = position + 1 if position >= 0 else planner.high_watermark(partition) + 1 - waiting
        return {"stream": planner.stream, "starts": starts, "count": sum(pending.values()) + missing}

    def poll(self) -> None:
        wanted, timeout = self.wanted, float(self.timeout or 0)
        deadline = time.monotonic() + timeout
        have, failed, waiting = 0, "", False
        while True:
            try:
                have, failed = sum(self.planner.pending(self.partitions).values()), ""
            except TRANSIENT_LOOK_ERRORS as error:
                failed = f"{type(error).__name__}: {error}"
                self.log.warning("looking for min_messages failed (%s): looking again in %g s", failed, MESSAGES_POLL)
            else:
                if have >= wanted:
                    self.log.info("%d message(s) to read (min_messages %d)", have, wanted)
                    return
                if not waiting:
                    self.log.info("%d of min_messages=%d message(s) there: waiting up to %g s", have, wanted, timeout)
                    waiting = True
            if time.monotonic() >= deadline:
                raise WaitTimedOutError(
                    f"only {have} of min_messages={wanted} message(s) arrived on stream {self.planner.stream!r} "
                    f"partitions {self.partitions} within poll_timeout={timeout:g} s: raise poll_timeout or lower "
                    "min_messages" + (f" (the last look at the stream failed: {failed})" if failed else "")
                )
            time.sleep(MESSAGES_POLL)


class IntervalWait(Wait):
    """Wait until every partition is complete for the interval."""

    trigger = "interval"

    def __init__(self, planner: IntervalPlanner, partitions: list[int], timeout: float, log: logging.Logger) -> None:
        self.planner, self.partitions, self.poll_timeout, self.log = planner, partitions, timeout, log
        self._waiting: list[IntervalBounds] = []

    def ready(self) -> bool:
        self._waiting = self.planner.incomplete(self.partitions)
        return not self._waiting

    def trigger_arguments(self) -> dict[str, Any]:
        planner = self.planner
        bounds = self._waiting or planner.incomplete(self.partitions) or [planner.bounds(p) for p in self.partitions]
        self.log.info(
            "partition(s) %s not complete for the interval (high watermarks %s): waiting in the triggerer for "
            "a committed message at or after the end, or the end of the allowed lateness",
            [b.partition for b in bounds],
            [b.high_watermark for b in bounds],
        )
        return {
            "stream": planner.stream,
            "partitions": [b.partition for b in bounds],
            "end_ns": planner.interval.end_ns,
            "lateness_ns": planner.lateness_ns,
        }

    def poll(self) -> None:
        planner = self.planner
        deadline_ns = max(planner.complete_at_ns, time.time_ns()) + int(self.poll_timeout * 1e9)
        logged = False
        while True:
            waiting = planner.incomplete(self.partitions)
            if not waiting:
                return
            if not logged:
                self.log.info(
                    "partition(s) %s not complete for the interval yet: waiting for a later message or the end of "
                    "the allowed lateness",
                    [b.partition for b in waiting],
                )
                logged = True
            if time.time_ns() >= deadline_ns:
                raise WaitTimedOutError(
                    f"stream {planner.stream!r} partition(s) {[b.partition for b in waiting]} were not complete for "
                    f"the interval {planner.interval.key} by the end of lateness + poll_timeout: messages are "
                    "written but not committed (is a replica down?); raise poll_timeout or look at the cluster"
                )
            time.sleep(MESSAGES_POLL)
