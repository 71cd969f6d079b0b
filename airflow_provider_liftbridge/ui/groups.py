"""Consumer groups for the view, with the client only (no Airflow, no FastAPI here): each group's
coordinator and epoch (FetchMetadata), its members and their assignments (the group roster the
members record, ``client/group_roster.py``: Liftbridge has no call that lists them), and per
stream partition the group's committed position (cursor ``__group:<id>``), the high watermark,
the lag, the age of the oldest unread message, the member it is assigned to, and the verdict
(:mod:`.lag`).

Which groups: those of the pipeline registry (consume tasks reading with ``ConsumerGroup``), those
of the roster, and any the caller names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.consumer import group_cursor_id
from airflow_provider_liftbridge.client.group_roster import GroupInfo, MemberRecord
from airflow_provider_liftbridge.client.reading import read_pipelines
from airflow_provider_liftbridge.client.reading.roster import read_roster

from . import lag
from .model import _iso, _lag_age
from .samples import Key, Sample

__all__ = ["groups", "thresholds_key"]


def thresholds_key(group_id: str) -> str:
    """A group's name in the thresholds Variable (``group:<id>``)."""
    return f"group:{group_id}"


def _member(record: MemberRecord, info: GroupInfo | None) -> dict[str, Any]:
    current = info is not None and not record.left and record.epoch == info.epoch
    if record.left:
        state = "left"
    elif info is None:
        state = "gone"  # the group has no members any more: it timed out
    else:
        state = "current" if current else "behind"  # behind: recorded at an older epoch
    return {
        "consumer_id": record.consumer_id,
        "state": state,
        "epoch": record.epoch,
        "coordinator": record.coordinator,
        "streams": list(record.streams),
        "assignments": {s: list(p) for s, p in sorted(record.assignments.items())},
        "recorded_at": _iso(record.recorded_at * 1_000_000),
    }


def _owners(records: Iterable[MemberRecord], info: GroupInfo | None) -> dict[tuple[str, int], str]:
    """Who holds each partition: of the members in the group, the newest record claiming it."""
    if info is None:
        return {}
    owners: dict[tuple[str, int], tuple[int, str]] = {}
    for record in records:
        if record.left:
            continue
        for stream, parts in record.assignments.items():
            for p in parts:
                if (stream, p) not in owners or record.recorded_at > owners[(stream, p)][0]:
                    owners[(stream, p)] = (record.recorded_at, record.consumer_id)
    return {key: who for key, (_, who) in owners.items()}


def _commits(samples: list[Sample], partition: int) -> list[lag.Commit]:
    return [
        lag.Commit(s.time, s.partitions[partition][0], s.partitions[partition][2])
        for s in samples
        if partition in s.partitions
    ]


def _verdict(
    commits: list[lag.Commit], row: dict[str, Any], info: GroupInfo | None, now: float, limits: lag.Thresholds | None
) -> dict[str, Any]:
    """Burrow's rules without its STOP rule (the view's samples are not the group's commits):
    a group without members (the cluster no longer knows it) that has something to read is STOP."""
    if info is None and row["lag"] > 0:
        verdict = {"status": "STOP", "rule": "no-members", "reason": "no member is in the group, and it has lag"}
        return verdict | {"window": len(commits[-lag.WINDOW :]), "complete": min(1.0, len(commits) / lag.WINDOW)}
    return lag.partition_status(
        commits, row["lag"], now, lag_age_s=row["lag_age_s"], thresholds=limits, stop_rule=False
    )


def groups(
    client: LiftbridgeClient,
    *,
    asked: Iterable[str] = (),
    thresholds: Mapping[str, lag.Thresholds] | None = None,
    known: Mapping[Key, list[Sample]] | None = None,
    now: float | None = None,
) -> tuple[list[dict[str, Any]], list[Sample]]:
    """Every group (see the module) with its members and partitions, and the samples of this
    look (one per group and stream) for :func:`.samples.take_samples`.

    :raises LiftbridgeError: the cluster did not answer.
    """
    now = time.time() if now is None else now
    thresholds, known = thresholds or {}, known or {}
    registry = [e for e in read_pipelines(client) if e.group_id]
    roster = read_roster(client)
    streams: dict[str, set[str]] = {}
    for entry in registry:
        streams.setdefault(entry.group_id or "", set()).add(entry.stream)
    for record in roster:
        streams.setdefault(record.group_id, set()).update(record.streams)
    for group_id in asked:
        streams.setdefault(group_id, set())
    infos = client.fetch_group_metadata(sorted(streams))
    all_streams = sorted({s for names in streams.values() for s in names})
    metadata = client.fetch_metadata(all_streams) if all_streams else None
    out, fresh = [], []
    for group_id in sorted(streams):
        info = infos.get(group_id)
        records = [r for r in roster if r.group_id == group_id]
        owners = _owners(records, info)
        limits = thresholds.get(thresholds_key(group_id))
        rows, missing = [], []
        for stream in sorted(streams[group_id]):
            stream_info = metadata.streams.get(stream) if metadata is not None else None
            if stream_info is None:
                missing.append(stream)
                continue
            sample_rows: dict[int, tuple[int, int, int, float | None]] = {}
            for p, part in sorted(stream_info.partitions.items()):
                position = client.fetch_cursor(group_cursor_id(group_id), stream, p)
                hw = part.high_watermark
                row: dict[str, Any] = {
                    "stream": stream,
                    "partition": p,
                    "position": position,
                    "high_watermark": hw,
                    # Committed messages after the group's position; all of them before any commit.
                    "lag": max(0, hw - position) if position >= 0 else hw + 1,
                    "owner": owners.get((stream, p)),
                }
                row["lag_age_s"] = _lag_age(client, stream, p, position, hw, int(now * 1e9))
                sample_rows[p] = (position, hw, row["lag"], row["lag_age_s"])
                # The samples so far and this look: each is the group's committed position at a time.
                commits = [
                    *_commits(known.get(("group", group_id, stream), []), p),
                    lag.Commit(now, position, row["lag"]),
                ]
                row["verdict"] = _verdict(commits, row, info, now, limits) | {"stream": stream, "partition": p}
                rows.append(row)
            fresh.append(Sample("group", group_id, stream, now, sample_rows))
        ages = [r["lag_age_s"] for r in rows]
        out.append(
            {
                "group_id": group_id,
                "known": info is not None,
                "coordinator": info.coordinator if info else None,
                "epoch": info.epoch if info else None,
                "streams": sorted(streams[group_id]),
                "missing_streams": missing,
                "members": [_member(r, info) for r in records],
                "pipelines": sorted(f"{e.dag_id}.{e.task_id}" for e in registry if e.group_id == group_id),
                "partitions": rows,
                "lag": sum(r["lag"] for r in rows),
                "lag_age_s": None if None in ages else max(ages, default=0.0),
                "threshold": limits.to_dict() if limits else None,
                "verdict": lag.worst(r["verdict"] for r in rows),
            }
        )
    return out, fresh
