"""Every stream's message rate, from the view's own samples of the metadata its Streams tab reads
anyway (docs/ui.md, "Streams"): no call of its own, whether or not a task reads the stream.

Each answer of the Streams endpoint reads FetchMetadata for the whole cluster; that gives every
partition's high watermark (its last committed offset), so messages committed per stream. The
api-server keeps, per cluster, a few of those counts with the time they were read (a **sample**,
at most one per :data:`SAMPLE_EVERY` seconds, none older than :data:`KEEP_FOR`), and a stream's
rate is the growth of its count since the newest sample at least :data:`MIN_SPAN` old, over that
time. With the page refreshing every 30 s, that is the rate over the last 30 s. A stream has no
rate on the first look (nothing to compare with) nor in the first :data:`MIN_SPAN` seconds after a
sample, nor when it was deleted and created again in between (its creation time differs).

The samples live in the api-server process's memory: each worker process has its own (one that
has not answered the Streams tab in :data:`MIN_SPAN` seconds has no rate yet), a restart forgets
them. Memory: one integer per stream and sample, at most :data:`MAX_SAMPLES` samples per cluster.

Imports no Airflow.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_liftbridge.client import StreamInfo

__all__ = ["KEEP_FOR", "MIN_SPAN", "SAMPLE_EVERY", "RateSampler", "SAMPLER"]

#: Seconds between two samples of one cluster kept, at least.
SAMPLE_EVERY = 5.0
#: A rate spans at least this many seconds.
MIN_SPAN = 5.0
#: Samples older than this (seconds) are dropped; so a rate spans at most this.
KEEP_FOR = 600.0
#: Samples kept per cluster, at most (about 120 bytes per stream each: under 4 MB at 1,000 streams).
MAX_SAMPLES = 32

Counts = dict[tuple[str, int], int]  # (stream, creation time) -> messages committed


def committed(streams: Mapping[str, StreamInfo]) -> Counts:
    """Messages ever committed per stream (offsets 0 to each partition's high watermark)."""
    return {
        (name, info.creation_timestamp): sum(max(p.high_watermark + 1, 0) for p in info.partitions.values())
        for name, info in streams.items()
    }


class RateSampler:
    """The samples of each cluster (keyed by the caller: its broker ids), and rates from them."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: dict[str, deque[tuple[float, Counts]]] = {}

    def rates(self, cluster: str, streams: Mapping[str, StreamInfo]) -> dict[str, dict[str, Any]]:
        """Per stream of ``streams`` (just read from ``cluster``): ``rate`` (messages per second,
        ``None`` while there is nothing to compare with), ``rate_messages`` (committed since the
        sample compared with) and ``rate_span_s`` (its age). Keeps ``streams`` as a sample if the
        newest one is :data:`SAMPLE_EVERY` seconds old or more."""
        now, counts = self._clock(), committed(streams)
        with self._lock:
            samples = self._samples.setdefault(cluster, deque(maxlen=MAX_SAMPLES))
            while samples and now - samples[0][0] > KEEP_FOR:
                samples.popleft()
            base = next((s for s in reversed(samples) if now - s[0] >= MIN_SPAN), None)
            if not samples or now - samples[-1][0] >= SAMPLE_EVERY:
                samples.append((now, counts))
        found: dict[str, dict[str, Any]] = {}
        for (name, created), count in counts.items():
            before = base[1].get((name, created)) if base is not None else None
            if base is None or before is None:
                found[name] = {"rate": None, "rate_messages": None, "rate_span_s": None}
                continue
            span = now - base[0]
            found[name] = {"rate": (count - before) / span, "rate_messages": count - before, "rate_span_s": span}
        return found


#: The api-server's sampler (one per process).
SAMPLER = RateSampler()
