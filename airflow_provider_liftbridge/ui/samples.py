"""Lag between runs: samples of each pipeline's and consumer group's positions, taken when the
view's lag or groups endpoint is asked, kept in Liftbridge (no database of the view's own).

A sample is what the endpoint just computed for one pipeline or group and one stream: the time,
and per partition the committed position, the high watermark, the lag and the age of the oldest
unread message. It is appended to :data:`SAMPLES_STREAM` (one partition; created by the view with
a retention limit of :data:`SAMPLES_MAX_MESSAGES` and :data:`SAMPLES_MAX_AGE`) only when the newest
sample of that pipeline or group is at least :data:`SAMPLE_EVERY` seconds old, so any number of
open pages and api-server workers add at most about one sample a minute per pipeline or group
while someone looks, and none while nobody does. Failing to write one is logged, not shown.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient, LiftbridgeError
from airflow_provider_liftbridge.client.reading.registry import publish_entry, tail_entries

__all__ = ["MAX_SAMPLES_READ", "SAMPLES_STREAM", "SAMPLE_EVERY", "Sample", "read_samples", "take_samples"]

log = logging.getLogger(__name__)

#: The samples stream (and its subject).
SAMPLES_STREAM = "airflow-liftbridge-lag-samples"
#: Its retention: at most this many samples, none older than :data:`SAMPLES_MAX_AGE`.
SAMPLES_MAX_MESSAGES = 20_000
SAMPLES_MAX_AGE = timedelta(days=7)
#: Seconds between two samples of one pipeline or group, at least.
SAMPLE_EVERY = 60.0
#: The newest this many samples are read per request.
MAX_SAMPLES_READ = 4_000

Key = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at a pipeline (``kind`` ``"pipeline"``, ``name`` ``dag_id.task_id``) or a group
    (``"group"``, its id) on ``stream`` at ``time`` (epoch seconds): per partition
    ``(position, high watermark, lag, age of the oldest unread message in seconds or None)``."""

    kind: str
    name: str
    stream: str
    time: float
    partitions: Mapping[int, tuple[int, int, int, float | None]]

    @property
    def key(self) -> Key:
        return (self.kind, self.name, self.stream)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind,
                "name": self.name,
                "stream": self.stream,
                "time": round(self.time, 3),
                "partitions": {str(p): list(row) for p, row in sorted(self.partitions.items())},
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, value: bytes) -> Sample:
        """:raises InvalidArgumentError: not a sample."""
        try:
            data: dict[str, Any] = json.loads(value)
            partitions = {
                int(p): (int(pos), int(hw), int(lag), None if age is None else float(age))
                for p, (pos, hw, lag, age) in data["partitions"].items()
            }
            return cls(str(data["kind"]), str(data["name"]), str(data["stream"]), float(data["time"]), partitions)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise InvalidArgumentError(f"not a lag sample ({type(exc).__name__}: {exc})") from None

    def to_point(self) -> dict[str, Any]:
        """For the page: the time, the lag over all partitions and the oldest unread message's age."""
        ages = [row[3] for row in self.partitions.values()]
        known = [age for age in ages if age is not None]
        return {
            "time": self.time,
            "lag": sum(row[2] for row in self.partitions.values()),
            "lag_age_s": max(known, default=0.0) if len(known) == len(ages) else None,
        }


def read_samples(client: LiftbridgeClient) -> dict[Key, list[Sample]]:
    """The newest :data:`MAX_SAMPLES_READ` samples per (kind, name, stream), oldest first.

    :raises LiftbridgeError: the stream could not be read.
    """
    found: dict[Key, list[Sample]] = {}
    for sample in tail_entries(client, SAMPLES_STREAM, MAX_SAMPLES_READ, Sample.from_json):
        found.setdefault(sample.key, []).append(sample)
    for samples in found.values():
        samples.sort(key=lambda s: s.time)
    return found


def take_samples(client: LiftbridgeClient, known: dict[Key, list[Sample]], fresh: Iterable[Sample]) -> None:
    """Append each ``fresh`` sample whose pipeline's or group's newest known sample is at least
    :data:`SAMPLE_EVERY` seconds older (to the stream, and to ``known``). A failure is logged and
    ends the sampling of this request: the page does not depend on it."""
    for sample in fresh:
        before = known.get(sample.key)
        if before and sample.time - before[-1].time < SAMPLE_EVERY:
            continue
        try:
            publish_entry(
                client,
                SAMPLES_STREAM,
                "\x1f".join(sample.key).encode(),
                sample.to_json(),
                retention_max_messages=SAMPLES_MAX_MESSAGES,
                retention_max_age=SAMPLES_MAX_AGE,
            )
        except LiftbridgeError as exc:
            log.warning("the Liftbridge view could not store a lag sample in %s: %s", SAMPLES_STREAM, exc)
            return
        known.setdefault(sample.key, []).append(sample)
