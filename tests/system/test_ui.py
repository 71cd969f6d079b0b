"""The Airflow UI of the system tier's deployment in headless Chromium (Debian's ``chromium``,
driven by Playwright for Python; Playwright cannot download its own browser here): log in with
the login ``scripts/demo.py --ui`` prints, then the connections page lists the ``liftbridge``
connection and a DAG's grid page shows the DAG and its tasks. Screenshots are written to the
deployment's log folder."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from scripts.deployment import PASSWORD, USERNAME, Deployment

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail(
            "Debian's chromium is not installed: run scripts/setup.sh --browser (or sudo apt-get install chromium)"
        )
    return path


#: The tier's one headless chromium (Playwright and the browser), started by the first
#: :func:`logged_in_page` and stopped by :func:`close_browser` once ``tests/system`` is done: a
#: start of both took seconds, and the UI modules asked for about 25 of them.
_BROWSER: dict[str, Any] = {}


def shared_browser() -> Any:
    """The tier's headless chromium (started now if it is not running)."""
    browser = _BROWSER.get("browser")
    if browser is None or not browser.is_connected():
        from playwright.sync_api import sync_playwright

        close_browser()
        _BROWSER["playwright"] = sync_playwright().start()
        _BROWSER["browser"] = _BROWSER["playwright"].chromium.launch(
            executable_path=chromium_path(), args=["--no-sandbox"], headless=True
        )
    return _BROWSER["browser"]


def close_browser() -> None:
    """Stop the tier's chromium and Playwright, if started."""
    browser, playwright = _BROWSER.pop("browser", None), _BROWSER.pop("playwright", None)
    try:
        if browser is not None and browser.is_connected():
            browser.close()
    finally:
        if playwright is not None:
            playwright.stop()


@contextmanager
def logged_in_page(url: str, user: str = USERNAME, password: str = PASSWORD) -> Iterator[Any]:
    """A page of the tier's headless chromium in a browser context of its own (its own cookies and
    storage, as a fresh browser's), logged in (as ``user``, the admin by default) through the
    simple auth manager's login form at ``url`` as a user would; every context opened in the block
    is closed afterwards."""
    browser = shared_browser()
    before = set(browser.contexts)
    try:
        yield log_in(browser, url, user, password)
    finally:
        for context in [c for c in browser.contexts if c not in before]:
            context.close()


def assert_refused_without_a_session(url: str) -> None:
    """``url`` answers 401 without a session or token, and 403 to a forged Bearer token."""
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=60)
    assert refused.value.code == 401
    forged = urllib.request.Request(url, headers={"Authorization": "Bearer not-a-jwt"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=60)
    assert refused.value.code == 403


def log_in(browser: Any, url: str, user: str = USERNAME, password: str = PASSWORD) -> Any:
    """A new page of ``browser`` (a context of its own: its own cookies), logged in at ``url``
    through the simple auth manager's login form."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.set_default_timeout(60_000)
    expect.set_options(timeout=60_000)  # a busy machine: wait for conditions, longer than 5 s
    page.goto(f"{url}/auth/login")
    page.locator("input").nth(0).fill(user)
    page.locator("input[type=password]").fill(password)
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda at: "/auth/login" not in at)
    return page


@pytest.fixture(scope="module")
def page(deployment: Deployment) -> Iterator[Any]:
    """A logged-in browser page."""
    with logged_in_page(deployment.url) as logged_in:
        yield logged_in


def test_connections_page_lists_the_liftbridge_connection(deployment: Deployment, page: Any) -> None:
    page.goto(f"{deployment.url}/connections")
    try:
        page.get_by_text("liftbridge_default").first.wait_for()
        page.get_by_text("liftbridge", exact=True).first.wait_for()  # its type
        page.get_by_text(deployment.devserver.address).first.wait_for()  # its host
    finally:
        page.screenshot(path=str(deployment.log_dir / "ui-connections.png"), full_page=True)


def test_grid_page_of_an_example_dag_renders(deployment: Deployment, page: Any) -> None:
    """The DAG page opens on its grid (runs as columns, tasks as rows)."""
    shot = deployment.log_dir / "ui-grid.png"
    page.goto(f"{deployment.url}/dags/liftbridge_stream_lifecycle")
    try:
        page.get_by_text("liftbridge_stream_lifecycle").first.wait_for()
        for task_id in ("create_stream", "wait_for_offset", "find_ready_order"):
            page.get_by_text(task_id).first.wait_for()
    finally:
        page.screenshot(path=str(shot), full_page=True)
