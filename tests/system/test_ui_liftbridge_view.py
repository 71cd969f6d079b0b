"""The Liftbridge view (docs/ui.md) in the system tier's deployment, in headless Chromium, as a
person uses it: after the stream-archive example's scheduled run, its ``clean_orders`` pipeline
shows lag 0, then N after N more orders are published; the dead-letter page shows the order the
example could not parse; the browser shows a cleaned order's JSON. A request without a session
is refused. Screenshots are written to the deployment's log folder (kept when a test fails).

The DAG is paused once its first run is done, so no later hourly run moves the cursor while the
test looks.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import Deployment, wait_until
from tests.system.test_ui import logged_in_page

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]
DAG_ID = "liftbridge_stream_archive"
PIPELINE = f'h2[data-pipeline="{DAG_ID}.clean_orders"]'
MORE = 5


@pytest.fixture(scope="module")
def finished_run(deployment: Deployment) -> str:
    """The example's first scheduled run, finished successfully; the DAG paused after it."""

    def first_run() -> str | None:
        runs = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns?order_by=run_after")["dag_runs"]
        return str(runs[0]["dag_run_id"]) if runs else None

    run_id = wait_until(f"a scheduled run of {DAG_ID}", first_run, timeout=120, interval=1)
    state = deployment.wait_for_run(DAG_ID, run_id, timeout=600)
    assert state == "success", f"{deployment.task_states(DAG_ID, run_id)} (logs: {deployment.log_dir})"
    deployment.api("PATCH", f"/dags/{DAG_ID}", {"is_paused": True})
    return run_id


@pytest.fixture(scope="module")
def view(deployment: Deployment, finished_run: str) -> Iterator[Any]:
    """A logged-in page (the simple auth manager's login form) of a fresh browser."""
    with logged_in_page(deployment.url) as page:
        yield page


def test_pipeline_shows_lag_zero_then_n_after_n_more(deployment: Deployment, view: Any) -> None:
    from playwright.sync_api import expect

    try:
        view.goto(f"{deployment.url}/liftbridge/?tab=pipelines")
        heading = view.locator(PIPELINE)
        expect(heading.locator("[data-lag]")).to_have_text("0")
        expect(heading).to_contain_text("shop-orders, cursor shop-orders-clean")
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-pipelines.png"), full_page=True)

        with LiftbridgeClient(deployment.devserver.address) as client:
            client.publish_many("shop-orders", [json.dumps({"order_id": f"late-{i}"}).encode() for i in range(MORE)])
        view.locator("#refresh").click()
        expect(heading.locator("[data-lag]")).to_have_text(str(MORE))
        table = view.locator(f'table[data-pipeline-table="{DAG_ID}.clean_orders"]')
        expect(table.locator('tr[data-partition="0"] td[data-lag]')).to_have_text(str(MORE))
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-lag.png"), full_page=True)


def test_dead_letter_page_shows_the_unparsable_order(deployment: Deployment, view: Any) -> None:
    from playwright.sync_api import expect

    try:
        view.goto(f"{deployment.url}/liftbridge/?tab=dead-letters")
        expect(view.locator('h2[data-dead-letter-stream="shop-orders-dead-letters"]')).to_be_visible()
        letter = view.locator("tr.letter").first
        expect(letter).to_contain_text("NotJsonError")
        expect(letter).to_contain_text("shop-orders/")
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-dead-letters.png"), full_page=True)


def test_browser_shows_a_messages_json(deployment: Deployment, view: Any) -> None:
    from playwright.sync_api import expect

    try:
        view.goto(f"{deployment.url}/liftbridge/?tab=browse&stream=shop-orders-clean")
        value = view.locator('#messages tr.message pre[data-format="json"]').first
        expect(value).to_contain_text('"amount_with_vat"')
        expect(view.locator("#messages tr.message")).to_have_count(20)
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-browse.png"), full_page=True)


def test_the_view_in_airflows_navigation(deployment: Deployment, view: Any) -> None:
    """Airflow lists the external view and shows the page in its own frame."""
    from playwright.sync_api import expect

    try:
        view.goto(f"{deployment.url}/plugin/liftbridge")
        frame = view.frame_locator("iframe")
        expect(frame.locator("#streams, " + PIPELINE).first).to_be_visible()
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-in-airflow.png"), full_page=True)


def test_requests_without_a_session_are_refused(deployment: Deployment, view: Any) -> None:
    url = f"{deployment.url}/liftbridge/api/connections/liftbridge_default/pipelines"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=60)
    assert refused.value.code == 401
    with_session = view.request.get(url)  # the browser's session cookie
    assert with_session.status == 200
    assert DAG_ID in with_session.text()
