"""The view's actions (docs/ui.md, "Actions"): replaying dead letters to their source stream and
moving a pipeline's cursor, through FastAPI's TestClient behind Airflow's real auth manager,
against the session dev server (real gRPC, real NATS) and real DAG runs (``dag.test()``).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, Record
from airflow_provider_liftbridge.ui.actions import REPLAYED_FROM_HEADER
from airflow_provider_liftbridge.ui.actions_api import ACTIONS_RESOURCE
from tests.airflow_support import xcom_of
from tests.ui.test_api import PASSWORD, TOKEN, Api, airflow_app, connections, run_consume, token  # noqa: F401

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(300)]

BASE = "/api/connections/liftbridge_default"


class ActionApi(Api):
    """:class:`Api` that also posts JSON."""

    def post(self, path: str, body: Any, expect: int = 200) -> Any:
        headers = self.headers | {"Content-Type": "application/json"}
        response = self.client.post(f"/liftbridge{path}", headers=headers, content=json.dumps(body))
        self.bodies.append(response.text)
        assert response.status_code == expect, response.text
        return response.json()


@pytest.fixture
def op(airflow_app: Any, connections: Any) -> ActionApi:  # noqa: F811
    return ActionApi(airflow_app, token("op"))


def _source_copies(client: LiftbridgeClient, stream: str) -> list[Any]:
    """Every message of ``stream`` that a replay put back."""
    info = client.fetch_metadata([stream]).streams[stream]
    found = []
    for p, part in info.partitions.items():
        if part.high_watermark >= 0:
            messages = client.subscribe(stream, partition=p, start_at=0, stop_at=part.high_watermark)
            found += [m for m in messages if REPLAYED_FROM_HEADER in m.headers]
    return found


def _audit_rows(event: str) -> list[Any]:
    from airflow.models import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(Log).where(Log.event == event).order_by(Log.id)).all()
        return [(r.owner, json.loads(r.extra), r.dag_id, r.task_id) for r in rows]


@contextmanager
def _task_state(dag_run: Any, state: str) -> Iterator[None]:
    """The run's ``consume`` task instance in ``state`` in Airflow's metastore, then back."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import update

    where = (TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id)
    with create_session() as session:
        session.execute(update(TaskInstance).where(*where).values(state=state))
    try:
        yield
    finally:
        with create_session() as session:
            session.execute(update(TaskInstance).where(*where).values(state="success"))


def test_a_replay_of_1000_letters_puts_each_back_once_however_often_it_is_sent(
    op: ActionApi, stream_name: str, lb_address: str
) -> None:
    """1,000 dead letters (a consume run that could parse none of them), replayed by two requests
    sent at once (a double click) and a third after them (a retry): each letter is in its source
    partition once, with its value and key, and the letters stay in the dead-letter stream."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        for p in (0, 1):
            bad = [Record(b"bad %d-%d" % (p, i), key=b"k%d" % p) for i in range(500)]
            client.publish_many(stream_name, bad, partition=p)
    run = run_consume(stream_name)
    assert xcom_of(run, "consume")["dead_lettered"] == 1000
    dlq = f"{stream_name}-dlq"

    plan = op.post(f"{BASE}/dead-letters/{dlq}/replay-plan", {})
    assert (plan["count"], plan["targets"], plan["through"]) == (1000, {stream_name: 1000}, {"0": 999})
    answers: list[dict[str, Any]] = []

    def click() -> None:
        answers.append(op.post(f"{BASE}/dead-letters/{dlq}/replay", {"through": plan["through"]}))

    clicks = [threading.Thread(target=click) for _ in range(2)]
    for c in clicks:
        c.start()
    for c in clicks:
        c.join()
    assert len(answers) == 2
    assert sorted((a["replayed"], a["already_replayed"]) for a in answers) == [(0, 1000), (1000, 0)]
    again = op.post(f"{BASE}/dead-letters/{dlq}/replay", {"through": {"0": 999}})
    assert (again["count"], again["replayed"], again["already_replayed"]) == (1000, 0, 1000)

    with LiftbridgeClient(lb_address) as client:
        copies = _source_copies(client, stream_name)
        assert client.fetch_metadata([dlq]).streams[dlq].partitions[0].high_watermark == 999
    origins = Counter(m.headers[REPLAYED_FROM_HEADER].decode() for m in copies)
    assert len(copies) == 1000 and set(origins.values()) == {1}
    assert set(origins) == {f"{dlq}/0/{o}" for o in range(1000)}
    for m in copies:  # each back in the partition it came from, as it was
        assert m.value.startswith(b"bad %d-" % m.partition) and m.key == b"k%d" % m.partition
        assert not any(h.startswith("dead-letter-") and h != REPLAYED_FROM_HEADER for h in m.headers)
    [*_, last] = _audit_rows("liftbridge_replay_dead_letters")
    assert last[0] == "op-user"
    assert last[1] | {"targets": None} == {
        "connection_id": "liftbridge_default",
        "stream": dlq,
        "selection": "all up to 0:999",
        "count": 1000,
        "replayed": 0,
        "already_replayed": 1000,
        "targets": None,
    }


def test_selected_letters_go_back_and_bad_selections_change_nothing(
    op: ActionApi, stream_name: str, lb_address: str
) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b'{"n": 0}', b"bad 1", b"bad 2", b"bad 3"])
    run_consume(stream_name)
    dlq, url = f"{stream_name}-dlq", f"{BASE}/dead-letters/{stream_name}-dlq/replay"
    plan = op.post(f"{BASE}/dead-letters/{dlq}/replay-plan", {"letters": ["0:2", "0:0"]})
    assert (plan["count"], plan["letters"]) == (2, ["0:0", "0:2"])
    done = op.post(url, {"letters": ["0:0", "0:2"]})
    assert (done["replayed"], done["already_replayed"]) == (2, 0)

    refusals = {
        "0:7": "holds letters up to offset 2",
        "0-1": '"partition:offset"',
        "5:0": "has no partition 5",
    }
    for letter, words in refusals.items():
        detail = op.post(url, {"letters": [letter]}, expect=400)["detail"]
        assert detail["field"] == "letters" and words in detail["message"], detail
    assert "send a JSON object" in op.post(url, ["0:0"], expect=400)["detail"]
    as_form = op.client.post(f"/liftbridge{url}", headers=op.headers, data={"letters": "0:0"})
    assert as_form.status_code == 415 and "Content-Type: application/json" in as_form.text
    assert "name the letters" in op.post(url, {}, expect=400)["detail"]["message"]
    with LiftbridgeClient(lb_address) as client:
        client.publish(dlq, b"no headers")  # not written by a reading operator: no source
        assert "has no dead-letter-source-stream" in op.post(url, {"letters": ["0:3"]}, expect=400)["detail"]["message"]
        client.delete_stream(stream_name)  # the source deleted meanwhile: nothing sent anywhere
        detail = op.post(url, {"letters": ["0:1"]}, expect=404)["detail"]
        assert f"source stream {stream_name!r} does not exist" in detail and "nothing was changed" in detail
        client.delete_stream(dlq)
    assert "does not exist" in op.post(url, {"letters": ["0:1"]}, expect=404)["detail"]
    refused = [row[1] for row in _audit_rows("liftbridge_replay_dead_letters") if row[1]["stream"] == dlq]
    assert [r.get("replayed") for r in refused] == [2] + [None] * 7
    assert "does not exist" in refused[-1]["refused"]


def test_a_moved_cursor_is_where_the_next_run_reads_from(op: ActionApi, stream_name: str, lb_address: str) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        client.publish_many(stream_name, [b'{"n": %d}' % i for i in range(10)], partition=0)
        client.publish_many(stream_name, [b'{"n": %d}' % i for i in range(4)], partition=1)
    first = run_consume(stream_name)
    assert xcom_of(first, "consume")["processed"] == 14
    url = f"{BASE}/pipelines/ui_{stream_name}/consume/cursor"

    # While the task runs (its commits would undo a move), nothing moves.
    with _task_state(first, "running"):
        busy = op.post(url, {"offset": "3"}, expect=409)["detail"]
        assert f"is queued or running in run {first.run_id!r}" in busy and "pause the DAG" in busy

    done = op.post(url, {"offset": "3", "partitions": [0]})
    assert done["moved"] == [{"partition": 0, "from": 10, "to": 3}]
    assert xcom_of(run_consume(stream_name), "consume")["processed"] == 7  # offsets 3..9 again

    with LiftbridgeClient(lb_address) as client:
        sixth = next(iter(client.subscribe(stream_name, partition=0, start_at=6, stop_at=6)))
    # Its stamp cut to whole microseconds (what a time can say): the first message at or after it is the 6th.
    when = (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=sixth.timestamp // 1000)).isoformat()
    done = op.post(url, {"time": when})
    assert {m["partition"]: m["to"] for m in done["moved"]}[0] <= 6
    assert xcom_of(run_consume(stream_name), "consume")["processed"] >= 4  # from the 6th (or an equal stamp) on

    done = op.post(url, {"offset": "0"})
    assert [m["to"] for m in done["moved"]] == [0, 0]
    assert xcom_of(run_consume(stream_name), "consume")["processed"] == 14
    pipeline = next(p for p in op.get(f"{BASE}/pipelines")["pipelines"] if p["stream"] == stream_name)
    assert [r["position"] for r in pipeline["partitions"]] == [9, 3]

    refusals = [
        ({"offset": "abc"}, "offset must be a whole number"),
        ({"offset": "11"}, "type at most 10"),
        ({"time": "yesterday"}, "time"),
        ({"offset": "1", "time": when}, "not both"),
        ({}, "type an offset"),
        ({"offset": "1", "partitions": [7]}, "has no partition 7"),
    ]
    for body, words in refusals:
        detail = op.post(url, body, expect=400)["detail"]
        assert words in detail["message"], (body, detail)
    missing = op.post(f"{BASE}/pipelines/no_dag/consume/cursor", {"offset": "1"}, expect=404)["detail"]
    assert "no pipeline no_dag.consume" in missing
    with LiftbridgeClient(lb_address) as client:
        client.delete_stream(stream_name)
    assert "deleted meanwhile" in op.post(url, {"offset": "1"}, expect=404)["detail"]
    rows = [r for r in _audit_rows("liftbridge_move_cursor") if r[2] == f"ui_{stream_name}"]
    assert rows[0][0] == "op-user" and rows[0][3] == "consume" and "running" in rows[0][1]["refused"]
    assert rows[1][1]["moved"] == [{"partition": 0, "from": 10, "to": 3}]
    assert "deleted meanwhile" in rows[-1][1]["refused"]


ROUTES = [
    ("post", f"{BASE}/dead-letters/d/replay-plan"),
    ("post", f"{BASE}/dead-letters/d/replay"),
    ("post", f"{BASE}/pipelines/dag/task/cursor"),
]


def test_every_action_route_refuses_no_login_a_forged_token_and_read_only_users(
    airflow_app: Any,  # noqa: F811
    connections: Any,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    nobody, forged = ActionApi(airflow_app, None), ActionApi(airflow_app, "not-a-jwt")
    viewer, user = ActionApi(airflow_app, token("viewer")), ActionApi(airflow_app, token("user"))
    for _, path in ROUTES:
        assert nobody.post(path, {"letters": ["0:0"]}, expect=401)["detail"] == "Not authenticated"
        forged.post(path, {"letters": ["0:0"]}, expect=403)
        viewer.post(path, {"letters": ["0:0"]}, expect=403)
        user.post(path, {"letters": ["0:0"]}, expect=403)
    nobody.get(f"{BASE}/actions", expect=401)
    forged.get(f"{BASE}/actions", expect=403)
    viewer.get(f"{BASE}/actions", expect=403)
    op = ActionApi(airflow_app, token("op"))
    assert op.get(f"{BASE}/actions")["allowed"] is True

    # An auth manager that lets the user read the connection but not edit it: no action.
    manager = get_auth_manager()
    reads_only = manager.is_authorized_connection

    def read_only(*, method: str, details: Any = None, user: Any) -> bool:
        return method == "GET" and reads_only(method=method, details=details, user=user)

    monkeypatch.setattr(manager, "is_authorized_connection", read_only)
    assert op.get(f"{BASE}/actions")["allowed"] is False
    for _, path in ROUTES:
        assert "edit rights on connection" in op.post(path, {"letters": ["0:0"]}, expect=403)["detail"]
    monkeypatch.undo()

    # One that tells methods apart on custom views (FAB, Keycloak) and withholds the actions view.
    def no_actions(*, method: str, resource_name: str, user: Any) -> bool:
        return resource_name != ACTIONS_RESOURCE

    monkeypatch.setattr(manager, "is_authorized_custom_view", no_actions)
    assert op.get(f"{BASE}/actions")["allowed"] is False
    for _, path in ROUTES:
        assert ACTIONS_RESOURCE in op.post(path, {"letters": ["0:0"]}, expect=403)["detail"]
    monkeypatch.undo()

    # Moving a cursor also needs edit rights on the DAG.
    monkeypatch.setattr(manager, "is_authorized_dag", lambda *, method, details=None, access_entity=None, user: False)
    assert "edit rights on it" in op.post(ROUTES[2][1], {"offset": "1"}, expect=403)["detail"]


def test_no_secret_in_any_action_answer(airflow_app: Any, connections: dict[str, str], stream_name: str) -> None:  # noqa: F811
    op = ActionApi(airflow_app, token("op"))
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    for conn_id in connections.values():
        base = f"/api/connections/{conn_id}"
        op.get(f"{base}/actions")
        op.post(f"{base}/dead-letters/{missing}/replay-plan", {}, expect=404)
        op.post(f"{base}/dead-letters/{missing}/replay", {"letters": ["0:0"]}, expect=404)
        op.post(f"{base}/pipelines/d/t/cursor", {"offset": "1"}, expect=404)
        op.post(f"{base}/pipelines/d/t/cursor", {"offset": "x"}, expect=400)
    for body in op.bodies:
        assert PASSWORD not in body and TOKEN not in body and "nats://" not in body


def test_a_groups_cursor_moves_only_without_members_and_an_interval_reader_has_none(
    op: ActionApi, stream_name: str, lb_address: str
) -> None:
    """A consumer group's position moves only while the group has no member (a member would commit
    over it), never to offset 0 (no position: its members would start at their auto_offset); a
    task reading by interval has no position to move."""
    import dataclasses

    from airflow_provider_liftbridge.client.consumer import group_cursor_id
    from airflow_provider_liftbridge.client.reading import PipelineEntry, record_pipeline

    group = f"g-{uuid.uuid4().hex[:8]}"
    entry = PipelineEntry(
        stream=stream_name,
        position_cursor=group_cursor_id(group),
        plan_key=f"grouped_{group}/read",
        dag_id=f"grouped_{group}",
        task_id="read",
        run_id="run-1",
        partitions=(0,),
        group_id=group,
        mode="ConsumerGroup",
    )
    url = f"{BASE}/pipelines/grouped_{group}/read/cursor"
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name)
        client.publish_many(stream_name, [b"x"] * 5)
        record_pipeline(client, entry)
        with client.group_consumer(group, stream_name, consumer_id="alpha") as member:
            member.join()
            assert "has members" in op.post(url, {"offset": "2"}, expect=400)["detail"]["message"]
        assert "cannot be moved to offset 0" in op.post(url, {"offset": "0"}, expect=400)["detail"]["message"]
        [moved] = op.post(url, {"offset": "2"})["moved"]  # "from": where the member left it, if it committed
        assert (moved["partition"], moved["to"]) == (0, 2)
        assert client.fetch_cursor(group_cursor_id(group), stream_name, 0) == 1

        by_interval = dataclasses.replace(entry, dag_id=f"interval_{group}", group_id=None, mode="DataInterval")
        record_pipeline(client, by_interval)
    refused = op.post(f"{BASE}/pipelines/interval_{group}/read/cursor", {"offset": "2"}, expect=400)["detail"]
    assert "reads by data interval" in refused["message"]
