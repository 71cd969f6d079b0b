"""The Liftbridge view (docs/ui.md) in the system tier's deployment, in headless Chromium, as a
person uses it, with Airflow's default configuration (the plugin loads from its entry point):
Browse → Liftbridge opens it inside Airflow; after the runs of the stream-archive example (two,
three when an hour turns meanwhile: the ``archive_runs`` fixture) its ``clean_orders`` pipeline
shows lag 0, then N after N more orders are published; the charts show those runs; the
dead-letter page shows the order the example could not parse; the browser shows a cleaned order's
JSON; the task instance's "Liftbridge pipeline" link opens the pipeline.
Requests without a session, or with a forged token, are refused. Screenshots (light and dark) are
written to the deployment's log folder (kept when a test fails), and to ``docs/`` with
``LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS=1``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import REPO, Deployment
from tests.system.conftest import ARCHIVE_DAG
from tests.system.contrast import low_contrast, luminance
from tests.system.test_ui import assert_refused_without_a_session, logged_in_page

pytestmark = [pytest.mark.system, pytest.mark.timeout(1200)]
DAG_ID = ARCHIVE_DAG
PIPELINE = f'h2[data-pipeline="{DAG_ID}.clean_orders"]'
MORE = 5


def shoot(page: Any, folder: Path, name: str) -> None:
    """A full-page screenshot ``name`` in ``folder``, and in ``docs/`` when asked to refresh them."""
    path = folder / name
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS") == "1":
        shutil.copyfile(path, REPO / "docs" / name)


def open_from_browse_menu(page: Any, base: str) -> Any:
    """Open Airflow's home at ``base``, then Browse → Liftbridge; return the view's frame."""
    page.goto(f"{base}/")
    page.get_by_role("button", name="Browse").click()
    page.get_by_role("menuitem", name="Liftbridge").click()
    page.wait_for_url(lambda at: "/plugin/liftbridge" in at)
    return page.frame_locator("iframe")


@pytest.fixture(scope="module")
def view(deployment: Deployment, archive_runs: list[str]) -> Iterator[Any]:
    """A logged-in page (the simple auth manager's login form) of a fresh browser, light mode."""
    with logged_in_page(deployment.url) as page:
        yield page


def test_browse_menu_opens_the_view_with_its_data(deployment: Deployment, view: Any) -> None:
    """With Airflow's defaults: the Browse menu has the entry, and the page in Airflow's frame
    shows the example's pipeline (fails where the plugin is not loaded: no menu entry)."""
    from playwright.sync_api import expect

    try:
        frame = open_from_browse_menu(view, deployment.url)
        expect(frame.locator(PIPELINE)).to_contain_text("shop-orders, cursor shop-orders-clean")
        expect(frame.locator(f"{PIPELINE} [data-lag]")).to_have_text("0")
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-in-airflow.png"), full_page=True)


def test_pipeline_shows_lag_zero_then_n_after_n_more(deployment: Deployment, view: Any) -> None:
    from playwright.sync_api import expect

    try:
        view.goto(f"{deployment.url}/liftbridge/?tab=pipelines")
        heading = view.locator(PIPELINE)
        expect(heading.locator("[data-lag]")).to_have_text("0")
        expect(heading).to_contain_text("shop-orders, cursor shop-orders-clean")
        with LiftbridgeClient(deployment.devserver.address) as client:
            client.publish_many("shop-orders", [json.dumps({"order_id": f"late-{i}"}).encode() for i in range(MORE)])
        view.locator("#refresh").click()
        expect(heading.locator("[data-lag]")).to_have_text(str(MORE))
        table = view.locator(f'table[data-pipeline-table="{DAG_ID}.clean_orders"]')
        expect(table.locator('tr[data-partition="0"] td[data-lag]')).to_have_text(str(MORE))
        # Lag as time: the oldest unread message's age beside the count; the last commit as
        # "… ago" with its ISO time in the tooltip.
        expect(heading).to_contain_text("oldest unread")
        expect(heading.locator("[data-lag-age]")).to_have_attribute("data-lag-age", re.compile(r"^\d+(\.\d+)?$"))
        committed = table.locator('tr[data-partition="0"] td[data-last-commit]')
        expect(committed.locator("span")).to_have_text(re.compile(r"( ago|just now)$"))
        expect(committed.locator("span")).to_have_attribute("title", committed.get_attribute("data-last-commit") or "?")
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-lag.png"), full_page=True)


def test_charts_show_every_run(deployment: Deployment, view: Any, archive_runs: list[str]) -> None:
    """Per pipeline: lag and messages read per run over every run (drawn, as canvases); per
    stream, the message rate."""
    from playwright.sync_api import expect

    try:
        view.goto(f"{deployment.url}/liftbridge/?tab=charts")
        heading = view.locator(f'h2[data-chart-pipeline="{DAG_ID}.clean_orders"]')
        expect(heading).to_have_attribute("data-runs", str(len(archive_runs)))
        section = heading.locator("xpath=following-sibling::div[1]")
        expect(section.locator('[data-chart="lag"] canvas')).to_have_count(1)
        expect(section.locator('[data-chart="processed"] canvas')).to_have_count(1)
        expect(view.locator('[data-chart="rate"][data-stream="shop-orders"] canvas')).to_have_count(1)
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-charts.png"), full_page=True)


def test_filter_and_pausable_refresh(deployment: Deployment, view: Any) -> None:
    """The filter keeps the matching pipelines; the page refreshes itself until paused."""
    from playwright.sync_api import expect

    view.goto(f"{deployment.url}/liftbridge/?tab=pipelines")
    expect(view.locator(PIPELINE)).to_be_visible()
    view.locator("#filter").fill("archive_orders")
    expect(view.locator(PIPELINE)).to_have_count(0)
    expect(view.locator(f'h2[data-pipeline="{DAG_ID}.archive_orders"]')).to_be_visible()
    view.locator("#filter").fill("")
    view.locator("#interval").select_option("10")
    count = int(view.locator("#updated").get_attribute("data-count") or "0")
    view.wait_for_function(f"Number(document.getElementById('updated').dataset.count) > {count}", timeout=60_000)
    view.locator("#pause").click()
    expect(view.locator("#pause")).to_have_attribute("aria-pressed", "true")
    assert view.evaluate("window.liftbridgeView.timer") is None
    view.locator("#pause").click()
    expect(view.locator("#pause")).to_have_attribute("aria-pressed", "false")
    assert view.evaluate("window.liftbridgeView.timer") is not None


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


def test_the_task_instances_extra_link_opens_the_pipeline(
    deployment: Deployment, view: Any, archive_runs: list[str]
) -> None:
    """The "Liftbridge pipeline" button of ``clean_orders``'s task instance opens the view, in
    Airflow's frame, at that pipeline."""
    from playwright.sync_api import expect

    run_id = archive_runs[-1]
    links = deployment.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/clean_orders/links")
    assert set(links["extra_links"]) == {"Liftbridge pipeline", "Liftbridge stream"}, links
    view.goto(f"{deployment.url}/dags/{DAG_ID}/runs/{run_id}/tasks/clean_orders/details")
    try:
        view.get_by_role("link", name="Liftbridge pipeline").click()  # same origin: opens in the window
        view.wait_for_url(lambda at: "/plugin/liftbridge" in at)
        focused = view.frame_locator("iframe").locator(f"{PIPELINE}.focused")
        expect(focused).to_be_visible()
        expect(focused).to_contain_text("shop-orders")
    finally:
        view.screenshot(path=str(deployment.log_dir / "ui-liftbridge-extra-link.png"), full_page=True)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_screenshots_follow_airflows_colour_mode(
    deployment: Deployment, view: Any, archive_runs: list[str], mode: str
) -> None:
    """In Airflow's frame, the page takes the UI's colour mode (here the system's, Airflow's
    default): in dark mode its background is dark and its links light. Screenshots of the
    pipelines and of the charts, for docs/ui.md."""
    from playwright.sync_api import expect

    page = view
    page.emulate_media(color_scheme=mode)
    page.set_viewport_size({"width": 1400, "height": 1150})  # the charts of two pipelines and two streams
    try:
        page.goto(f"{deployment.url}/plugin/liftbridge/liftbridge/?tab=pipelines")
        frame = page.frame_locator("iframe")
        expect(frame.locator("html")).to_have_attribute("data-theme", mode)
        expect(frame.locator(PIPELINE)).to_be_visible()
        link = frame.locator(f"{PIPELINE} a").first
        colour = link.evaluate("a => getComputedStyle(a).color")
        background = frame.locator("body").evaluate("b => getComputedStyle(b).backgroundColor")
        if mode == "dark":
            assert luminance(colour) > 0.4 > luminance(background), (colour, background)
        else:
            assert luminance(background) > 0.8, background
        assert low_contrast(frame) == []
        shoot(page, deployment.log_dir, f"ui-liftbridge-pipelines-{mode}.png")
        frame.locator('nav button[data-tab="charts"]').click()
        expect(frame.locator(f'h2[data-chart-pipeline="{DAG_ID}.clean_orders"]')).to_have_attribute(
            "data-runs", str(len(archive_runs))
        )
        expect(frame.locator('[data-chart="lag"] canvas').first).to_be_visible()
        assert low_contrast(frame) == []
        shoot(page, deployment.log_dir, f"ui-liftbridge-charts-{mode}.png")
    finally:
        page.emulate_media(color_scheme="light")
        page.set_viewport_size({"width": 1400, "height": 900})


def test_requests_without_a_session_are_refused(deployment: Deployment, view: Any) -> None:
    """No session: 401; a forged token: 403; with the browser's session cookie: the data."""
    for path in ("pipelines", "history", "cluster"):
        url = f"{deployment.url}/liftbridge/api/connections/liftbridge_default/{path}"
        assert_refused_without_a_session(url)
        with_session = view.request.get(url)  # the browser's session cookie
        assert with_session.status == 200
        if path != "cluster":
            assert DAG_ID in with_session.text()
