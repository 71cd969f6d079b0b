# ruff: noqa: F811  (the fixtures imported from test_api are parameters here)
"""The message browser's endpoints (docs/ui.md, "The message browser"): search by key, value, JSON
path and header, over one partition or all merged by time, newest or oldest first, paging both
ways from an offset, a time or a page position; its bounds; one message whole and its value as a
file; every bad input refused with words; the refusals of every new route.

Against the session dev server (real gRPC) through the view's real FastAPI app behind Airflow's
auth manager, as ``test_api.py``. The messages get known timestamps (the dev server's reception
clock, set per message): message ``i`` is received at ``T0 + i`` seconds.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import set_reception_clock
from airflow_provider_liftbridge.ui import messages
from tests.exact_retention import ONE_MESSAGE_SEGMENTS, publish_each, wait_for_earliest
from tests.ui.test_api import PASSWORD, TOKEN, Api, airflow_app, connections, token  # noqa: F401

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(240)]

T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.UTC)
COUNT = 12
PARTITIONS = 3


def message_of(i: int) -> dict[str, Any]:
    """What message ``i`` holds: partition ``i % 3``, key ``k-<i % 4>``, a JSON value (but 7's
    is text), the header ``trace`` on even ones."""
    value = (
        b"plain text seven"
        if i == 7
        else json.dumps({"n": i, "status": "shipped" if i % 2 else "new", "tags": [f"t{i % 3}"]}).encode()
    )
    return {
        "partition": i % PARTITIONS,
        "key": f"k-{i % 4}".encode(),
        "value": value,
        "headers": {"trace": f"t-{i}".encode()} if i % 2 == 0 else {},
    }


@pytest.fixture
def stream(stream_name: str, lb_address: str, connections: Any) -> Iterator[str]:
    """A 3-partition stream of :data:`COUNT` messages, message ``i`` received at ``T0 + i`` s."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=PARTITIONS)
        try:
            for i in range(COUNT):
                set_reception_clock(stream_name, T0 + dt.timedelta(seconds=i))
                m = message_of(i)
                client.publish(stream_name, m["value"], key=m["key"], headers=m["headers"], partition=m["partition"])
        finally:
            set_reception_clock(stream_name, None)
    yield stream_name


@pytest.fixture
def api(airflow_app: Any) -> Api:
    return Api(airflow_app, token("op"))


def search(api: Api, stream: str, expect: int = 200, **params: Any) -> dict[str, Any]:
    """One search; its events by type (``messages``: the found ones' ``i``, from the offset and
    partition), or the refusal's body."""
    response = api.client.get(
        f"/liftbridge/api/connections/liftbridge_default/streams/{stream}/search", headers=api.headers, params=params
    )
    api.bodies.append(response.text)
    assert response.status_code == expect, response.text
    if expect != 200:
        return dict(response.json())
    assert response.headers["content-type"].startswith("application/x-ndjson")
    events = [json.loads(line) for line in response.text.splitlines()]
    assert events[0]["type"] == "start" and events[-1]["type"] == "end", events
    found = [e["message"] for e in events if e["type"] == "message"]
    return {
        "start": events[0],
        "end": events[-1],
        "progress": [e for e in events if e["type"] == "progress"],
        "found": [m["offset"] * PARTITIONS + m["partition"] for m in found],  # = i
        "messages": found,
    }


def test_merged_by_time_newest_and_oldest_first(api: Api, stream: str) -> None:
    newest = search(api, stream, limit=5)
    assert newest["found"] == [11, 10, 9, 8, 7]
    assert newest["start"]["partitions"] == [0, 1, 2] and newest["start"]["scan"] == "backward"
    assert newest["end"]["reason"] == "page"
    oldest = search(api, stream, order="oldest", limit=5)
    assert oldest["found"] == [0, 1, 2, 3, 4]
    assert [m["timestamp"][:19] for m in oldest["messages"]][:2] == ["2025-03-01T12:00:00", "2025-03-01T12:00:01"]
    one = search(api, stream, partition="1", order="oldest")
    assert one["found"] == [1, 4, 7, 10] and one["end"]["reason"] == "end" and one["end"]["continue"]["done"]
    assert one["end"]["scanned"] == 4 and one["progress"][-1]["scanned"] == 4


def test_search_by_key_value_path_and_header(api: Api, stream: str) -> None:
    assert search(api, stream, key="k-1")["found"] == [9, 5, 1]
    assert search(api, stream, key="hex:6b2d32")["found"] == [10, 6, 2]  # "k-2"
    assert search(api, stream, value="text sev")["found"] == [7]
    assert search(api, stream, value='"status": "new"', order="oldest")["found"] == [0, 2, 4, 6, 8, 10]
    assert search(api, stream, path="$.n == 3")["found"] == [3]
    assert search(api, stream, path="$.status == shipped")["found"] == [11, 9, 5, 3, 1]  # 7 is not JSON
    assert search(api, stream, path='$.status != "shipped"')["found"] == [10, 8, 6, 4, 2, 0]
    assert search(api, stream, path="$.tags[0] == t2")["found"] == [11, 8, 5, 2]
    assert search(api, stream, path='$["tags"][-1]')["found"] == [11, 10, 9, 8, 6, 5, 4, 3, 2, 1, 0]
    assert search(api, stream, path="$.missing")["found"] == []
    assert search(api, stream, path="$.n == true")["found"] == []  # JSON's true is not 1
    assert search(api, stream, header="trace")["found"] == [10, 8, 6, 4, 2, 0]
    assert search(api, stream, header="trace=t-4")["found"] == [4]
    # Filters together: all must hold.
    assert search(api, stream, key="k-0", header="trace", path="$.n == 8")["found"] == [8]
    # Liftbridge's own subject and reply headers are not the message's headers.
    assert search(api, stream, header="subject")["found"] == []
    shown = search(api, stream, partition="0", limit=2)["messages"]
    assert [sorted(m["headers"]) for m in shown] == [[], ["trace"]]  # 9 has none, 6 has trace


def test_paging_both_ways_from_an_offset_a_time_and_a_page(api: Api, stream: str) -> None:
    first = search(api, stream, limit=4)
    assert first["found"] == [11, 10, 9, 8]
    older = search(api, stream, limit=4, **_page(first["end"]["continue"]))
    assert older["found"] == [7, 6, 5, 4]
    last = search(api, stream, limit=4, **_page(older["end"]["continue"]))
    assert last["found"] == [3, 2, 1, 0] and last["end"]["continue"]["done"]
    # Back from a page: the newer ones, read oldest first (the page shows them reversed).
    newer = search(api, stream, limit=4, **_page(older["end"]["back"]))
    assert newer["found"] == [8, 9, 10, 11] and newer["end"]["continue"]["done"]
    assert first["end"]["back"]["done"]  # nothing newer than the newest
    # From an offset (every partition's), newest first: at or before it; oldest first: from it.
    assert search(api, stream, offset="1", limit=20)["found"] == [5, 4, 3, 2, 1, 0]
    assert search(api, stream, offset="3", order="oldest", limit=3)["found"] == [9, 10, 11]
    assert search(api, stream, partition="2", offset="1", order="oldest", limit=1)["found"] == [5]
    # From a time: newest first, the last message at or before it; oldest first, from it on.
    at = (T0 + dt.timedelta(seconds=6.5)).isoformat()
    assert search(api, stream, time=at, limit=3)["found"] == [6, 5, 4]
    assert search(api, stream, time=at, order="oldest", limit=3)["found"] == [7, 8, 9]
    assert search(api, stream, time="2025-03-01T13:00", limit=2)["found"] == [11, 10]  # UTC without a zone
    assert search(api, stream, time="2025-03-01T14:00+01:00", order="oldest")["found"] == []
    # A page from a time, then on: no message twice, none left out.
    seen = []
    page = search(api, stream, time=at, order="oldest", limit=2)
    while True:
        seen += page["found"]
        if page["end"]["continue"]["done"]:
            break
        page = search(api, stream, order="oldest", limit=2, **_page(page["end"]["continue"]))
    assert seen == list(range(7, COUNT))


def _page(position: dict[str, Any]) -> dict[str, str]:
    return {"at": position["at"], "scan": position["scan"]}


def test_a_search_too_wide_for_its_bytes_bound_says_so_and_shows_what_it_found(api: Api, stream: str) -> None:
    """The bound is the bytes examined: a bound below the stream's size stops the search with what
    it found, and where to go on from."""
    wide = search(api, stream, partition="0", order="oldest", value="n", max_bytes="60")
    assert wide["end"]["reason"] == "bytes"
    assert wide["end"]["bytes"] >= 60
    assert wide["found"] and wide["found"] == [0, 3, 6, 9][: len(wide["found"])]
    assert wide["start"]["bounds"] == {"bytes": 60, "seconds": messages.MAX_SCAN_SECONDS, "page": 20}
    rest = search(api, stream, partition="0", order="oldest", value="n", **_page(wide["end"]["continue"]))
    assert wide["found"] + rest["found"] == [0, 3, 6, 9]
    # The default bound is the documented one.
    assert search(api, stream, limit=1)["start"]["bounds"]["bytes"] == messages.MAX_SCAN_BYTES == 64 * 1024 * 1024


def test_the_time_bound_stops_a_search_with_what_it_found(stream: str, lb_address: str) -> None:
    """The time bound, on a clock that moves a second per look: the search stops after the
    messages it read within :data:`MAX_SCAN_SECONDS` and says so."""
    ticks = iter(range(10_000))
    with LiftbridgeClient(lb_address) as client:
        planned = messages.plan(client, stream, order="oldest", value="{")
        planned.clock = lambda: float(next(ticks))
        events = list(planned.events())
    end = events[-1]
    assert end["reason"] == "time"
    found = [e["message"]["offset"] * PARTITIONS + e["message"]["partition"] for e in events if e["type"] == "message"]
    assert 0 < end["scanned"] < COUNT and found == [i for i in range(end["scanned"]) if i != 7]
    assert end["seconds"] >= messages.MAX_SCAN_SECONDS


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"time": "yesterday"}, "time", "2026-12-06T09:30"),
        ({"time": "2999-01-01T00:00Z"}, "time", "between 1970 and 2262"),
        ({"offset": "-3"}, "offset", "whole number, 0 or more"),
        ({"offset": "ten"}, "offset", "whole number, 0 or more"),
        ({"offset": "1", "time": "2025-03-01T12:00"}, "time", "not both"),
        ({"key": "hex:zz"}, "key", "pairs of hex digits"),
        ({"path": "status == 1"}, "path", "starts with $"),
        ({"path": "$.a..b"}, "path", "cannot read the path"),
        ({"path": "$.a =="}, "path", "== or !="),
        ({"path": '$.a == {"x"'}, "path", "not valid JSON"),
        ({"header": "=v"}, "header", "name=value"),
        ({"limit": "1000"}, "page size", "from 1 to 500"),
        ({"order": "sideways"}, "order", "newest or oldest"),
        ({"partition": "one"}, "partition", "whole number"),
        ({"at": "0-15"}, "at", "partition:offset"),
    ],
)
def test_bad_input_is_refused_with_what_to_type(
    api: Api, stream: str, params: dict[str, str], field: str, words: str
) -> None:
    body = search(api, stream, expect=400, **params)
    assert body["detail"]["field"] == field
    assert words in body["detail"]["message"], body


def test_missing_stream_partition_or_message_is_named(api: Api, stream: str) -> None:
    missing = f"nope-{uuid.uuid4().hex}"
    assert "does not exist" in search(api, missing, expect=404)["detail"]
    assert "no partition 7 (it has [0, 1, 2])" in search(api, stream, expect=404, partition="7")["detail"]
    base = f"/api/connections/liftbridge_default/streams/{stream}/partitions"
    assert "no message at offset 99" in api.get(f"{base}/0/messages/99", expect=404)["detail"]
    assert api.get(f"{base}/0/messages/x", expect=400)["detail"]["field"] == "offset"


def test_a_paused_partition_is_skipped_in_a_merged_search_and_refused_alone(
    api: Api, stream: str, lb_address: str
) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.pause_stream(stream, [1])
    merged = search(api, stream, order="oldest")
    assert merged["start"]["partitions"] == [0, 2] and "paused" in merged["start"]["skipped"]["1"]
    assert merged["found"] == [i for i in range(COUNT) if i % PARTITIONS != 1]
    assert "paused" in search(api, stream, expect=409, partition="1")["detail"]


def test_one_message_whole_and_its_value_as_a_file(api: Api, stream: str, lb_address: str) -> None:
    with LiftbridgeClient(lb_address) as client:
        ack = client.publish(stream, b"\x00\x01" + b"x" * 30_000, key=b"\xff", headers={"h": b"v"}, partition=2)
    base = f"/api/connections/liftbridge_default/streams/{stream}/partitions"
    body = api.get(f"{base}/2/messages/{ack.offset}")
    assert base64.b64decode(body["value_b64"]) == b"\x00\x01" + b"x" * 30_000
    assert (body["value_size"], body["value_cut"], body["key_b64"]) == (30_002, False, "/w==")
    assert body["subject"] == f"{stream}.2" and body["reply_subject"] == ""
    assert list(body["message"]["headers"]) == ["h"]
    json_one = api.get(f"{base}/1/messages/0")["message"]
    assert json_one["value"]["value"] == {"n": 1, "status": "shipped", "tags": ["t1"]}
    response = api.client.get(f"/liftbridge{base}/2/messages/{ack.offset}/value", headers=api.headers)
    assert response.status_code == 200
    assert response.content == b"\x00\x01" + b"x" * 30_000
    assert response.headers["content-disposition"] == f'attachment; filename="{stream}-2-{ack.offset}.bin"'


def test_old_browse_route_refuses_a_free_text_time_with_words(api: Api, stream: str) -> None:
    path = f"/api/connections/liftbridge_default/streams/{stream}/partitions/0/messages"
    refused = api.get(path, expect=400, from_time="yesterday")["detail"]
    assert refused["field"] == "from_time" and "2026-12-06T09:30" in refused["message"]
    assert "from 1 to 200" in api.get(path, expect=400, last="1000")["detail"]["message"]
    found = api.get(path, from_offset="1", limit="3")["messages"]
    assert [m["offset"] for m in found] == [1, 2, 3]
    # Only the publisher's headers: not Liftbridge's own subject and reply on every message.
    assert [sorted(m["headers"]) for m in found] == [[], ["trace"], []]


def test_new_routes_refuse_without_a_user_and_with_a_forged_token(airflow_app: Any, stream: str) -> None:
    base = f"/api/connections/liftbridge_default/streams/{stream}"
    paths = [f"{base}/search", f"{base}/partitions/0/messages/0", f"{base}/partitions/0/messages/0/value"]
    nobody, forged, viewer = Api(airflow_app, None), Api(airflow_app, "not-a-jwt"), Api(airflow_app, token("viewer"))
    for path in paths:
        assert nobody.get(path, expect=401)["detail"] == "Not authenticated"
        forged.get(path, expect=403)
        viewer.get(path, expect=403)  # may not read the connection (the simple auth manager: op and up)
    for body in nobody.bodies + forged.bodies + viewer.bodies:
        assert '"n"' not in body and "plain text" not in body  # no message in a refusal


def test_new_routes_need_the_messages_view(api: Api, stream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    monkeypatch.setattr(get_auth_manager(), "is_authorized_custom_view", lambda **_: False)
    base = f"/api/connections/liftbridge_default/streams/{stream}"
    for path in (f"{base}/search", f"{base}/partitions/0/messages/0", f"{base}/partitions/0/messages/0/value"):
        assert "Liftbridge Messages" in api.get(path, expect=403)["detail"]


def test_no_secret_of_the_connection_in_any_answer_of_the_browser(
    airflow_app: Any,
    stream: str,
    connections: dict[str, str],
) -> None:
    user = Api(airflow_app, token("op"))
    for conn_id in connections.values():
        base = f"/api/connections/{conn_id}/streams/{stream}"
        for params in ({}, {"order": "oldest", "key": "k-1"}, {"time": "yesterday"}):
            response = user.client.get(f"/liftbridge{base}/search", headers=user.headers, params=params)
            user.bodies.append(response.text)
        user.get(f"{base}/partitions/0/messages/0")
        user.get(f"{base}/partitions/0/messages/0/value")
        user.get(f"/api/connections/{conn_id}/streams/missing-{uuid.uuid4().hex}/search", expect=404)
    assert len(user.bodies) == 12
    for body in user.bodies:
        assert PASSWORD not in body and TOKEN not in body
        assert "nats-user" not in body and "nats://" not in body


def test_the_page_states_the_servers_bounds() -> None:
    """The form's help line names the bounds the server applies (docs/ui.md says them too)."""
    from pathlib import Path

    page = (Path(messages.__file__).parent / "static" / "index.html").read_text()
    docs = (Path(messages.__file__).parents[2] / "docs" / "ui.md").read_text()
    for text in (page, docs):
        assert f"{messages.MAX_SCAN_BYTES // 2**20} MiB of messages or for {messages.MAX_SCAN_SECONDS:g} s" in text
    script = (Path(messages.__file__).parent / "static" / "browser.js").read_text()
    assert f"const MAX_PAGE = {messages.MAX_PAGE};" in script


async def test_a_search_the_browser_leaves_is_closed(stream: str, lb_address: str) -> None:
    """When the browser goes away (its Stop button aborts the request), Starlette closes the
    answer's generator: the search's reading ends and its client is closed."""
    from airflow_provider_liftbridge.client import ClientClosedError
    from airflow_provider_liftbridge.ui.api import _ndjson

    client = LiftbridgeClient(lb_address)
    events = messages.plan(client, stream, order="oldest", limit="1").events()
    answer = _ndjson(client, events, [])
    assert json.loads(await answer.__anext__())["type"] == "start"
    assert json.loads(await answer.__anext__())["type"] == "message"
    await answer.aclose()
    assert events.gi_frame is None  # type: ignore[attr-defined]  # the generator is closed
    with pytest.raises(ClientClosedError):
        client.fetch_metadata([stream])


def test_a_partition_whose_oldest_messages_are_gone(
    api: Api, stream_name: str, lb_address: str, connections: Any
) -> None:
    """Retention removed offsets 0 to 6: pages read what is kept, either way, and end at it."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, retention_max_messages=5, **ONE_MESSAGE_SEGMENTS)
        publish_each(client, stream_name, [b"m%d" % i for i in range(12)])
        wait_for_earliest(client, stream_name, 7)
    offsets = lambda body: [m["offset"] for m in body["messages"]]  # noqa: E731
    assert offsets(search(api, stream_name)) == [11, 10, 9, 8, 7]
    assert offsets(search(api, stream_name, order="oldest")) == [7, 8, 9, 10, 11]
    page, seen = search(api, stream_name, limit=2), []
    while True:
        seen += offsets(page)
        if page["end"]["continue"]["done"]:
            break
        page = search(api, stream_name, limit=2, **_page(page["end"]["continue"]))
    assert seen == [11, 10, 9, 8, 7]
    below = search(api, stream_name, at="0:5", scan="backward")
    assert offsets(below) == [] and below["end"]["continue"]["done"]
    assert offsets(search(api, stream_name, offset="2", order="oldest")) == [7, 8, 9, 10, 11]
    base = f"/api/connections/liftbridge_default/streams/{stream_name}/partitions/0/messages"
    assert "removed by retention" in api.get(f"{base}/2", expect=404)["detail"]
    assert base64.b64decode(api.get(f"{base}/7")["value_b64"]) == b"m7"
