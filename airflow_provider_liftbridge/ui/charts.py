"""What the Liftbridge view charts, from the run history (:mod:`~airflow_provider_liftbridge.
client.reading.history`) with the client only (no Airflow, no FastAPI here): per pipeline and
partition the lag and the messages read per run, per stream the message rate between runs. A
task reading by interval is charted by the start of the interval each run read (each run carries
its interval), so a backfill's past intervals appear in their order.

The history holds what the reading tasks saw when their tries ended; nothing here reads a
message's contents, so the charts need the connection, not the ``Liftbridge Messages`` view.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow_provider_liftbridge.client import InvalidArgumentError, LiftbridgeClient
from airflow_provider_liftbridge.client.reading import Interval, RunEntry, read_history

__all__ = ["MAX_HISTORY", "MAX_RUNS", "history"]

#: At most this many history entries are read per request (the newest).
MAX_HISTORY = 2_000
#: At most this many runs are charted per pipeline (the newest).
MAX_RUNS = 50


def _interval(entry: RunEntry) -> dict[str, Any] | None:
    """A run's interval as ISO 8601 ``start``/``end`` and ``start_time`` in epoch seconds (``None``: by position)."""
    if entry.interval is None:
        return None
    start, end = entry.interval
    try:
        return Interval.from_ms(start, end).to_dict() | {"start_time": start / 1000}
    except InvalidArgumentError:
        return None


def _pipeline_runs(entries: list[RunEntry], runs: int) -> list[dict[str, Any]]:
    by_task: dict[tuple[str, str, int, str], list[RunEntry]] = {}
    for entry in entries:
        by_task.setdefault((entry.dag_id, entry.task_id, entry.map_index, entry.stream), []).append(entry)
    out = []
    for (dag_id, task_id, map_index, stream), tries in sorted(by_task.items()):
        partitions = sorted({p for t in tries for p in t.partitions})
        chosen = [
            {
                "run_id": t.run_id,
                # The run's page, relative to Airflow's base URL (as the pipelines' links).
                "link": f"dags/{quote(dag_id, safe='')}/runs/{quote(t.run_id, safe='')}",
                "time": t.recorded_at / 1000,
                "interval": _interval(t),
                "partitions": {
                    str(p): {"lag": r.lag, "processed": r.processed, "dead_lettered": r.dead_lettered}
                    for p, r in sorted(t.partitions.items())
                },
            }
            for t in tries[-runs:]
        ]
        by_interval = any(run["interval"] for run in chosen)
        if by_interval:  # charted by the interval read, not by when: a backfill's past hours in order
            chosen.sort(key=lambda run: (run["interval"] or {}).get("start_time", run["time"]))
        out.append(
            {
                "dag_id": dag_id,
                "task_id": task_id,
                "map_index": map_index,
                "stream": stream,
                "by_interval": by_interval,
                "partitions": partitions,
                "runs": chosen,
            }
        )
    return out


def _stream_rates(entries: list[RunEntry], runs: int) -> list[dict[str, Any]]:
    """Per stream, messages per second between consecutive history entries (of any task reading
    it): the growth of its partitions' high watermarks over the time between them."""
    by_stream: dict[str, list[tuple[float, int]]] = {}
    for entry in entries:
        total = sum(r.high_watermark + 1 for r in entry.partitions.values())
        by_stream.setdefault(entry.stream, []).append((entry.recorded_at / 1000, total))
    out = []
    for stream, points in sorted(by_stream.items()):
        rates = []
        for (t0, n0), (t1, n1) in zip(points, points[1:], strict=False):
            if t1 > t0 and n1 >= n0:  # a stream re-created (fewer messages) starts afresh
                rates.append({"time": t1, "messages": n1, "rate": (n1 - n0) / (t1 - t0)})
        out.append({"stream": stream, "messages": points[-1][1], "points": rates[-runs:]})
    return out


def history(client: LiftbridgeClient, *, runs: int = MAX_RUNS) -> dict[str, Any]:
    """The charts' data: ``{"pipelines": [...], "streams": [...]}``, from the newest
    :data:`MAX_HISTORY` history entries, the newest ``runs`` per pipeline.

    :raises LiftbridgeError: the history could not be read.
    """
    entries = read_history(client, limit=MAX_HISTORY)
    return {"pipelines": _pipeline_runs(entries, runs), "streams": _stream_rates(entries, runs)}
