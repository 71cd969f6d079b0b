"""The Liftbridge view's JSON endpoints, driven through FastAPI's TestClient against the session
dev server (real gRPC, real nats-server) and real DAG runs (``dag.test()``) of the consume
operator, behind Airflow's real auth: the SimpleAuthManager of this Airflow and JWTs it signs.

What is not real here: no api-server process. The view's app is mounted on a bare FastAPI root
app the way Airflow's ``init_plugins`` mounts it, with Airflow's ``init_auth_manager``; the
requests go in-process (TestClient), not over a socket. That the provider's plugin is loaded and
mounted by Airflow itself is checked by ``test_airflow_mounts_the_plugin`` (a fresh process) and by
the system tier.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream
from tests.airflow_support import REPO, conn_env_name, liftbridge_conn_json, register_dag, xcom_of
from tests.processes import run_child

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]

START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
#: Secrets of the test connections: none may appear in any response.
PASSWORD = f"pw-{uuid.uuid4().hex}"
TOKEN = f"tok-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def airflow_app() -> Any:
    """A root app with Airflow's auth manager and the view mounted as Airflow mounts plugins."""
    from airflow.api_fastapi.app import init_auth_manager
    from fastapi import FastAPI

    from airflow_provider_liftbridge.ui.api import app
    from airflow_provider_liftbridge.ui.plugin import URL_PREFIX

    root = FastAPI()
    init_auth_manager(root)
    root.mount(URL_PREFIX, app)
    return root


def token(role: str) -> str:
    """A JWT of a SimpleAuthManager user with ``role``, signed by Airflow's auth manager."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return str(get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=f"{role}-user", role=role)))


@pytest.fixture
def connections(monkeypatch: pytest.MonkeyPatch, lb_address: str, nats_url: str) -> dict[str, str]:
    """``liftbridge_default`` (what the DAGs use), a connection with a NATS password and one with a
    NATS token, all to the session dev server."""
    monkeypatch.setenv(conn_env_name("liftbridge_default"), liftbridge_conn_json(lb_address, nats_url=nats_url))
    with_password = json.loads(liftbridge_conn_json(lb_address, nats_url=nats_url))
    with_password |= {"login": "nats-user", "password": PASSWORD}
    monkeypatch.setenv(conn_env_name("lb_ui_password"), json.dumps(with_password))
    monkeypatch.setenv(
        conn_env_name("lb_ui_token"), liftbridge_conn_json(lb_address, nats_url=nats_url, nats_token=TOKEN)
    )
    return {"password": "lb_ui_password", "token": "lb_ui_token"}


class Api:
    """The view's endpoints as one user (a Bearer token, or none)."""

    def __init__(self, app: Any, bearer: str | None) -> None:
        from fastapi.testclient import TestClient

        self.client = TestClient(app)
        self.headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        self.bodies: list[str] = []

    def get(self, path: str, expect: int = 200, **params: Any) -> Any:
        response = self.client.get(f"/liftbridge{path}", headers=self.headers, params=params)
        self.bodies.append(response.text)
        assert response.status_code == expect, response.text
        return response.json() if response.headers.get("content-type", "").startswith("application/json") else None


@pytest.fixture
def op_api(airflow_app: Any) -> Api:
    return Api(airflow_app, token("op"))


def run_consume(stream: str, **kwargs: Any) -> Any:
    """One DAG run of a consume task reading ``stream`` as JSON, dead-lettering what is not JSON."""
    from airflow.sdk import DAG

    dag_id = f"ui_{stream}"
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator(
            task_id="consume",
            stream=stream,
            read=SinceLastRun(f"{stream}-cursor"),
            value_format="json",
            apply_function="tests.ui.ui_support.accept",
            dead_letters=DeadLetterStream(f"{stream}-dlq", create=True),
            **kwargs,
        )
    register_dag(dag)
    dag_run = dag.test()
    assert str(dag_run.state) == "success"
    return dag_run


def pipeline_of(body: dict[str, Any], stream: str) -> dict[str, Any]:
    found = [p for p in body["pipelines"] if p["stream"] == stream]
    assert len(found) == 1, f"expected one pipeline reading {stream!r}: {body}"
    return found[0]


@pytest.fixture
def pipeline_stream(stream_name: str, lb_address: str, connections: dict[str, str]) -> Iterator[str]:
    """A 2-partition stream with 3 JSON messages and one that is not JSON on partition 0, and 2 JSON
    messages on partition 1, read once by a consume task (one dead letter)."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        client.publish_many(stream_name, [b'{"n": 0}', b'{"n": 1}', b"not json", b'{"n": 3}'], partition=0)
        client.publish_many(stream_name, [b'{"n": 10}', b'{"n": 11}'], partition=1)
    dag_run = run_consume(stream_name)
    assert xcom_of(dag_run, "consume")["dead_lettered"] == 1
    yield stream_name


def test_pipeline_lag_is_zero_after_a_run_and_n_after_n_more(
    op_api: Api, pipeline_stream: str, lb_address: str
) -> None:
    stream = pipeline_stream
    pipeline = pipeline_of(op_api.get("/api/connections/liftbridge_default/pipelines"), stream)
    assert (pipeline["dag_id"], pipeline["task_id"], pipeline["cursor_id"]) == (
        f"ui_{stream}",
        "consume",
        f"{stream}-cursor",
    )
    assert pipeline["links"] == {"dag": f"dags/ui_{stream}", "task": f"dags/ui_{stream}/tasks/consume"}
    assert pipeline["dead_letter_stream"] == f"{stream}-dlq"
    rows = {r["partition"]: r for r in pipeline["partitions"]}
    assert {p: (r["position"], r["high_watermark"], r["lag"]) for p, r in rows.items()} == {0: (3, 3, 0), 1: (1, 1, 0)}
    assert rows[0]["plan"] == {"start": 0, "end": 4, "run_id": pipeline["last_run_id"], "finished": True}
    committed_at = dt.datetime.fromisoformat(rows[0]["last_commit_time"])
    assert abs((dt.datetime.now(dt.UTC) - committed_at).total_seconds()) < 600
    assert pipeline["lag"] == 0

    with LiftbridgeClient(lb_address) as client:
        client.publish_many(stream, [b'{"n": %d}' % i for i in range(7)], partition=0)
        client.publish_many(stream, [b'{"n": 1}'] * 2, partition=1)
    pipeline = pipeline_of(op_api.get("/api/connections/liftbridge_default/pipelines"), stream)
    rows = {r["partition"]: r for r in pipeline["partitions"]}
    assert {p: (r["position"], r["high_watermark"], r["lag"]) for p, r in rows.items()} == {0: (3, 10, 7), 1: (1, 3, 2)}
    assert pipeline["lag"] == 9


def test_dead_letter_page_shows_the_letter(op_api: Api, pipeline_stream: str) -> None:
    body = op_api.get("/api/connections/liftbridge_default/dead-letters", stream=[f"{pipeline_stream}-dlq"])
    [dlq] = body["streams"]
    assert (dlq["stream"], dlq["count"], dlq["error"]) == (f"{pipeline_stream}-dlq", 1, None)
    [letter] = dlq["letters"]
    assert letter["error_type"] == "NotJsonError"
    assert "offset 2 is not JSON" in letter["error"]
    assert (letter["source_stream"], letter["source_partition"], letter["source_offset"]) == (pipeline_stream, 0, 2)
    assert letter["value"] == {"format": "text", "value": "not json", "size": 8, "truncated": False}
    assert not any(name.startswith("dead-letter-") for name in letter["headers"])
    # Without a stream named, the page shows the pipelines' dead-letter streams.
    default = op_api.get("/api/connections/liftbridge_default/dead-letters")
    assert f"{pipeline_stream}-dlq" in [s["stream"] for s in default["streams"]]


def test_browse_shows_json_text_and_hex(op_api: Api, stream_name: str, lb_address: str, connections: Any) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish(stream_name, b'{"order": 7, "items": ["a"]}', key=b"k-7", headers={"trace": b"t-1"})
        client.publish(stream_name, b"plain words")
        client.publish(stream_name, b"\x00\xff\x10")
        client.publish(stream_name, b"x" * 20_000)
    path = f"/api/connections/liftbridge_default/streams/{stream_name}/partitions/0/messages"
    body = op_api.get(path, last=3)
    assert [m["offset"] for m in body["messages"]] == [1, 2, 3]
    plain, binary, big = body["messages"]
    assert plain["value"] == {"format": "text", "value": "plain words", "size": 11, "truncated": False}
    assert binary["value"] == {"format": "hex", "value": "00ff10", "size": 3, "truncated": False}
    assert (big["value"]["format"], big["value"]["size"], big["value"]["truncated"]) == ("text", 20_000, True)
    assert len(big["value"]["value"]) == 16 * 1024
    [first] = op_api.get(path, from_offset=0, limit=1)["messages"]
    assert first["value"] == {"format": "json", "value": {"order": 7, "items": ["a"]}, "size": 28, "truncated": False}
    assert first["key"]["value"] == "k-7"
    assert first["headers"]["trace"]["value"] == "t-1"
    # From a time: the first message at or after it (all of them from the epoch).
    assert [m["offset"] for m in op_api.get(path, from_time="1970-01-02T00:00:00Z", limit=2)["messages"]] == [0, 1]
    assert op_api.get(path, from_time="2200-01-01T00:00:00Z")["messages"] == []
    assert "2262" in op_api.get(path, expect=400, from_time="2999-01-01T00:00:00Z")["detail"]["message"]
    # Bounded, and errors that say what was wrong.
    assert "from 1 to 200" in op_api.get(path, expect=400, last=201)["detail"]["message"]
    assert "not" in op_api.get(path, expect=400, last=2, from_offset=0)["detail"]
    missing = op_api.get(f"/api/connections/liftbridge_default/streams/{stream_name}/partitions/5/messages", expect=404)
    assert "no partition 5" in missing["detail"]
    assert op_api.get(
        f"/api/connections/liftbridge_default/streams/nope-{uuid.uuid4().hex}/partitions/0/messages", expect=404
    )["detail"].startswith("stream")


def test_cluster_lists_brokers_streams_and_partitions(
    op_api: Api, stream_name: str, lb_address: str, connections: Any
) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        client.publish_many(stream_name, [b"a", b"b"], partition=1)
        client.publish(stream_name, b"c", partition=0)
        client.pause_stream(stream_name, [0])
        client.set_stream_readonly(stream_name, [1])
    body = op_api.get("/api/connections/liftbridge_default/cluster")
    assert [b["port"] for b in body["brokers"]] == [int(lb_address.rsplit(":", 1)[1])]
    stream = next(s for s in body["streams"] if s["name"] == stream_name)
    p0, p1 = stream["partitions"]
    assert (p0["paused"], p0["readonly"], p0["high_watermark"]) == (True, False, 0)
    assert (p1["paused"], p1["readonly"], p1["high_watermark"], p1["newest_offset"]) == (False, True, 1, 1)
    assert p1["leader"] == body["brokers"][0]["id"] and p1["isr"] == [p1["leader"]]
    assert "__cursors" in [s["name"] for s in body["streams"]]
    # Read-only: a paused partition is not resumed by browsing it.
    path = f"/api/connections/liftbridge_default/streams/{stream_name}/partitions/0/messages"
    assert "paused" in op_api.get(path, expect=409)["detail"]
    again = op_api.get("/api/connections/liftbridge_default/cluster")
    assert next(s for s in again["streams"] if s["name"] == stream_name)["partitions"][0]["paused"] is True


def test_no_secret_of_the_connection_in_any_response(
    airflow_app: Any, pipeline_stream: str, connections: dict[str, str]
) -> None:
    api = Api(airflow_app, token("op"))
    for conn_id in connections.values():
        base = f"/api/connections/{conn_id}"
        api.get(f"{base}/cluster")
        api.get(f"{base}/pipelines")
        api.get(f"{base}/history")
        api.get(f"{base}/dead-letters")
        api.get(f"{base}/streams/{pipeline_stream}/partitions/0/messages", last=5)
        api.get(f"{base}/streams/missing-{uuid.uuid4().hex}/partitions/0/messages", expect=404)
    api.get("/api/connections")
    api.get("/", expect=200)
    assert len(api.bodies) == 14
    for body in api.bodies:
        assert PASSWORD not in body and TOKEN not in body
        assert "nats-user" not in body and "nats://" not in body


def test_requests_without_a_user_are_refused(airflow_app: Any, connections: Any) -> None:
    paths = [
        "/api/connections",
        "/api/connections/liftbridge_default/cluster",
        "/api/connections/liftbridge_default/pipelines",
        "/api/connections/liftbridge_default/history",
        "/api/connections/liftbridge_default/dead-letters",
        "/api/connections/liftbridge_default/streams/s/partitions/0/messages",
    ]
    nobody, forged = Api(airflow_app, None), Api(airflow_app, "not-a-jwt")
    for path in paths:
        assert nobody.get(path, expect=401)["detail"] == "Not authenticated"
        forged.get(path, expect=403)
    for path in ("/docs", "/redoc", "/openapi.json"):  # FastAPI's schema pages are not served at all
        nobody.get(path, expect=404)


def test_a_viewer_may_not_read_the_cluster_an_op_may_with_a_cookie(airflow_app: Any, connections: Any) -> None:
    """SimpleAuthManager: reading connections needs the OP role (the core API's rule, applied to
    the connection in the path)."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from fastapi.testclient import TestClient

    viewer = Api(airflow_app, token("viewer"))
    for path in ("cluster", "pipelines", "history", "dead-letters", "streams/s/partitions/0/messages"):
        viewer.get(f"/api/connections/liftbridge_default/{path}", expect=403)
    browser = TestClient(airflow_app, cookies={COOKIE_NAME_JWT_TOKEN: token("op")})
    response = browser.get("/liftbridge/api/connections/liftbridge_default/cluster")
    assert response.status_code == 200, response.text


def test_wrong_or_missing_connection_is_named(op_api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(conn_env_name("not_liftbridge"), json.dumps({"conn_type": "http", "host": "example.com"}))
    assert "pick a liftbridge one" in op_api.get("/api/connections/not_liftbridge/cluster", expect=400)["detail"]
    assert "no connection 'nope'" in op_api.get("/api/connections/nope/cluster", expect=404)["detail"]


async def test_cluster_calls_run_off_the_event_loop(airflow_app: Any, connections: Any) -> None:
    """While one request waits on a slow cluster call, the same event loop serves another: the
    client runs in a worker thread (were it on the loop, the second request would wait for the
    first, which waits for the second: the test fails at its 30 s wait)."""
    import asyncio
    import threading

    import httpx

    from airflow_provider_liftbridge.ui import model

    started, release = threading.Event(), threading.Event()
    real = model.cluster

    def slow(client: LiftbridgeClient) -> dict[str, Any]:
        started.set()
        assert release.wait(30), "the second request was not served while the first waited"
        return real(client)

    headers = {"Authorization": f"Bearer {token('op')}"}
    model.cluster = slow  # type: ignore[assignment]
    try:
        transport = httpx.ASGITransport(app=airflow_app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers) as client:
            first = asyncio.create_task(client.get("/liftbridge/api/connections/liftbridge_default/cluster"))
            while not started.is_set():
                await asyncio.sleep(0.01)
            page = await client.get("/liftbridge/")  # served while the first request's call blocks
            assert page.status_code == 200
            release.set()
            assert (await first).status_code == 200
    finally:
        model.cluster = real  # type: ignore[assignment]
        release.set()


@pytest.mark.parametrize("lazy_discover_providers", [None, "False"], ids=["default-config", "providers-eager"])
def test_airflow_mounts_the_plugin(tmp_path: Any, lazy_discover_providers: str | None) -> None:
    """The package registers the plugin (the ``airflow.plugins`` entry point) and Airflow's own
    ``create_app`` mounts its app and lists its external view, with Airflow's default
    configuration and with ``[core] lazy_discover_providers = False`` (then Airflow loads
    providers' plugins too: the view must not be registered a second time, which Airflow would
    list as an import error). A fresh process: plugins load once per process."""
    script = textwrap.dedent(
        """
        from airflow.utils import db
        db.initdb()
        from airflow import plugins_manager
        from airflow.api_fastapi.app import create_app
        app = create_app("core")
        paths = [getattr(r, "path", "") for r in app.routes]
        print("MOUNTS", sorted(p for p in paths if p.startswith("/liftbridge")))
        from fastapi.testclient import TestClient
        client = TestClient(app)
        page, nobody = client.get("/liftbridge/"), client.get("/liftbridge/api/connections")
        print("PAGE", page.status_code, "NOBODY", nobody.status_code)
        info = [p for p in plugins_manager.get_plugin_info() if p["name"] == "liftbridge_ui"]
        print("VIEWS", [v["href"] for p in info for v in p["external_views"]])
        errors = plugins_manager.get_import_errors()  # others' too (OpenLineage's registers twice itself)
        print("ERRORS", {k: v for k, v in errors.items() if "iftbridge" in k + v})
        """
    )
    env = {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PATH": "/usr/bin:/bin"}
    if lazy_discover_providers is not None:
        env["AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS"] = lazy_discover_providers
    # -P: the working directory is not on sys.path, as for the airflow command. A source
    # checkout's *.egg-info there is a second copy of this distribution, whose entry point
    # would register the plugin again.
    done = run_child([sys.executable, "-P", "-c", script], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MOUNTS ['/liftbridge']" in done.stdout, done.stdout[-2000:]
    assert "VIEWS ['liftbridge/']" in done.stdout, done.stdout[-2000:]
    assert "PAGE 200 NOBODY 401" in done.stdout, done.stdout[-2000:]
    assert "ERRORS {}" in done.stdout, done.stdout[-2000:]


def test_a_consumer_groups_pipeline_and_the_newest_registry_entry(
    op_api: Api, stream_name: str, lb_address: str, connections: Any
) -> None:
    """A group's pipeline covers every partition of its stream, from the group's positions
    (``__group:<id>``); of two entries of one task the newer wins; a registry message that is not
    an entry is skipped."""
    from airflow_provider_liftbridge.client.consumer import group_cursor_id
    from airflow_provider_liftbridge.client.reading import REGISTRY_STREAM, PipelineEntry, record_pipeline

    group = f"g-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=3)
        for partition in range(3):
            client.publish_many(stream_name, [b"x"] * (partition + 2), partition=partition)
        entry = PipelineEntry(
            stream=stream_name,
            position_cursor=group_cursor_id(group),
            plan_key="grouped/read",
            dag_id="grouped",
            task_id="read",
            run_id="run-1",
            partitions=(0,),
            group_id=group,
            mode="ConsumerGroup",
            operator="LiftbridgeConsumeOperator",
        )
        record_pipeline(client, entry)
        client.publish(REGISTRY_STREAM, b"not an entry", key=b"junk")
        record_pipeline(client, dataclasses.replace(entry, run_id="run-2"))
        client.set_cursor(group_cursor_id(group), stream_name, 0, 1)
        client.set_cursor(group_cursor_id(group), stream_name, 2, 0)
    pipeline = pipeline_of(op_api.get("/api/connections/liftbridge_default/pipelines"), stream_name)
    assert (pipeline["group_id"], pipeline["cursor_id"], pipeline["position_cursor"]) == (
        group,
        None,
        f"__group:{group}",
    )
    assert pipeline["last_run_id"] == "run-2"
    rows = {r["partition"]: (r["position"], r["high_watermark"], r["lag"]) for r in pipeline["partitions"]}
    assert rows == {0: (1, 1, 0), 1: (-1, 2, 3), 2: (0, 3, 3)}
    assert group in op_api.get("/api/connections/liftbridge_default/pipelines")["groups"]


def test_reading_messages_needs_the_messages_view(
    op_api: Api, monkeypatch: pytest.MonkeyPatch, connections: Any
) -> None:
    """An auth manager that grants the connection but not the ``Liftbridge Messages`` view: the
    cluster and pipelines answer, the browser and dead letters are refused. (The simple auth
    manager grants that view to every role, so its answer is replaced here for this one check.)"""
    from airflow.api_fastapi.app import get_auth_manager

    from airflow_provider_liftbridge.ui.api import MESSAGES_RESOURCE

    asked: list[str] = []

    def deny(*, method: str, resource_name: str, user: Any) -> bool:
        asked.append(resource_name)
        return False

    monkeypatch.setattr(get_auth_manager(), "is_authorized_custom_view", deny)
    op_api.get("/api/connections/liftbridge_default/cluster")
    op_api.get("/api/connections/liftbridge_default/pipelines")
    refused = op_api.get("/api/connections/liftbridge_default/streams/s/partitions/0/messages", expect=403)
    assert MESSAGES_RESOURCE in refused["detail"]
    op_api.get("/api/connections/liftbridge_default/dead-letters", expect=403)
    assert asked == [MESSAGES_RESOURCE, MESSAGES_RESOURCE]
