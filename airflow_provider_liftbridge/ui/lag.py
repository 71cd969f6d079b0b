"""Lag as a verdict: the status of a partition, a pipeline or a consumer group from a window of
its commits, after Burrow's evaluation rules (``linkedin/Burrow``,
``core/internal/evaluator/caching.go``, ``calculatePartitionStatus``; its wiki page "Consumer Lag
Evaluation Rules"), and the user's thresholds on top. Pure functions: no client, no Airflow.

A *commit* is one observation of a reader's committed position: when, the offset, and the lag
then (committed messages after it). What a window holds for pipelines and for groups is the
caller's business (see :mod:`.samples` and ``docs/ui.md``, "Lag as a verdict").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "STATUSES",
    "WINDOW",
    "Commit",
    "Thresholds",
    "over_threshold",
    "parse_thresholds",
    "partition_status",
    "worst",
]

#: The statuses, least to most severe.
STATUSES = ("OK", "WARN", "STALL", "STOP", "ERR")
#: Commits in a window: Burrow's default (``intervals`` of its storage module).
WINDOW = 10


@dataclass(frozen=True, slots=True)
class Commit:
    """A committed position seen at ``time`` (epoch seconds): ``offset`` (``-1``: nothing
    committed yet) and ``lag``, the committed messages after it then."""

    time: float
    offset: int
    lag: int


@dataclass(frozen=True, slots=True)
class Thresholds:
    """A user's limits for one pipeline or group: above ``max_lag`` messages, or an oldest unread
    message older than ``max_lag_age_s`` seconds, an otherwise OK reader is WARN. ``None``: no limit."""

    max_lag: int | None = None
    max_lag_age_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"max_lag": self.max_lag, "max_lag_age_s": self.max_lag_age_s}


def _limit(value: Any, name: str, where: str, kind: type) -> Any:
    if value is None:
        return None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok or (kind is int and value != int(value)):
        what = "a whole number of messages" if kind is int else "a number of seconds"
        raise ValueError(f"{where}: {name} must be {what} (0 or more), got {value!r}")
    return kind(value)


def parse_thresholds(data: Any) -> dict[str, Thresholds]:
    """The thresholds of an Airflow Variable's JSON value: ``{"<dag_id>.<task_id>" or
    "group:<group id>": {"max_lag": <messages>, "max_lag_age_s": <seconds>}}``.

    :raises ValueError: not such an object; the message names the entry and the field.
    """
    if not isinstance(data, Mapping):
        raise ValueError(
            'the thresholds must be a JSON object such as {"my_dag.my_task": {"max_lag": 1000, "max_lag_age_s": 600}},'
            f" got {type(data).__name__}"
        )
    out = {}
    for name, limits in data.items():
        if not isinstance(limits, Mapping):
            raise ValueError(f"{name!r}: give an object with max_lag and/or max_lag_age_s, got {limits!r}")
        unknown = sorted(set(limits) - {"max_lag", "max_lag_age_s"})
        if unknown:
            raise ValueError(f"{name!r}: unknown field(s) {', '.join(unknown)}: use max_lag and max_lag_age_s")
        out[str(name)] = Thresholds(
            _limit(limits.get("max_lag"), "max_lag", repr(name), int),
            _limit(limits.get("max_lag_age_s"), "max_lag_age_s", repr(name), float),
        )
    return out


def _verdict(status: str, rule: str, reason: str) -> dict[str, str]:
    return {"status": status, "rule": rule, "reason": reason}


def _burrow(window: Sequence[Commit], lag: int, now: float, *, stop_rule: bool) -> dict[str, str]:
    """Burrow's rules 1 to 5, the first that holds decides (see ``docs/ui.md``)."""
    if lag == 0:
        return _verdict("OK", "no-lag", "nothing unread now")
    if any(c.lag == 0 for c in window):
        return _verdict("OK", "caught-up", "caught up at least once in the window")
    if len(window) < 2:
        return _verdict("OK", "window", f"{len(window)} commit(s) so far: a verdict needs 2")
    pairs = list(zip(window, window[1:], strict=False))
    if any(b.offset < a.offset for a, b in pairs):
        return _verdict("ERR", "rewind", "the committed position moved back within the window")
    first, last = window[0].time, window[-1].time
    if stop_rule and now - last > last - first:
        return _verdict(
            "STOP", "stopped", "no commit for longer than the window spans, while there is something to read"
        )
    if all(b.offset == a.offset for a, b in pairs):
        return _verdict("STALL", "stalled", "committed the same position throughout the window, with lag")
    if all(b.lag >= a.lag for a, b in pairs):
        return _verdict("WARN", "lag-growing", "reading, but the lag did not go down once in the window")
    return _verdict("OK", "keeping-up", "the lag went down within the window")


def partition_status(
    commits: Iterable[Commit],
    lag: int,
    now: float,
    *,
    lag_age_s: float | None = None,
    thresholds: Thresholds | None = None,
    stop_rule: bool = True,
) -> dict[str, Any]:
    """The verdict on one partition: ``{"status", "rule", "reason", "window", "complete"}``.

    ``commits`` (oldest first; the newest :data:`WINDOW` are used), the lag now and the time now
    go through Burrow's rules; then, an OK partition over a threshold is WARN (rule
    ``threshold``). ``stop_rule=False`` leaves out Burrow's STOP rule (the caller decides STOP
    another way: consumer groups, by membership). ``complete`` is the window's fill (0 to 1).
    """
    window = sorted(commits, key=lambda c: c.time)[-WINDOW:]
    verdict = over_threshold(_burrow(window, lag, now, stop_rule=stop_rule), lag, lag_age_s, thresholds)
    return verdict | {"window": len(window), "complete": min(1.0, len(window) / WINDOW)}


def over_threshold(
    verdict: dict[str, Any], lag: int, lag_age_s: float | None, thresholds: Thresholds | None
) -> dict[str, Any]:
    """``verdict``, or WARN (rule ``threshold``) when it is OK and the lag or its age is over a
    user's threshold."""
    if verdict["status"] != "OK" or thresholds is None:
        return verdict
    over = []
    if thresholds.max_lag is not None and lag > thresholds.max_lag:
        over.append(f"lag {lag} > {thresholds.max_lag} messages")
    if thresholds.max_lag_age_s is not None and lag_age_s is not None and lag_age_s > thresholds.max_lag_age_s:
        over.append(f"oldest unread {lag_age_s:.0f} s > {thresholds.max_lag_age_s:.0f} s")
    return _verdict("WARN", "threshold", "over the threshold: " + "; ".join(over)) if over else verdict


def worst(verdicts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The verdict of a pipeline or group: its worst partition's (the first of equals); OK when
    it has none."""
    found: dict[str, Any] | None = None
    for verdict in verdicts:
        if found is None or STATUSES.index(verdict["status"]) > STATUSES.index(found["status"]):
            found = dict(verdict)
    return found or {"status": "OK", "rule": "no-partitions", "reason": "no partition to judge", "window": 0}
