"""The view's lag tab, with the client only: for every pipeline and consumer group, the lag in
messages and as the age of the oldest unread message, its verdict (:mod:`.lag`), its threshold,
and its lag between runs (:mod:`.samples`).

Where the commits of a verdict's window come from:

- a pipeline reading by position (``SinceLastRun``, ``ConsumerGroup`` tasks): its runs. Each
  try's end in the run history (``client/reading/history.py``) is a commit at that time, of the
  position it left (high watermark minus lag) and that lag, as Burrow sees a consumer's commit;
- a pipeline reading by interval: none. Its lag is the messages after its latest interval, the
  next intervals' work, not a backlog; only its thresholds judge it;
- a consumer group: the view's samples of the group's position and this look (:mod:`.groups`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import read_history

from . import charts, groups, lag, model, samples

__all__ = ["HISTORY_POINTS", "judge_pipelines", "overview", "pipeline_commits"]

#: At most this many samples per pipeline or group go to the page (about 2 h at one a minute).
HISTORY_POINTS = 120


def pipeline_commits(client: LiftbridgeClient) -> dict[tuple[str, str, int, str], dict[int, list[lag.Commit]]]:
    """Per (dag_id, task_id, map_index, stream) and partition, its runs' commits, oldest first."""
    out: dict[tuple[str, str, int, str], dict[int, list[lag.Commit]]] = {}
    for entry in read_history(client, limit=charts.MAX_HISTORY):
        per = out.setdefault((entry.dag_id, entry.task_id, entry.map_index, entry.stream), {})
        for p, run in entry.partitions.items():
            per.setdefault(p, []).append(lag.Commit(entry.recorded_at / 1000, run.high_watermark - run.lag, run.lag))
    return out


def _name(p: Mapping[str, Any]) -> str:
    """A pipeline's name: ``dag_id.task_id``, with ``[map index]`` for a mapped task's instance."""
    index = f"[{p['map_index']}]" if p["map_index"] >= 0 else ""
    return f"{p['dag_id']}.{p['task_id']}{index}"


def _pipeline(
    p: Mapping[str, Any], commits: Mapping[int, list[lag.Commit]], limits: lag.Thresholds | None, now: float
) -> dict[str, Any]:
    verdicts = []
    for row in p["partitions"]:
        if p["mode"] == "DataInterval":
            base = {"status": "OK", "rule": "by-interval", "reason": "reads by interval: judged by its thresholds only"}
            verdict = lag.over_threshold(base, row["lag"], row["lag_age_s"], limits) | {"window": 0, "complete": 0.0}
        else:
            verdict = lag.partition_status(
                commits.get(row["partition"], []), row["lag"], now, lag_age_s=row["lag_age_s"], thresholds=limits
            )
        verdicts.append(verdict | {"partition": row["partition"]})
    if p.get("error"):
        worst = {"status": "ERR", "rule": "error", "reason": p["error"], "window": 0}
    else:
        worst = lag.worst(verdicts)
    return {
        "kind": "pipeline",
        "name": _name(p),
        "dag_id": p["dag_id"],
        "task_id": p["task_id"],
        "map_index": p["map_index"],
        "stream": p["stream"],
        "mode": p["mode"],
        "group_id": p["group_id"],
        "links": p["links"],
        "lag": p["lag"],
        "lag_age_s": p["lag_age_s"],
        "threshold": limits.to_dict() if limits else None,
        "verdict": worst,
        "partitions": [
            {"partition": r["partition"], "lag": r["lag"], "lag_age_s": r["lag_age_s"], "verdict": v}
            for r, v in zip(p["partitions"], verdicts, strict=True)
        ],
    }


def overview(
    client: LiftbridgeClient, thresholds: Mapping[str, lag.Thresholds], *, now: float | None = None
) -> dict[str, Any]:
    """Every pipeline's and group's lag, verdict, threshold and sampled history; takes this
    look's samples (see :mod:`.samples`).

    :raises LiftbridgeError: the cluster did not answer.
    """
    now = time.time() if now is None else now
    known = samples.read_samples(client)
    commits = pipeline_commits(client)
    readers, fresh = [], []
    for p in model.pipelines(client)["pipelines"]:
        key = (p["dag_id"], p["task_id"], p["map_index"], p["stream"])
        # Thresholds are per task (every mapped instance alike).
        readers.append(_pipeline(p, commits.get(key, {}), thresholds.get(f"{p['dag_id']}.{p['task_id']}"), now))
        rows = {r["partition"]: (r["position"], r["high_watermark"], r["lag"], r["lag_age_s"]) for r in p["partitions"]}
        if not p.get("error"):
            fresh.append(samples.Sample("pipeline", _name(p), p["stream"], now, rows))
    found, group_samples = groups.groups(client, thresholds=thresholds, known=known, now=now)
    for g in found:
        readers.append(
            {
                "kind": "group",
                "name": g["group_id"],
                "group_id": g["group_id"],
                "stream": ", ".join(g["streams"]),
                "lag": g["lag"],
                "lag_age_s": g["lag_age_s"],
                "threshold": g["threshold"],
                "verdict": g["verdict"],
                "members": sum(m["state"] == "current" for m in g["members"]),
                "partitions": [
                    {k: r[k] for k in ("stream", "partition", "lag", "lag_age_s", "verdict")} for r in g["partitions"]
                ],
            }
        )
    samples.take_samples(client, known, [*fresh, *group_samples])
    for reader in readers:
        history = [
            s
            for (kind, name, _), taken in known.items()
            if kind == reader["kind"] and name == reader["name"]
            for s in taken
        ]
        reader["history"] = [s.to_point() for s in sorted(history, key=lambda s: s.time)[-HISTORY_POINTS:]]
    return {
        "readers": readers,
        "window": lag.WINDOW,
        "sample_every_s": samples.SAMPLE_EVERY,
    }


def judge_pipelines(
    client: LiftbridgeClient, thresholds: Mapping[str, lag.Thresholds], *, now: float | None = None
) -> dict[str, Any]:
    """:func:`.model.pipelines`, each pipeline and partition with the verdict the Lag tab shows
    (``verdict``) and the pipeline's ``threshold``: the same rules, from the same run history. It
    takes no sample (the Lag and Groups tabs do).

    :raises LiftbridgeError: the cluster did not answer.
    """
    now = time.time() if now is None else now
    body = model.pipelines(client)
    commits = pipeline_commits(client)
    for p in body["pipelines"]:
        key = (p["dag_id"], p["task_id"], p["map_index"], p["stream"])
        judged = _pipeline(p, commits.get(key, {}), thresholds.get(f"{p['dag_id']}.{p['task_id']}"), now)
        p["verdict"], p["threshold"] = judged["verdict"], judged["threshold"]
        for row, part in zip(p["partitions"], judged["partitions"], strict=True):
            row["verdict"] = part["verdict"]
    return body
