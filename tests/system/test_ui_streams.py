"""The Streams tab, the Pipelines tab's verdicts, the charts' links to their runs and the contrast
of every tab (docs/ui.md, "Streams", "Contrast"; issue 58 items 4 and 7) in the system tier's
deployment, in headless Chromium inside Airflow's frame and behind a path prefix, light and dark:
120 streams of their own are sorted by a heading and paged by the server, the sort and page last
in the address, and every stream has a message rate (inside Airflow: one no task reads put first
by it after a publish); a chart's point names its run and its link opens that run in Airflow
(inside and behind the prefix, light); every visible text of every tab is at least 4.5:1
(``tests/system/contrast.py``). Screenshots of the Streams tab go to the deployment's log folder
(and to ``docs/`` with ``LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS=1``)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from scripts.deployment import Deployment
from tests.system.conftest import ARCHIVE_DAG
from tests.system.contrast import low_contrast
from tests.system.test_ui import assert_refused_without_a_session, log_in, logged_in_page
from tests.system.test_ui_liftbridge_view import shoot

pytestmark = [pytest.mark.system, pytest.mark.timeout(1200)]
COUNT = 120
PIPELINE = f'h2[data-pipeline="{ARCHIVE_DAG}.clean_orders"]'
TABS = ["cluster", "streams", "pipelines", "charts", "lag", "groups", "dead-letters", "browse"]


@pytest.fixture(scope="module")
def many(deployment: Deployment) -> str:
    """:data:`COUNT` streams ``<prefix>-NNN``; stream ``i`` has ``i % 10`` messages, and every
    tenth has 2 partitions. Returns the prefix."""
    prefix = f"ui-many-{uuid.uuid4().hex[:6]}"
    with LiftbridgeClient(deployment.devserver.address) as client:
        for i in range(COUNT):
            name = f"{prefix}-{i:03d}"
            client.create_stream(name, name, partitions=2 if i % 10 == 0 else 1)
            if i % 10:
                client.publish_many(name, [b"v"] * (i % 10))
    return prefix


@pytest.fixture(scope="module")
def page(deployment: Deployment, archive_runs: list[str], many: str) -> Iterator[Any]:
    with logged_in_page(deployment.url) as logged_in:
        yield logged_in


@pytest.fixture(scope="module")
def prefixed_page(page: Any, prefixed: str) -> Iterator[Any]:
    """Another page of the module's browser (Playwright's sync API runs one per thread), logged
    in behind the path prefix."""
    behind = log_in(page.context.browser, prefixed)
    yield behind
    behind.close()


@pytest.fixture(params=["inside", "prefix"])
def where(request: pytest.FixtureRequest, deployment: Deployment, page: Any) -> tuple[Any, str]:
    """A logged-in page and Airflow's address: inside Airflow (its own address), or behind the path
    prefix (the proxy refuses anything outside it; the ``prefixed`` fixture checks it refused nothing)."""
    if request.param == "inside":
        return page, deployment.url
    return request.getfixturevalue("prefixed_page"), request.getfixturevalue("prefixed")


def in_frame(base: str, query: str) -> str:
    """The view's address in Airflow's frame at ``base`` (``<base>/plugin/liftbridge<base path>/liftbridge/?…``)."""
    return f"{base}/plugin/liftbridge{urlsplit(base).path}/liftbridge/?{query}"


def committed(frame: Any) -> list[int]:
    return [int(r.get_attribute("data-committed")) for r in frame.locator("#stream-list tr[data-stream]").all()]


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_streams_tab_sorts_and_pages_on_the_server(
    deployment: Deployment, where: tuple[Any, str], many: str, mode: str
) -> None:
    from playwright.sync_api import expect

    page, base = where
    page.emulate_media(color_scheme=mode)
    try:
        page.goto(in_frame(base, f"tab=streams&filter={many}"))
        frame = page.frame_locator("iframe")
        expect(frame.locator("html")).to_have_attribute("data-theme", mode)
        expect(frame.locator("#streams-count")).to_have_attribute("data-matched", str(COUNT))
        rows = frame.locator("#stream-list tr[data-stream]")
        expect(rows).to_have_count(50)
        expect(rows.first).to_have_attribute("data-stream", f"{many}-000")
        expect(frame.locator("#streams-pager")).to_have_attribute("data-pages", "3")

        frame.locator('button.sort[data-sort="committed"]').click()  # the biggest first
        expect(frame.locator('th[aria-sort="descending"] button[data-sort="committed"]')).to_be_visible()
        expect(rows.first).to_have_attribute("data-committed", "9")
        assert committed(frame) == sorted(committed(frame), reverse=True)
        frame.locator("#streams-next").click()
        expect(frame.locator("#streams-pager")).to_have_attribute("data-page", "2")
        expect(rows).to_have_count(50)
        page.wait_for_url(lambda at: "sort=committed" in at and "page=2" in at)
        assert committed(frame) == sorted(committed(frame), reverse=True)
        second_page = [r.get_attribute("data-stream") for r in rows.all()]

        page.reload()  # the address keeps the sort and the page
        frame = page.frame_locator("iframe")
        rows = frame.locator("#stream-list tr[data-stream]")
        expect(frame.locator("#streams-pager")).to_have_attribute("data-page", "2")
        expect(rows).to_have_count(50)
        assert [r.get_attribute("data-stream") for r in rows.all()] == second_page

        frame.locator('button.sort[data-sort="name"]').click()
        expect(rows.first).to_have_attribute("data-stream", f"{many}-000")
        two = frame.locator(f'#stream-list tr[data-stream="{many}-010"] button.toggle')
        two.click()  # a stream of two partitions, opened
        parts = frame.locator(f'#stream-list tr[data-partition-of="{many}-010"]')
        expect(parts).to_have_count(2)
        expect(parts.first.locator("[data-oldest]")).to_have_attribute("data-oldest", "")  # empty: nothing retained
        one = frame.locator(f'#stream-list tr[data-stream="{many}-007"]')
        expect(one.locator("[data-retained]")).to_have_text("7")
        expect(frame.locator("#streams-note")).to_contain_text("retention")
        frame.locator("#streams-size").select_option("25")
        expect(rows).to_have_count(25)
        expect(frame.locator("#streams-pager")).to_have_attribute("data-pages", "5")
        expect(parts).to_have_count(2)  # still open
        assert low_contrast(frame) == []
        if base == deployment.url:
            shoot(page, deployment.log_dir, f"ui-liftbridge-streams-{mode}.png")

            # Every stream has a rate: a stream of its own that no task reads (not one of the 120, whose
            # counts the other mode checks), first 0/s, then counting the 40 messages published.
            busy = f"ui-rate-{mode}-{uuid.uuid4().hex[:6]}"
            with LiftbridgeClient(deployment.devserver.address) as client:
                client.create_stream(busy, busy)
            url = f"{deployment.url}/plugin/liftbridge/liftbridge/?tab=streams&filter={busy}"
            assert rate_of(page, url, lambda rate: rate == 0).get_attribute("data-stream") == busy
            with LiftbridgeClient(deployment.devserver.address) as client:
                client.publish_many(busy, [b"r"] * 40)
            first = rate_of(page, url, lambda rate: rate > 0)
            cell = first.locator("[data-rate]")
            assert cell.get_attribute("data-rate-messages") == "40"  # compared with a look before the publish
            assert re.fullmatch(r"[0-9.,]+/s", cell.inner_text())
        else:
            page.screenshot(path=str(deployment.log_dir / f"ui-liftbridge-prefixed-streams-{mode}.png"), full_page=True)
    finally:
        page.emulate_media(color_scheme="light")


def rate_of(page: Any, url: str, wanted: Callable[[float], bool]) -> Any:
    """The first row of the Streams tab at ``url`` sorted by rate, once its rate is ``wanted``:
    the page is loaded again until the view has a look old enough to compare with (rates.MIN_SPAN)."""
    from tests.margins import wait_until

    def first() -> Any:
        page.goto(f"{url}&sort=rate&order=desc")
        row = page.frame_locator("iframe").locator("#stream-list tr[data-stream]").first
        row.wait_for()
        rate = row.locator("[data-rate]").get_attribute("data-rate") or ""
        return row if rate and wanted(float(rate)) else None

    return wait_until(first, 300, "the wanted rate on the Streams tab", interval=1.0)


def every_tab_low_contrast(page: Any, base: str, mode: str) -> dict[str, list[Any]]:
    """Open every tab of the view at ``base`` in ``mode`` (each loads its data without an error;
    the browser opens a message) and return what each shows under 4.5:1."""
    from playwright.sync_api import expect

    page.emulate_media(color_scheme=mode)
    page.goto(f"{base}/plugin/liftbridge?tab=cluster")  # the short form: the same inside and behind a prefix
    frame = page.frame_locator("iframe")
    expect(frame.locator("html")).to_have_attribute("data-theme", mode)
    found = {}
    for tab in TABS:
        count = frame.locator("#updated").get_attribute("data-count") or "0"
        frame.locator(f'nav button[data-tab="{tab}"]').click()
        if tab == "browse":
            frame.locator("#b-stream").fill("shop-orders-clean")
            frame.locator("#b-go").click()
            expect(frame.locator("#b-status[data-reason]")).to_be_visible()
            frame.locator("#messages tr.message button").first.click()  # View
            expect(frame.locator("#b-view-value")).to_be_visible()
        else:
            expect(frame.locator("#updated")).not_to_have_attribute("data-count", count)
            expect(frame.locator("#error")).to_have_count(0)
        found[tab] = low_contrast(frame)
    return found


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_every_tab_is_readable_in_both_modes(
    deployment: Deployment, page: Any, archive_runs: list[str], mode: str
) -> None:
    """Every visible text of every tab (the bar, the tabs' tables, badges, charts' legends, the
    browser's form and results, a message open) at least 4.5:1 against what is behind it."""
    try:
        assert every_tab_low_contrast(page, deployment.url, mode) == {tab: [] for tab in TABS}
    finally:
        page.emulate_media(color_scheme="light")


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_every_tab_loads_and_is_readable_behind_the_prefix(prefixed_page: Any, prefixed: str, mode: str) -> None:
    """The same behind a path prefix (the proxy refuses anything outside it, and the fixture checks
    that it refused nothing): every tab loads its data and reads at 4.5:1 or more."""
    try:
        assert every_tab_low_contrast(prefixed_page, prefixed, mode) == {tab: [] for tab in TABS}
    finally:
        prefixed_page.emulate_media(color_scheme="light")


def test_pipelines_show_verdicts_and_chart_points_open_their_runs(
    where: tuple[Any, str], archive_runs: list[str]
) -> None:
    from playwright.sync_api import expect

    page, base = where
    page.goto(in_frame(base, "tab=pipelines"))
    frame = page.frame_locator("iframe")
    heading = frame.locator(PIPELINE)
    expect(heading.locator(".badge.status")).to_have_attribute("data-status", re.compile(r"^(OK|WARN|STALL|STOP|ERR)$"))
    expect(heading).to_have_attribute("data-status", re.compile(r"^(OK|WARN|STALL|STOP|ERR)$"))
    table = frame.locator(f'table[data-pipeline-table="{ARCHIVE_DAG}.clean_orders"]')
    expect(table.locator("th").last).to_have_text("Status")
    expect(table.locator("td[data-verdict] .badge.status").first).to_have_attribute("title", re.compile(r"rule: "))

    frame.locator('nav button[data-tab="charts"]').click()
    lag = frame.locator(f'h2[data-chart-pipeline="{ARCHIVE_DAG}.clean_orders"] + div [data-chart="lag"]')
    caption = lag.locator("[data-run-caption]")
    # The chart's points in the order the run history has them (the order the runs ended).
    history = page.request.get(f"{base}/liftbridge/api/connections/liftbridge_default/history").json()
    [charted] = [p for p in history["pipelines"] if (p["dag_id"], p["task_id"]) == (ARCHIVE_DAG, "clean_orders")]
    runs = [r["run_id"] for r in charted["runs"]]
    assert sorted(runs) == sorted(archive_runs)
    expect(caption).to_have_attribute("data-run-id", runs[-1])  # the newest run, the cursor away
    expect(caption.locator("a")).to_have_attribute("href", f"../dags/{ARCHIVE_DAG}/runs/{quote(runs[-1], safe='')}")
    # The cursor on the first point, through uPlot's own API (a mouse move over the frame did not
    # reach the plot in the busy run of 2026-12-06: to be looked at).
    page.frame_locator("iframe").locator("html").evaluate(
        """(html, name) => {
          const c = window.liftbridgeView.charts.find(c => c.plot && c.box.dataset.chart === "lag"
            && c.box.parentElement.previousElementSibling.dataset.chartPipeline === name);
          c.plot.setCursor({left: c.plot.valToPos(c.xs[0], "x"), top: 10});
        }""",
        f"{ARCHIVE_DAG}.clean_orders",
    )
    expect(caption).to_have_attribute("data-run-id", runs[0])
    expect(caption).to_contain_text(f"run {runs[0]}")
    caption.locator("a").click()  # the run's page, in Airflow's window
    page.wait_for_url(lambda at: at.startswith(f"{base}/dags/{ARCHIVE_DAG}/runs/"))
    assert quote(runs[0], safe="") in page.url or runs[0] in page.url


def test_the_streams_route_is_refused_without_a_session_and_messages_names_a_bad_partition(
    deployment: Deployment, page: Any
) -> None:
    url = f"{deployment.url}/liftbridge/api/connections/liftbridge_default/streams"
    assert_refused_without_a_session(url)
    assert page.request.get(url).status == 200  # the browser's session
    bad = page.request.get(f"{url}/shop-orders/partitions/first/messages")
    assert bad.status == 400
    assert bad.json()["detail"]["field"] == "partition"
