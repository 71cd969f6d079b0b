"""The view's actions (docs/ui.md, "Actions") in the system tier's deployment, in headless Chromium,
light and dark, inside Airflow's frame and behind a path prefix: a dead letter's source opens its
message in the browser; a replay of a selected letter and of all of them, confirmed in the dialog,
puts the letters back into their source stream; a cursor moved in its dialog (a bad offset refused
there with words) is where the next scheduled run of the pipeline reads from; both are in Airflow's
audit log. A read-only user (the viewer role) sees no action and is refused by every action route.
DAG: ``tests/system/dags/system_ui_actions.py``. Screenshots go to the deployment's log folder, and
to ``docs/`` with ``LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS=1``.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, StreamExistsError
from airflow_provider_liftbridge.ui.actions import REPLAYED_FROM_HEADER
from scripts.deployment import VIEWER, VIEWER_PASSWORD, Deployment
from tests.system.contrast import low_contrast
from tests.system.scheduled_reads import xcom
from tests.system.test_ui import logged_in_page
from tests.system.test_ui_liftbridge_view import open_from_browse_menu, shoot

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]
DAG_ID, TASK_ID, STREAM = "system_ui_actions", "consume", "system-ui-actions"
DLQ = f"{STREAM}-dlq"
CONN = "/liftbridge/api/connections/liftbridge_default"


def run_pipeline(deployment: Deployment) -> dict[str, Any]:
    """One run of the DAG, to success; its task's result (``processed``, ``dead_lettered``...)."""
    run_id = deployment.trigger_dag(DAG_ID)
    assert deployment.wait_for_run(DAG_ID, run_id) == "success"
    return dict(xcom(deployment, DAG_ID, run_id, TASK_ID))


def high_watermarks(deployment: Deployment, stream: str) -> dict[int, int]:
    with LiftbridgeClient(deployment.devserver.address) as client:
        info = client.fetch_metadata([stream]).streams[stream]
        return {p: part.high_watermark for p, part in info.partitions.items()}


def replayed(deployment: Deployment) -> list[str]:
    """``dead-letter-replayed-from`` of every message of the source stream that a replay put back."""
    found = []
    with LiftbridgeClient(deployment.devserver.address) as client:
        for p, hw in high_watermarks(deployment, STREAM).items():
            for m in client.subscribe(STREAM, partition=p, start_at=0, stop_at=hw):
                if REPLAYED_FROM_HEADER in m.headers:
                    found.append(m.headers[REPLAYED_FROM_HEADER].decode())
    return found


@pytest.fixture(scope="module")
def letters(deployment: Deployment) -> None:
    """The stream (2 partitions, 3 values on partition 0 that are not JSON) read once: 3 dead letters."""
    with LiftbridgeClient(deployment.devserver.address) as client:
        try:
            client.create_stream(STREAM, STREAM, partitions=2)
        except StreamExistsError:
            pytest.fail(f"stream {STREAM!r} exists: this module expects a fresh deployment")
        client.publish_many(STREAM, [b'{"n": 0}', b"bad 1", b'{"n": 2}', b"bad 3", b"bad 4"], partition=0)
        client.publish_many(STREAM, [b'{"n": 10}', b'{"n": 11}'], partition=1)
    assert run_pipeline(deployment)["dead_lettered"] == 3


def audit(deployment: Deployment, event: str) -> list[dict[str, Any]]:
    """Airflow's audit log entries of ``event``, newest first (the REST API the UI's Audit Log reads)."""
    return list(deployment.api("GET", f"/eventLogs?event={event}&order_by=-id&limit=50")["event_logs"])


def letters_of(frame: Any) -> Any:
    """The table of this module's dead-letter stream (the example's may be listed before it)."""
    return frame.locator(f'h2[data-dead-letter-stream="{DLQ}"] ~ table').first


def replay_newest_letter(frame: Any, deployment: Deployment, shots: Any) -> str:
    """On the dead-letters tab: select the newest letter, Replay selected, confirm; its id. The
    dialog says it was skipped when an earlier replay (another test, the other colour mode) put it
    back already."""
    from playwright.sync_api import expect

    section = frame.locator(f'h2[data-dead-letter-stream="{DLQ}"]')
    expect(section).to_be_visible()
    first = letters_of(frame).locator("tr.letter input[data-letter]").first
    letter = str(first.get_attribute("data-letter"))
    done_before = f"{DLQ}/{letter.replace(':', '/')}" in replayed(deployment)
    first.check()
    button = frame.locator(f'[data-replay-selected="{DLQ}"]')
    expect(button).to_have_text("Replay selected (1)")
    button.click()
    dialog = frame.locator("#action-dialog")
    expect(dialog.locator("#replay-targets")).to_have_text(f"1 to {STREAM}")
    assert low_contrast(frame, "#action-dialog") == []  # the dialog over the page, every text in it
    shots("replay")
    dialog.locator("#action-confirm").click()
    expect(dialog.locator("#action-result")).to_have_text(
        f"Put back 0 letter(s); skipped 1 that were already replayed ({letter})."
        if done_before
        else "Put back 1 letter(s)."
    )
    dialog.locator("#action-cancel").click()
    expect(dialog).to_be_hidden()
    return letter


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_replay_and_move_a_cursor_in_their_dialogs(deployment: Deployment, letters: None, mode: str) -> None:
    from playwright.sync_api import expect

    with logged_in_page(deployment.url) as page:
        page.emulate_media(color_scheme=mode)
        page.set_viewport_size({"width": 1400, "height": 900})

        def shots(name: str) -> None:
            shoot(page, deployment.log_dir, f"ui-liftbridge-{name}-{mode}.png")

        page.goto(f"{deployment.url}/plugin/liftbridge/liftbridge/?tab=dead-letters&filter={STREAM}")
        frame = page.frame_locator("iframe")
        expect(frame.locator("html")).to_have_attribute("data-theme", mode)
        before = Counter(replayed(deployment))
        letter = replay_newest_letter(frame, deployment, shots)
        assert set(replayed(deployment)) - set(before) <= {f"{DLQ}/{letter.replace(':', '/')}"}

        # Replay all, twice: the letter replayed above is skipped, then every letter.
        count = sum(hw + 1 for hw in high_watermarks(deployment, DLQ).values())
        already = len({r for r in replayed(deployment) if r.startswith(f"{DLQ}/")})
        dialog = frame.locator("#action-dialog")
        for again in (False, True):
            frame.locator(f'[data-replay-all="{DLQ}"]').click()
            expect(dialog.locator("#action-title")).to_have_text(f"Replay {count} letter(s) from {DLQ}")
            skipped = count if again else already
            if skipped:
                expect(dialog.locator("#replay-skipped")).to_contain_text(f"{skipped} of them were already replayed (")
            dialog.locator("#action-confirm").click()
            expect(dialog.locator("#action-result")).to_contain_text(
                f"Put back {count - skipped} letter(s)"
                + (f"; skipped {skipped} that were already replayed (" if skipped else ".")
            )
            dialog.locator("#action-cancel").click()
        # Each letter of the dead-letter stream is in the source stream once.
        origins = Counter(replayed(deployment))
        assert set(origins.values()) == {1}
        assert {f"{DLQ}/{p}/{o}" for p, hw in high_watermarks(deployment, DLQ).items() for o in range(hw + 1)} <= set(
            origins
        )

        # Move the cursor: a bad offset is refused in the dialog, then 0 (read everything again).
        frame.locator("nav button[data-tab=pipelines]").click()
        frame.locator(f'[data-move-cursor="{DAG_ID}.{TASK_ID}"]').click()
        expect(dialog.locator("#action-title")).to_have_text(f"Move the cursor of {DAG_ID}.{TASK_ID}")
        dialog.locator("#move-offset").fill("ten")
        dialog.locator("#action-confirm").click()
        expect(dialog.locator("#action-error")).to_contain_text("offset must be a whole number, 0 or more")
        expect(dialog.locator("#move-offset")).to_have_attribute("aria-invalid", "true")
        assert low_contrast(frame, "#action-dialog") == []  # the refusal's words too
        dialog.locator("#move-offset").fill("0")
        shots("move-cursor")
        dialog.locator("#action-confirm").click()
        expect(dialog.locator("#action-result")).to_contain_text(
            "partition 0 now reads from 0, partition 1 now reads from 0"
        )
        dialog.locator("#action-cancel").click()

    total = sum(hw + 1 for hw in high_watermarks(deployment, STREAM).values())
    assert run_pipeline(deployment)["processed"] == total  # the next run read from offset 0
    moves = audit(deployment, "liftbridge_move_cursor")
    assert (moves[0]["owner"], moves[0]["dag_id"], moves[0]["task_id"]) == ("admin", DAG_ID, TASK_ID)
    assert [m["to"] for m in json.loads(moves[0]["extra"])["moved"]] == [0, 0]
    assert (
        json.loads(moves[1]["extra"])["offset"] == "ten" and "whole number" in json.loads(moves[1]["extra"])["refused"]
    )
    replays = [json.loads(r["extra"]) for r in audit(deployment, "liftbridge_replay_dead_letters")[:3]]
    assert [(r["replayed"], r["already_replayed"]) for r in replays[:2]] == [(0, count), (count - already, already)]
    assert replays[0]["stream"] == DLQ and replays[2]["selection"] == "1 selected"


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_under_the_prefix_a_source_opens_its_message_and_a_replay_works(
    deployment: Deployment, letters: None, prefixed: str, mode: str
) -> None:
    """Behind the prefix (the proxy refuses anything outside it; the fixture checks it refused nothing)."""
    from playwright.sync_api import expect

    with logged_in_page(prefixed) as page:
        page.emulate_media(color_scheme=mode)

        def shots(name: str) -> None:
            page.screenshot(path=str(deployment.log_dir / f"ui-liftbridge-prefixed-{name}-{mode}.png"), full_page=True)

        try:
            frame = open_from_browse_menu(page, prefixed)
            expect(frame.locator("html")).to_have_attribute("data-theme", mode)
            frame.locator("nav button[data-tab=dead-letters]").click()
            replay_newest_letter(frame, deployment, shots)
            source = letters_of(frame).locator("a[data-source-link]").first
            partition, offset = str(source.get_attribute("data-source-link")).split(":")
            source.click()
            view = frame.locator("#b-view")
            expect(view.locator("h2")).to_contain_text(f"{STREAM} / {partition} @ {offset}")
            page.wait_for_url(re.compile(r".*/airflow/plugin/liftbridge/airflow/liftbridge/\?.*tab=browse.*"))
        finally:
            shots("last")


def test_a_viewer_sees_no_action_and_every_action_route_refuses_them(deployment: Deployment, letters: None) -> None:
    from playwright.sync_api import expect

    with logged_in_page(deployment.url, VIEWER, VIEWER_PASSWORD) as page:
        for tab in ("dead-letters", "pipelines"):
            page.goto(f"{deployment.url}/liftbridge/?conn=liftbridge_default&tab={tab}")
            expect(page.locator("#error")).to_contain_text("403")
            expect(
                page.locator("[data-replay-all], [data-replay-selected], [data-move-cursor], #action-dialog")
            ).to_have_count(0)
        assert page.request.get(f"{deployment.url}{CONN}/actions").status == 403
        for path, body in [
            (f"/dead-letters/{DLQ}/replay-plan", {}),
            (f"/dead-letters/{DLQ}/replay", {"through": {"0": 0}}),
            (f"/pipelines/{DAG_ID}/{TASK_ID}/cursor", {"offset": "0"}),
        ]:
            answer = page.request.post(f"{deployment.url}{CONN}{path}", data=body)
            assert answer.status == 403, (path, answer.text())
            assert "password" not in answer.text().lower()
    # The admin's page has them (the same page, the same data: only the permission differs).
    with logged_in_page(deployment.url) as page:
        page.goto(f"{deployment.url}/liftbridge/?tab=dead-letters&filter={STREAM}")
        expect(page.locator(f'[data-replay-all="{DLQ}"]')).to_be_visible()


def test_a_paused_dead_letter_partition_refuses_a_replay_saying_what_to_do(
    deployment: Deployment, letters: None
) -> None:
    """The dialog of Replay all on a paused dead-letter partition says it is paused, that nothing
    was replayed and how to resume it (not "the view reads only"); nothing goes back."""
    from playwright.sync_api import expect

    before = Counter(replayed(deployment))
    with LiftbridgeClient(deployment.devserver.address) as client:
        client.pause_stream(DLQ, [0])
    try:
        with logged_in_page(deployment.url) as page:
            page.goto(f"{deployment.url}/plugin/liftbridge/liftbridge/?tab=dead-letters&filter={STREAM}")
            frame = page.frame_locator("iframe")
            frame.locator(f'[data-replay-all="{DLQ}"]').click()
            error = frame.locator("#action-dialog p.error").first
            expect(error).to_contain_text(f"409: dead-letter stream '{DLQ}' partition 0 is paused")
            expect(error).to_contain_text("nothing was replayed")
            expect(error).to_contain_text("resume=True")
            expect(error).not_to_contain_text("reads only")
            page.screenshot(path=str(deployment.log_dir / "ui-liftbridge-replay-paused.png"), full_page=True)
        assert Counter(replayed(deployment)) == before
    finally:
        with LiftbridgeClient(deployment.devserver.address) as client:
            resumed = client.subscribe(DLQ, partition=0, start_at=0, stop_at=0, resume=True)
            assert [m.offset for m in resumed] == [0]
