"""A dead letter goes back to its source at most once, whatever the selection and whoever asks
(docs/ui.md, "Actions"): overlapping selections one after the other and at once, two api-servers
claiming the same letters at the same moment, and a replay that died between its claim and its
end. Through FastAPI's TestClient behind Airflow's real auth, against the session dev server (real
gRPC, real NATS); every check reads the source stream back.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from tests.ui.test_actions import BASE, ActionApi, _source_copies
from tests.ui.test_api import airflow_app, connections, run_consume, token  # noqa: F401

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(300)]


@pytest.fixture
def op(airflow_app: Any, connections: Any) -> ActionApi:  # noqa: F811
    return ActionApi(airflow_app, token("op"))


def _letters(stream: str, lb_address: str, count: int) -> str:
    """``count`` dead letters (offsets 0 to count - 1 of partition 0) of ``stream``: its dead-letter stream."""
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream, stream)
        client.publish_many(stream, [b"bad %d" % i for i in range(count)])
    run_consume(stream)
    return f"{stream}-dlq"


def _origins(stream: str, lb_address: str) -> Counter[str]:
    """How often each letter is in the source stream (by its ``dead-letter-replayed-from``)."""
    with LiftbridgeClient(lb_address) as client:
        return Counter(m.headers["dead-letter-replayed-from"].decode() for m in _source_copies(client, stream))


def _ids(dlq: str, offsets: range | list[int]) -> set[str]:
    return {f"{dlq}/0/{o}" for o in offsets}


def test_overlapping_selections_put_each_letter_back_once(op: ActionApi, stream_name: str, lb_address: str) -> None:
    """Selection A, then B overlapping it: B skips A's letters and says which. Then C and D, which
    overlap, sent at once: each letter once. (On ffb6b39, a producer id per selection, B put 0:1
    and 0:2 back a second time.)"""
    dlq = _letters(stream_name, lb_address, 10)
    url = f"{BASE}/dead-letters/{dlq}/replay"
    a = op.post(url, {"letters": ["0:0", "0:1", "0:2"]})
    assert (a["replayed"], a["already_replayed"]) == (3, 0)
    b = op.post(url, {"letters": ["0:1", "0:2", "0:3", "0:4"]})
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(5)))
    assert (b["replayed"], b["already_replayed"], b["skipped"]) == (2, 2, ["0:1", "0:2"])
    # The dialog's plan says which of a selection were replayed before.
    plan = op.post(f"{BASE}/dead-letters/{dlq}/replay-plan", {"letters": ["0:4", "0:5"]})
    assert (plan["count"], plan["already_replayed"], plan["skipped"]) == (2, 1, ["0:4"])

    answers = _at_once(op, url, [["0:5", "0:6", "0:7"], ["0:6", "0:7", "0:8", "0:9"]])
    assert sum(a["replayed"] for a in answers) == 5  # 0:5 to 0:9, each by one of them
    assert sorted(a["already_replayed"] for a in answers) == [0, 2]  # one waited for the other: 0:6, 0:7 skipped
    # "all", after them: nothing left to put back.
    again = op.post(url, {"through": {"0": 9}})
    assert (again["replayed"], again["already_replayed"]) == (0, 10)
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(10)))


def test_two_api_servers_claiming_the_same_letters_at_once_put_each_back_once(
    op: ActionApi, stream_name: str, lb_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replays that do not wait for each other (as in two api-server processes: no shared
    lock), held until both have read the ledger and are about to claim: the first claim in the
    ledger wins each letter, the other skips it."""
    from airflow_provider_liftbridge.ui import actions

    dlq = _letters(stream_name, lb_address, 6)

    class Unshared(dict):  # type: ignore[type-arg]
        def __getitem__(self, key: str) -> threading.Lock:
            return threading.Lock()  # a lock of its own per request: nothing waits in the process

    monkeypatch.setattr(actions, "_RUNNING", Unshared())
    both_read = threading.Barrier(2, timeout=120)
    append = actions.ledger_append

    def held(client: Any, ledger: Any, kind: str, producer: str, letters: Any = ()) -> int:
        if kind == "claim":
            both_read.wait()  # each has read the ledger: neither has seen the other's claim
        return append(client, ledger, kind, producer, letters)

    monkeypatch.setattr(actions, "ledger_append", held)
    url = f"{BASE}/dead-letters/{dlq}/replay"
    answers = _at_once(op, url, [["0:0", "0:1", "0:2", "0:3"], ["0:2", "0:3", "0:4", "0:5"]])
    assert sorted((a["replayed"], a["already_replayed"]) for a in answers) == [(2, 2), (4, 0)]
    loser = next(a for a in answers if a["already_replayed"])
    assert loser["skipped"] == ["0:2", "0:3"]
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(6)))


def test_a_replay_that_died_after_its_claim_is_finished_by_a_later_one(
    op: ActionApi, stream_name: str, lb_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay dies after publishing half of its letters, before its done record: a replay of
    them soon after skips them as still at work; once the claim is stale, the next one finishes
    it (the rest go back, none twice). One that died after publishing all, the same."""
    from airflow_provider_liftbridge.client import UnavailableError
    from airflow_provider_liftbridge.ui import actions

    dlq = _letters(stream_name, lb_address, 8)
    url = f"{BASE}/dead-letters/{dlq}/replay"
    publish = actions._publish

    def dies_midway(client: Any, stream: str, producer: str, letters: Any) -> Any:
        publish(client, stream, producer, letters[:2])
        raise UnavailableError("the api-server died here")

    monkeypatch.setattr(actions, "_publish", dies_midway)
    op.post(url, {"letters": ["0:0", "0:1", "0:2", "0:3"]}, expect=502)
    monkeypatch.setattr(actions, "_publish", publish)
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(2)))

    young = op.post(url, {"letters": ["0:3", "0:4"]})  # the claim may still be at work: skipped
    assert (young["replayed"], young["skipped"], young["in_progress"]) == (1, ["0:3"], ["0:3"])
    monkeypatch.setattr(actions, "STALE_AFTER", 0.0)
    late = op.post(url, {"letters": ["0:2", "0:5"]})
    assert (late["replayed"], late["skipped"], late["finished_for_earlier"]) == (1, ["0:2"], 2)
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(6)))

    done = actions.ledger_append

    def dies_before_done(client: Any, ledger: Any, kind: str, producer: str, letters: Any = ()) -> int:
        if kind == "done":
            raise UnavailableError("the api-server died here")
        return done(client, ledger, kind, producer, letters)

    monkeypatch.setattr(actions, "ledger_append", dies_before_done)
    op.post(url, {"letters": ["0:6", "0:7"]}, expect=502)  # both published, no done record
    monkeypatch.setattr(actions, "ledger_append", done)
    finish = op.post(url, {"through": {"0": 7}})
    assert (finish["replayed"], finish["already_replayed"], finish["finished_for_earlier"]) == (0, 8, 0)
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(8)))


def test_a_paused_dead_letter_partition_is_refused_with_what_to_do(
    op: ActionApi, stream_name: str, lb_address: str
) -> None:
    """The dialog's plan and the replay answer 409 saying the dead-letter partition is paused and
    how to resume it (not "the view reads only"); nothing is replayed and the partition stays
    paused. Resumed as the answer says, the replay goes through."""
    dlq = _letters(stream_name, lb_address, 2)
    with LiftbridgeClient(lb_address) as client:
        client.pause_stream(dlq, [0])
    for path, body in [("replay-plan", {}), ("replay", {"letters": ["0:0"]})]:
        detail = op.post(f"{BASE}/dead-letters/{dlq}/{path}", body, expect=409)["detail"]
        assert f"dead-letter stream {dlq!r} partition 0 is paused" in detail, detail
        assert "nothing was replayed" in detail and "resume=True" in detail and "reads only" not in detail
    with LiftbridgeClient(lb_address) as client:
        assert client.fetch_metadata([dlq]).streams[dlq].partitions[0].paused
        assert _origins(stream_name, lb_address) == Counter()
        resumed = client.subscribe(dlq, partition=0, start_at=0, stop_at=0, resume=True)
        assert [m.offset for m in resumed] == [0]
    done = op.post(f"{BASE}/dead-letters/{dlq}/replay", {"letters": ["0:0", "0:1"]})
    assert done["replayed"] == 2
    assert _origins(stream_name, lb_address) == Counter(_ids(dlq, range(2)))


def _at_once(op: ActionApi, url: str, selections: list[list[str]]) -> list[dict[str, Any]]:
    """Each selection replayed from a thread of its own, all at once (clicks in two browsers): the answers."""
    answers: list[dict[str, Any]] = []
    clicks = [threading.Thread(target=lambda s=s: answers.append(op.post(url, {"letters": s}))) for s in selections]
    for c in clicks:
        c.start()
    for c in clicks:
        c.join()
    assert len(answers) == len(selections)  # every request answered
    return answers
