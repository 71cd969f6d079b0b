"""Links that last (docs/ui.md, The address): in headless Chromium, inside Airflow's frame, the
address bar keeps the view's tab, connection, stream, filter, the browser's search, its page and
the open message; a reload opens the same view, and so does the link opened in another tab.
Behind a path prefix: ``test_ui_base_url.py`` runs :func:`check_the_address_lasts` there."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from scripts.deployment import Deployment
from tests.system.test_ui import logged_in_page
from tests.system.test_ui_liftbridge_view import open_from_browse_menu

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]
STREAM = "shop-orders-clean"
#: What the test sets in the view, as the address keeps it.
WANTED = {
    "conn": "liftbridge_default",
    "tab": "browse",
    "stream": STREAM,
    "n": "2",
    "path": "$.order_id",
    "scan": "backward",
    "filter": "shop",
}


def expect_the_view(frame: Any, offsets: list[str]) -> None:
    """The frame shows the Browse tab with the stream's page of 2 messages having an order id
    (``offsets``: theirs, as ``partition:offset``), the message view of the first, and the filter."""
    from playwright.sync_api import expect

    expect(frame.locator('nav button[data-tab="browse"]')).to_have_class(re.compile(r"\bactive\b"))
    expect(frame.locator("#b-stream")).to_have_value(STREAM)
    expect(frame.locator("#b-last")).to_have_value("2")
    expect(frame.locator("#b-path")).to_have_value("$.order_id")
    expect(frame.locator("#filter")).to_have_value("shop")
    expect(frame.locator("#conn")).to_have_value("liftbridge_default")
    expect(frame.locator("#messages tr.message")).to_have_count(2)
    expect(frame.locator("#b-summary")).to_contain_text(STREAM)
    assert _shown(frame) == offsets
    expect(frame.locator("#b-view h2")).to_contain_text(f"{STREAM} / {offsets[0].replace(':', ' @ ')}")
    expect(frame.locator("#b-view-value")).to_contain_text('"order_id"')


def _shown(frame: Any) -> list[str]:
    rows = frame.locator("#messages tr.message")
    return [f"{r.get_attribute('data-partition')}:{r.get_attribute('data-offset')}" for r in rows.all()]


def check_the_address_lasts(page: Any, base: str, shots: Any) -> None:
    """Browse → Liftbridge at ``base``, search :data:`STREAM` by a JSON path, 2 a page, page to
    the older ones and open the first, with a filter: the address of Airflow's page says so
    (``<base>/plugin/liftbridge/<frame path>?…``), a reload and the link opened in a new tab show
    the same page and message again, and so does the short form ``<base>/plugin/liftbridge?…``."""
    from playwright.sync_api import expect

    frame = open_from_browse_menu(page, base)
    frame.locator('nav button[data-tab="browse"]').click()
    frame.locator("#b-stream").fill(STREAM)
    frame.locator("#b-last").fill("2")
    frame.locator("#b-path").fill("$.order_id")
    frame.locator("#filter").fill("shop")
    frame.locator("#b-go").click()
    expect(frame.locator("#messages tr.message")).to_have_count(2)
    first_page = _shown(frame)
    frame.locator("#b-older").click()  # replaces the results at once: the status below is the new search's
    expect(frame.locator("#b-status[data-reason]")).to_be_visible()
    offsets = _shown(frame)
    assert len(offsets) == 2 and not set(offsets) & set(first_page), (first_page, offsets)
    frame.locator("#messages tr.message .b-open").first.click()
    expect_the_view(frame, offsets)

    def kept(url: str) -> bool:
        query = {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}
        return all(query.get(k) == v for k, v in WANTED.items()) and "at" in query and "msg" in query

    page.wait_for_url(kept)
    link = page.url
    root = urlsplit(base).path
    assert urlsplit(link).path == f"{root}/plugin/liftbridge{root}/liftbridge/", link
    page.reload()
    expect_the_view(page.frame_locator("iframe"), offsets)
    shots(page, "reloaded")

    # Another browser context (no state of the first page) with the login's cookies: a colleague's tab.
    shared = page.context.browser.new_page(
        storage_state=page.context.storage_state(), viewport={"width": 1400, "height": 900}
    )
    shared.set_default_timeout(60_000)
    try:
        shared.goto(link)
        expect_the_view(shared.frame_locator("iframe"), offsets)
        shared.goto(f"{base}/plugin/liftbridge?{urlsplit(link).query}")
        expect_the_view(shared.frame_locator("iframe"), offsets)
        shared.wait_for_url(kept)  # and the address still says so
        shots(shared, "shared")
    finally:
        shared.context.close()


def test_a_reload_and_a_shared_link_open_the_same_view(deployment: Deployment, archive_runs: list[str]) -> None:
    with logged_in_page(deployment.url) as page:

        def shots(p: Any, name: str) -> None:
            p.screenshot(path=str(deployment.log_dir / f"ui-liftbridge-address-{name}.png"), full_page=True)

        try:
            check_the_address_lasts(page, deployment.url, shots)
        finally:
            shots(page, "last")
