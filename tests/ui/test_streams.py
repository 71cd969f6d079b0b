# ruff: noqa: F811  (the fixtures imported from test_api are parameters here)
"""The Streams tab's endpoint (docs/ui.md, "Streams"): a page of the streams, sorted and paged by
the server, with sizes from the metadata and the oldest retained offset read per partition of the
page; bad fields are 400s naming them. Also the Pipelines tab's verdicts (the Lag tab's, on the
pipelines endpoint), the charts' links to their DAG runs, and the old ``/messages`` route's 400
for a partition that is not a number. Against the session dev server, behind Airflow's auth."""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import quote

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.ui.lag_api import THRESHOLDS_VARIABLE
from airflow_provider_liftbridge.ui.rates import MIN_SPAN
from tests.airflow_support import conn_env_name
from tests.exact_retention import ONE_MESSAGE_SEGMENTS, publish_each, wait_for_earliest
from tests.ui.test_api import PASSWORD, TOKEN, Api, airflow_app, connections, op_api, pipeline_of, run_consume, token  # noqa: F401

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]
BASE = "/api/connections/liftbridge_default"


@pytest.fixture
def three(lb_address: str, connections: Any) -> dict[str, str]:
    """Streams ``<prefix>-a`` (12 messages, retention keeps 5: offsets 7 to 11), ``-b`` (two
    partitions, 3 + 1 messages) and ``-c`` (empty), under a prefix no other test uses."""
    prefix = f"ui-streams-{uuid.uuid4().hex[:10]}"
    names = {k: f"{prefix}-{k}" for k in "abc"}
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(f"{names['a']}.subj", names["a"], retention_max_messages=5, **ONE_MESSAGE_SEGMENTS)
        publish_each(client, names["a"], [b"m%d" % i for i in range(12)])
        wait_for_earliest(client, names["a"], 7)
        client.create_stream(names["b"], names["b"], partitions=2)
        client.publish_many(names["b"], [b"x"] * 3, partition=0)
        client.publish_many(names["b"], [b"y"], partition=1)
        client.create_stream(names["c"], names["c"])
    return {"prefix": prefix, **names}


def names_of(body: dict[str, Any]) -> list[str]:
    return [s["name"] for s in body["streams"]]


def test_a_page_of_streams_sorted_paged_and_sized(op_api: Api, three: dict[str, str], lb_address: str) -> None:
    a, b, c = three["a"], three["b"], three["c"]
    body = op_api.get(f"{BASE}/streams", filter=three["prefix"].upper())  # any case
    assert (names_of(body), body["matched"], body["offset"], body["limit"]) == ([a, b, c], 3, 0, 50)
    assert body["total"] >= 4  # and the rest of the cluster (__cursors at least)
    by_name = {s["name"]: s for s in body["streams"]}
    sa, sb, sc = by_name[a], by_name[b], by_name[c]
    assert (sa["subject"], sa["partitions"], sa["replication"], sa["committed"], sa["newest_offset"]) == (
        f"{a}.subj",
        1,
        1,
        12,
        11,
    )
    [pa] = sa["partition_list"]
    assert (pa["oldest_offset"], pa["high_watermark"], pa["retained"], pa["committed"]) == (7, 11, 5, 12)
    assert sa["retained"] == 5 and sa["latest_message"] and sa["created"] and pa["first_message"]
    assert (sb["partitions"], sb["committed"], sb["retained"]) == (2, 4, 4)
    assert [(p["id"], p["oldest_offset"], p["retained"]) for p in sb["partition_list"]] == [(0, 0, 3), (1, 0, 1)]
    assert (sc["committed"], sc["retained"], sc["newest_offset"], sc["latest_message"]) == (0, 0, -1, None)
    assert (
        "retention (max bytes, messages, age)" in body["not_returned"] and "the size in bytes" in body["not_returned"]
    )

    assert names_of(op_api.get(f"{BASE}/streams", filter=three["prefix"], sort="committed", order="desc")) == [a, b, c]
    assert names_of(op_api.get(f"{BASE}/streams", filter=three["prefix"], sort="partitions", order="desc")) == [b, a, c]
    assert names_of(op_api.get(f"{BASE}/streams", filter=three["prefix"], sort="name", order="desc")) == [c, b, a]
    first = op_api.get(f"{BASE}/streams", filter=three["prefix"], limit="2")
    second = op_api.get(f"{BASE}/streams", filter=three["prefix"], limit="2", offset="2")
    assert (names_of(first), names_of(second), second["matched"]) == ([a, b], [c], 3)
    assert names_of(op_api.get(f"{BASE}/streams", filter=f"{a}.SUBJ")) == [a]  # by subject too

    # A paused partition's oldest offset is not read (that would resume it): unknown, and it stays paused.
    with LiftbridgeClient(lb_address) as client:
        client.pause_stream(b, [1])
        paused = op_api.get(f"{BASE}/streams", filter=b)["streams"][0]
        assert paused["paused"] == 1 and paused["retained"] is None
        p1 = paused["partition_list"][1]
        assert p1["oldest_offset"] is None and "paused" in p1["oldest_unknown"]
        assert client.fetch_metadata([b]).streams[b].partitions[1].paused


def test_bad_fields_of_the_streams_page_are_named(op_api: Api, connections: Any) -> None:
    cases = {
        "sort": ({"sort": "size"}, "sort must be one of name, subject"),
        "order": ({"order": "up"}, "order must be asc or desc"),
        "offset": ({"offset": "-1"}, "offset must be a whole number, 0 or more"),
        "limit": ({"limit": "501"}, "limit must be a whole number from 1 to 500"),
    }
    for field, (params, words) in cases.items():
        detail = op_api.get(f"{BASE}/streams", expect=400, **params)["detail"]
        assert detail["field"] == field and words in detail["message"], detail
    assert op_api.get(f"{BASE}/streams", expect=400, limit="ten")["detail"]["field"] == "limit"


def test_the_old_messages_route_names_a_partition_that_is_not_a_number(op_api: Api, three: dict[str, str]) -> None:
    """It answered FastAPI's raw 422 (its validation list); now a 400 like the browser's routes."""
    path = f"{BASE}/streams/{three['a']}/partitions/one/messages"
    detail = op_api.get(path, expect=400)["detail"]
    assert detail["field"] == "partition" and "whole number" in detail["message"] and "'one'" in detail["message"]
    assert [
        m["offset"] for m in op_api.get(f"{BASE}/streams/{three['a']}/partitions/0/messages", last="2")["messages"]
    ] == [
        10,
        11,
    ]


def test_the_streams_route_refuses_without_a_user_and_shows_no_secret(
    airflow_app: Any, connections: dict[str, str], three: dict[str, str]
) -> None:
    nobody, forged, viewer = Api(airflow_app, None), Api(airflow_app, "not-a-jwt"), Api(airflow_app, token("viewer"))
    assert nobody.get(f"{BASE}/streams", expect=401)["detail"] == "Not authenticated"
    forged.get(f"{BASE}/streams", expect=403)
    viewer.get(f"{BASE}/streams", expect=403)  # may not read the connection (simple auth manager: op and up)
    user = Api(airflow_app, token("op"))
    for conn_id in connections.values():
        user.get(f"/api/connections/{conn_id}/streams", filter=three["prefix"])
        user.get(f"/api/connections/{conn_id}/streams", expect=400, sort="nope")
    for body in nobody.bodies + forged.bodies + viewer.bodies + user.bodies:
        assert PASSWORD not in body and TOKEN not in body
        assert "nats-user" not in body and "nats://" not in body
    assert three["a"] not in "".join(nobody.bodies + forged.bodies + viewer.bodies)


def test_pipelines_carry_the_lag_tabs_verdicts_and_charts_link_their_runs(
    op_api: Api, stream_name: str, lb_address: str, monkeypatch: pytest.MonkeyPatch, connections: Any
) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b'{"n": 1}'] * 3)
    dag_run = run_consume(stream_name)
    name = f"ui_{stream_name}.consume"
    pipeline = pipeline_of(op_api.get(f"{BASE}/pipelines"), stream_name)
    assert pipeline["verdict"]["status"] == "OK" and pipeline["threshold"] is None
    assert [r["verdict"]["status"] for r in pipeline["partitions"]] == ["OK"]

    # Over a threshold: WARN on the pipelines tab as on the lag tab, for the same reason.
    with LiftbridgeClient(lb_address) as client:
        client.publish_many(stream_name, [b'{"n": 2}'] * 4)
    env = conn_env_name(THRESHOLDS_VARIABLE).replace("AIRFLOW_CONN_", "AIRFLOW_VAR_")
    monkeypatch.setenv(env, json.dumps({name: {"max_lag": 3}}))
    pipeline = pipeline_of(op_api.get(f"{BASE}/pipelines"), stream_name)
    [reader] = [r for r in op_api.get(f"{BASE}/lag")["readers"] if r["name"] == name]
    assert pipeline["verdict"]["status"] == reader["verdict"]["status"] == "WARN"
    assert pipeline["verdict"]["reason"] == reader["verdict"]["reason"] == "over the threshold: lag 4 > 3 messages"
    assert pipeline["partitions"][0]["verdict"]["rule"] == "threshold"
    assert pipeline["threshold"] == {"max_lag": 3, "max_lag_age_s": None}
    monkeypatch.setenv(env, "{not json")
    assert THRESHOLDS_VARIABLE in op_api.get(f"{BASE}/pipelines")["thresholds_error"]

    [charted] = [p for p in op_api.get(f"{BASE}/history")["pipelines"] if p["stream"] == stream_name]
    [run] = charted["runs"]
    assert run["run_id"] == dag_run.run_id
    assert run["link"] == f"dags/ui_{stream_name}/runs/{quote(dag_run.run_id, safe='')}"


def test_every_stream_has_a_message_rate_from_the_views_own_samples(
    op_api: Api, connections: Any, lb_address: str
) -> None:
    """Two streams no task reads: the first look has no rate yet; once the view has a look at
    least rates.MIN_SPAN seconds old to compare with, both have one (0 while nothing is published);
    after 30 messages to one of them, the next answer counts exactly those 30 over the span it
    names, and sorting by rate puts that stream first."""
    from tests.margins import wait_until

    prefix = f"ui-rates-{uuid.uuid4().hex[:10]}"
    busy, idle = f"{prefix}-busy", f"{prefix}-idle"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(busy, busy, partitions=2)
        client.create_stream(idle, idle)

    def rows() -> dict[str, dict[str, Any]]:
        return {s["name"]: s for s in op_api.get(f"{BASE}/streams", filter=prefix)["streams"]}

    first = rows()
    assert [first[n]["rate"] for n in (busy, idle)] == [None, None]  # nothing to compare with yet
    measured = wait_until(
        lambda: (found := rows()) and all(found[n]["rate"] is not None for n in (busy, idle)) and found,
        120,
        "a look at the cluster old enough to give a rate",
        interval=0.5,
    )
    assert [(measured[n]["rate"], measured[n]["rate_messages"]) for n in (busy, idle)] == [(0.0, 0), (0.0, 0)]

    with LiftbridgeClient(lb_address) as client:
        client.publish_many(busy, [b"m"] * 20, partition=0)
        client.publish_many(busy, [b"m"] * 10, partition=1)
    # Every look the view kept was taken before the publishes: this answer counts all 30.
    body = op_api.get(f"{BASE}/streams", filter=prefix, sort="rate", order="desc")
    got = {s["name"]: s for s in body["streams"]}
    assert names_of(body) == [busy, idle]
    assert (got[busy]["rate_messages"], got[idle]["rate_messages"]) == (30, 0)
    assert got[busy]["rate_span_s"] >= MIN_SPAN
    assert got[busy]["rate"] == pytest.approx(30 / got[busy]["rate_span_s"])


def test_rates_compare_with_the_newest_look_old_enough_and_forget_a_recreated_stream() -> None:
    """The sampler with a clock of its own: a look kept at most every SAMPLE_EVERY seconds, a rate
    against the newest look at least MIN_SPAN old, none for a stream created again in between, and
    none once every look is older than KEEP_FOR."""
    from airflow_provider_liftbridge.client import PartitionInfo, StreamInfo
    from airflow_provider_liftbridge.ui.rates import KEEP_FOR, SAMPLE_EVERY, RateSampler

    def cluster(hw: int, created: int = 1) -> dict[str, StreamInfo]:
        part = PartitionInfo("s", 0, "b", ("b",), ("b",), hw, hw, False, False, 0, 0)
        return {"s": StreamInfo("s", "s", created, {0: part})}

    now = [0.0]
    sampler = RateSampler(clock=lambda: now[0])
    assert sampler.rates("c", cluster(-1))["s"]["rate"] is None  # kept: the first look
    now[0] = MIN_SPAN / 2
    assert sampler.rates("c", cluster(9))["s"]["rate"] is None  # too soon to compare, and not kept
    now[0] = max(MIN_SPAN, SAMPLE_EVERY)
    got = sampler.rates("c", cluster(19))["s"]  # 20 messages since the first look
    assert (got["rate_messages"], got["rate_span_s"], got["rate"]) == (20, now[0], 20 / now[0])
    now[0] += max(MIN_SPAN, SAMPLE_EVERY)
    assert sampler.rates("c", cluster(29))["s"]["rate_messages"] == 10  # against the newer look
    now[0] += max(MIN_SPAN, SAMPLE_EVERY)
    assert sampler.rates("c", cluster(4, created=2))["s"]["rate"] is None  # deleted and created again
    now[0] += KEEP_FOR + 1
    assert sampler.rates("c", cluster(99, created=2))["s"]["rate"] is None  # every look forgotten
    assert sampler.rates("other", cluster(0))["s"]["rate"] is None  # another cluster: its own looks
