# ruff: noqa: F811  (the fixtures imported from test_api are parameters here)
"""The view's lag verdicts, thresholds, samples and consumer groups (ui/lag_api.py), through its
endpoints behind Airflow's auth, on the session dev server: real streams, real cursors, a real
consume run, real group members (two, each with its own partition), and the registry and run
history written with the functions the reading operators use (so a window of runs is a test's
choice, not hours of DAG runs)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from airflow_provider_liftbridge.client import GroupConsumer, LiftbridgeClient
from airflow_provider_liftbridge.client.reading import (
    PartitionRun,
    PipelineEntry,
    RunEntry,
    record_pipeline,
    record_run,
)
from airflow_provider_liftbridge.ui import samples
from airflow_provider_liftbridge.ui.lag_api import THRESHOLDS_VARIABLE
from tests import margins
from tests.airflow_support import conn_env_name
from tests.ui.test_api import PASSWORD, TOKEN, Api, airflow_app, connections, op_api, run_consume, token  # noqa: F401

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]
LAG = "/api/connections/liftbridge_default/lag"
GROUPS = "/api/connections/liftbridge_default/groups"


def readers(api: Api, kind: str, **params: Any) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in api.get(LAG, **params)["readers"] if r["kind"] == kind}


def register(
    client: LiftbridgeClient, stream: str, task: str, position: int, runs: list[tuple[float, int, int]]
) -> str:
    """A pipeline ``lag_<stream>.<task>`` reading ``stream`` (one partition) at ``position``, whose
    runs ended ``seconds ago`` with (high watermark, lag); returns its name."""
    dag = f"lag_{stream}"
    cursor = f"{stream}-{task}"
    record_pipeline(
        client, PipelineEntry(stream=stream, position_cursor=cursor, plan_key=f"{dag}/{task}", dag_id=dag,
                              task_id=task, run_id="r", partitions=(0,), cursor_id=cursor)
    )  # fmt: skip
    client.set_cursor(cursor, stream, 0, position)
    now_ms = int(time.time() * 1000)
    for i, (ago, hw, lag) in enumerate(runs):
        partitions = {0: PartitionRun(processed=1, dead_lettered=0, lag=lag, high_watermark=hw)}
        record_run(client, RunEntry(dag, task, f"r{i}", stream, partitions, recorded_at=now_ms - int(ago * 1000)))
    return f"{dag}.{task}"


def test_each_verdict_from_a_pipelines_window_of_runs(
    op_api: Api, stream_name: str, lb_address: str, connections: Any
) -> None:
    """Five pipelines on one 10-message stream, their runs chosen to show each status: runs that
    left the same position with lag (STALL), runs that stopped an hour ago (STOP), runs moving on
    while the lag grows (WARN), a position that went back (ERR), nothing to read (OK)."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b"m"] * 10)  # offsets 0..9
        names = {
            "STALL": register(client, stream_name, "stalled", 4, [(300, 9, 5), (200, 9, 5), (100, 9, 5)]),
            "STOP": register(client, stream_name, "stopped", 2, [(4000, 4, 3), (3900, 9, 7)]),
            "WARN": register(client, stream_name, "slow", 6, [(300, 4, 1), (200, 7, 2), (100, 9, 3)]),
            "ERR": register(client, stream_name, "rewound", 1, [(200, 9, 2), (100, 9, 8)]),
            "OK": register(client, stream_name, "fine", 9, [(200, 9, 4), (100, 9, 0)]),
        }
    found = readers(op_api, "pipeline")
    for status, name in names.items():
        assert found[name]["verdict"]["status"] == status, (name, found[name]["verdict"])
    assert found[names["STALL"]]["lag"] == 5 and found[names["STALL"]]["verdict"]["window"] == 3
    assert found[names["STOP"]]["verdict"]["rule"] == "stopped"
    assert found[names["ERR"]]["verdict"]["rule"] == "rewind"
    assert found[names["OK"]]["lag"] == 0 and found[names["OK"]]["lag_age_s"] == 0.0
    assert found[names["WARN"]]["partitions"][0]["verdict"]["rule"] == "lag-growing"
    assert found[names["STALL"]]["lag_age_s"] is not None and found[names["STALL"]]["lag_age_s"] >= 0


def test_thresholds_come_from_an_airflow_variable_and_lag_is_sampled_between_runs(
    op_api: Api, stream_name: str, lb_address: str, connections: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a real consume run the pipeline is OK; 4 more messages make it 4 behind, still OK
    (one run: no window yet) until the Variable sets max_lag 3: WARN by threshold, and the
    threshold is in the answer. A Variable that does not parse is named, and unused. Each look
    samples the lag at most once a minute: two looks, one point of history."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b'{"n": 1}'] * 3)
    run_consume(stream_name)
    name = f"ui_{stream_name}.consume"
    reader = readers(op_api, "pipeline")[name]
    assert (reader["lag"], reader["verdict"]["status"], reader["threshold"]) == (0, "OK", None)
    with LiftbridgeClient(lb_address) as client:
        client.publish_many(stream_name, [b'{"n": 2}'] * 4)
    body = op_api.get(LAG)
    reader = next(r for r in body["readers"] if r["name"] == name)
    assert (reader["lag"], reader["verdict"]["status"], body["thresholds_error"]) == (4, "OK", None)
    assert body["thresholds_variable"] == THRESHOLDS_VARIABLE

    env = conn_env_name(THRESHOLDS_VARIABLE).replace("AIRFLOW_CONN_", "AIRFLOW_VAR_")
    monkeypatch.setenv(env, json.dumps({name: {"max_lag": 3, "max_lag_age_s": 86400}}))
    reader = readers(op_api, "pipeline")[name]
    assert reader["verdict"]["status"] == "WARN" and reader["verdict"]["rule"] == "threshold"
    assert "lag 4 > 3" in reader["verdict"]["reason"]
    assert reader["threshold"] == {"max_lag": 3, "max_lag_age_s": 86400.0}
    # The looks so far: the first sampled (lag 0), the others came within a minute of it.
    assert [p["lag"] for p in reader["history"]] == [0]

    monkeypatch.setenv(env, json.dumps({name: {"max_lag": "three"}}))
    body = op_api.get(LAG)
    assert (
        THRESHOLDS_VARIABLE in body["thresholds_error"] and "max_lag must be a whole number" in body["thresholds_error"]
    )
    assert next(r for r in body["readers"] if r["name"] == name)["threshold"] is None


def _both_assigned(a: GroupConsumer, b: GroupConsumer) -> bool:
    a.check_assignments()
    b.check_assignments()
    return sum(len(x.assignments.get(s, [])) for x in (a, b) for s in x.assignments) == 2 and all(
        len(x.assignments) == 1 for x in (a, b)
    )


def test_a_groups_members_assignments_positions_and_verdicts(
    op_api: Api, stream_name: str, lb_address: str, connections: Any
) -> None:
    """Two members of a group, one partition each; earlier looks are seeded as a sample from two
    minutes ago (both partitions at position 0, lag 2). Alpha reads on while more arrives (its lag
    grows: WARN), beta reads nothing more (the same position with lag: STALL); the page names
    both members at the group's epoch, who holds which partition, positions and lags. Once both
    left, the cluster no longer knows the group: with lag, STOP."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        for p in (0, 1):
            client.publish_many(stream_name, [b"x"] * 3, partition=p)
        options = {"auto_offset": "earliest", "auto_commit_interval": None}
        with (
            client.group_consumer(group, stream_name, consumer_id="alpha", **options) as alpha,  # type: ignore[arg-type]
            client.group_consumer(group, stream_name, consumer_id="beta", **options) as beta,  # type: ignore[arg-type]
        ):
            margins.wait_until(lambda: _both_assigned(alpha, beta), 30.0, "one partition each", interval=0.2)
            [pa], [pb] = alpha.assignments[stream_name], beta.assignments[stream_name]
            assert len(list(alpha.messages(max_messages=1, timeout=20))) == 1
            assert len(list(beta.messages(max_messages=1, timeout=20))) == 1
            alpha.commit()  # both at offset 0: lag 2 each
            beta.commit()
            earlier = samples.Sample(
                "group", group, stream_name, time.time() - 120, {p: (0, 2, 2, None) for p in (0, 1)}
            )
            samples.take_samples(client, {}, [earlier])
            client.publish_many(stream_name, [b"y"] * 5, partition=pa)  # alpha's HW 7
            assert len(list(alpha.messages(max_messages=3, timeout=20))) == 3
            alpha.commit()  # offset 3: lag 4

            info = client.fetch_group_metadata([group])[group]
            assert info is not None

            def members_current() -> bool:
                alpha.check_assignments()
                beta.check_assignments()
                [g] = [x for x in op_api.get(GROUPS, group=[group])["groups"] if x["group_id"] == group]
                return {m["consumer_id"]: m["state"] for m in g["members"]} == {"alpha": "current", "beta": "current"}

            margins.wait_until(members_current, 30.0, "both members recorded at the group's epoch", interval=0.2)
            body = op_api.get(GROUPS)
            [g] = [x for x in body["groups"] if x["group_id"] == group]
            assert (g["known"], g["coordinator"], g["epoch"], g["streams"]) == (
                True,
                info.coordinator,
                info.epoch,
                [stream_name],
            )
            members = {m["consumer_id"]: m for m in g["members"]}
            assert members["alpha"]["assignments"] == {stream_name: [pa]} and members["beta"]["assignments"] == {
                stream_name: [pb]
            }
            assert members["alpha"]["epoch"] == info.epoch
            rows = {r["partition"]: r for r in g["partitions"]}
            assert (rows[pa]["owner"], rows[pa]["position"], rows[pa]["high_watermark"], rows[pa]["lag"]) == (
                "alpha",
                3,
                7,
                4,
            )
            assert (rows[pb]["owner"], rows[pb]["position"], rows[pb]["high_watermark"], rows[pb]["lag"]) == (
                "beta",
                0,
                2,
                2,
            )
            assert rows[pa]["lag_age_s"] is not None and rows[pa]["lag_age_s"] >= 0
            assert (rows[pa]["verdict"]["status"], rows[pa]["verdict"]["rule"]) == ("WARN", "lag-growing")
            assert (rows[pb]["verdict"]["status"], rows[pb]["verdict"]["rule"]) == ("STALL", "stalled")
            assert (g["verdict"]["status"], g["verdict"]["partition"], g["lag"]) == ("STALL", pb, 6)
    [g] = [x for x in op_api.get(GROUPS, group=[group])["groups"] if x["group_id"] == group]
    assert (g["known"], g["epoch"]) == (False, None)
    assert {m["state"] for m in g["members"]} == {"left"}
    assert g["verdict"]["status"] == "STOP" and g["verdict"]["rule"] == "no-members"
    group_reader = readers(op_api, "group")[group]
    assert (group_reader["verdict"]["status"], group_reader["lag"], group_reader["members"]) == ("STOP", 6, 0)


def test_the_new_routes_refuse_without_a_user_and_show_no_secret(airflow_app: Any, connections: dict[str, str]) -> None:
    nobody, forged, viewer = Api(airflow_app, None), Api(airflow_app, "not-a-jwt"), Api(airflow_app, token("viewer"))
    for path in ("lag", "groups"):
        full = f"/api/connections/liftbridge_default/{path}"
        assert nobody.get(full, expect=401)["detail"] == "Not authenticated"
        forged.get(full, expect=403)
        viewer.get(full, expect=403)
    api = Api(airflow_app, token("op"))
    for conn_id in connections.values():
        api.get(f"/api/connections/{conn_id}/lag")
        api.get(f"/api/connections/{conn_id}/groups", group=["no-such-group"])
    assert len(api.bodies) == 4
    for body in api.bodies:
        assert PASSWORD not in body and TOKEN not in body
        assert "nats-user" not in body and "nats://" not in body
