"""The reception clock: a test hook that moves the timestamps the dev server gives a stream's messages.

Liftbridge stamps each message with the leader's wall clock when it takes the message in
(``server/partition.go``: ``natsToProtoMessage`` sets ``Timestamp: timestamp()``, the
``time.Now().UnixNano()`` of the leader). A test of interval reads needs messages that were
received "last Tuesday at 10:05" without waiting for it: :func:`set_reception_clock` makes the
dev server stamp a stream's new messages as if its clock read ``at`` now (and runs on from there
in real time); :func:`set_reception_clock` with ``None`` goes back to the real clock.

The shift is per stream name and process-wide: it reaches every broker of an in-process
:class:`~.server.DevServer` (one process, one registry), not a :class:`~.process.DevServerProcess`
(another process). Timestamps still never go backwards within a partition (a time set before the
partition's newest message stamps the next ones at that message's time), as the time index
needs. Nothing of it is stored: a restarted server stamps with the real clock.
"""

from __future__ import annotations

import datetime as dt
import time

__all__ = ["RECEPTION_SHIFTS", "clock_shift_ns", "set_reception_clock"]

#: Per stream name, nanoseconds added to its reception timestamps (empty: the real clock everywhere).
RECEPTION_SHIFTS: dict[str, int] = {}


def set_reception_clock(stream: str, at: dt.datetime | None) -> None:
    """Stamp ``stream``'s next messages as if the clock read ``at`` now (``None``: the real clock).

    :raises ValueError: ``at`` is a naive datetime.
    """
    if at is None:
        RECEPTION_SHIFTS.pop(stream, None)
        return
    if at.tzinfo is None:
        raise ValueError(f"at must be an aware datetime (with a time zone), got {at!r}")
    RECEPTION_SHIFTS[stream] = int(at.timestamp() * 1_000_000_000) - time.time_ns()


def clock_shift_ns(stream: str) -> int:
    """Nanoseconds added to ``stream``'s reception timestamps (0 unless a test set its clock)."""
    return RECEPTION_SHIFTS.get(stream, 0)
