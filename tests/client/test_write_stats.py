"""Write statistics from acks (client/write_stats.py): the histogram's percentiles, merging, JSON."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

from airflow_provider_liftbridge.client.write_stats import LatencyHistogram, WriteStats


def test_percentiles_are_within_two_percent_and_max_is_exact() -> None:
    rng = random.Random(7)
    samples = [int(rng.lognormvariate(14, 1.0)) for _ in range(10_000)]  # ~1 ms, long tail
    hist = LatencyHistogram()
    for ns in samples:
        hist.add(ns)
    ordered = sorted(samples)
    for q in (0.5, 0.99):
        exact = ordered[int(q * len(ordered)) - 1]
        assert abs(hist.percentile(q) - exact) <= 0.021 * exact
    assert hist.max_ns == ordered[-1] and hist.count == len(samples)
    assert len(hist.buckets) < 1000  # small whatever the number of samples


def test_summary_merge_and_json_round_trip() -> None:
    clock = iter(range(10**9, 10**12, 10**6))
    a = WriteStats(clock=lambda: next(clock))
    b = WriteStats(clock=lambda: next(clock))
    for stats, lat in ((a, 1_000_000), (b, 3_000_000)):
        for _ in range(100):
            sent = stats.now()
            stats.acked(sent, SimpleNamespace(reception_timestamp=sent + lat, commit_timestamp=sent + 2 * lat), 10)
    b.acked(b.now(), SimpleNamespace(reception_timestamp=0, commit_timestamp=0), 10)  # clock skew: counts as 0
    merged = WriteStats.from_json(json.loads(json.dumps(a.to_json())))
    merged.merge(WriteStats.from_json(b.to_json()))
    s = merged.summary()
    json.dumps(s)
    assert s["acks"] == 201 and s["bytes"] == 2010
    assert s["to_leader_ms"]["max"] == 3.0 and s["to_commit_ms"]["max"] == 6.0
    assert 0.98 <= s["to_leader_ms"]["p50"] <= 1.02 or 2.94 <= s["to_leader_ms"]["p50"] <= 3.06
    assert s["seconds"] > 0 and s["records_per_second"] > 0
    assert "publish->commit ms p50" in merged.log_line()


def test_a_batch_of_acks_counts_as_the_same_acks_one_by_one() -> None:
    rng = random.Random(3)
    sent = [10**12 + i for i in range(500)] + [0] * 20  # 0: no send time noted, counted as now
    acks = [
        SimpleNamespace(
            reception_timestamp=10**12 + rng.randrange(-5000, 10**7), commit_timestamp=10**12 + rng.randrange(10**8)
        )
        for _ in sent
    ]
    one_by_one, at_once = WriteStats(clock=lambda: 10**12 + 42), WriteStats(clock=lambda: 10**12 + 42)
    for t, ack in zip(sent, acks, strict=True):
        one_by_one.acked(t or one_by_one.now(), ack, 3)

    at_once.acked_many(sent, acks, 3 * len(sent))

    assert at_once.to_json() == one_by_one.to_json()
    assert at_once.acks == len(sent) and at_once.to_reception.max_ns == one_by_one.to_reception.max_ns
