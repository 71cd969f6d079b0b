"""The message browser (docs/ui.md, "The message browser") in the system tier's deployment, in
headless Chromium, inside Airflow's frame, in light and dark mode: find a message by key and by
JSON path, open it, switch pretty / raw / hex, copy it, download its value, page older and newer;
bad input refused in the form with words; and a long search stopped with its Stop button (the
browser's network throttled, through Chromium's DevTools protocol, so the answer is still arriving
when the button is pressed), then continued with Older from where it stopped. Screenshots go to the
deployment's log folder, and to ``docs/`` with ``LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS=1``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, Record
from scripts.deployment import Deployment
from tests.system.test_ui import logged_in_page
from tests.system.test_ui_liftbridge_view import shoot

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]
ORDERS = 30
PARTITIONS = 3


def order(i: int) -> dict[str, Any]:
    return {
        "order": {"id": f"o-{i}", "status": "shipped" if i % 2 else "paid"},
        "items": [{"sku": f"sku-{i % 5}", "qty": i}],
    }


@pytest.fixture(scope="module")
def orders(deployment: Deployment) -> str:
    """A 3-partition stream of :data:`ORDERS` orders published one after the other (so their
    times follow ``i``): order ``i`` on partition ``i % 3`` at offset ``i // 3``, keyed ``order-<i>``,
    with the header ``trace``."""
    name = f"ui-browser-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(deployment.devserver.address) as client:
        client.create_stream(name, name, partitions=PARTITIONS)
        for i in range(ORDERS):
            value = json.dumps(order(i)).encode()
            client.publish(
                name, value, key=f"order-{i}".encode(), headers={"trace": f"t-{i}".encode()}, partition=i % 3
            )
    return name


@pytest.fixture(scope="module")
def page(deployment: Deployment, orders: str) -> Iterator[Any]:
    with logged_in_page(deployment.url) as logged_in:
        yield logged_in


def shown(frame: Any) -> list[int]:
    """The orders the result table shows (``i`` from partition and offset), top to bottom."""
    rows = frame.locator("#messages tr.message").all()
    return [int(r.get_attribute("data-offset")) * PARTITIONS + int(r.get_attribute("data-partition")) for r in rows]


def search(frame: Any, **fields: str) -> None:
    """Fill the form (every field named; the others cleared) and press Search; wait for the end."""
    from playwright.sync_api import expect

    for name in ("b-key", "b-value", "b-path", "b-header", "b-offset"):
        frame.locator(f"#{name}").fill(fields.get(name, ""))
    frame.locator("#b-last").fill(fields.get("b-last", "20"))
    frame.locator("#b-go").click()
    expect(frame.locator("#b-status[data-reason]")).to_be_visible()


def page_to(frame: Any, button: str) -> None:
    """Press Older or Newer and wait for that page's end (the click replaces the results at once,
    so the status found is the new search's)."""
    from playwright.sync_api import expect

    frame.locator(button).click()
    expect(frame.locator("#b-status[data-reason]")).to_be_visible()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_find_open_and_page_in_both_modes(deployment: Deployment, page: Any, orders: str, mode: str) -> None:
    from playwright.sync_api import expect

    page.emulate_media(color_scheme=mode)
    page.set_viewport_size({"width": 1400, "height": 1200})
    try:
        page.goto(f"{deployment.url}/plugin/liftbridge/liftbridge/?tab=browse&stream={orders}")
        frame = page.frame_locator("iframe")
        expect(frame.locator("html")).to_have_attribute("data-theme", mode)
        expect(frame.locator("#messages tr.message")).to_have_count(20)
        assert shown(frame) == list(range(ORDERS - 1, ORDERS - 21, -1))  # newest first, merged by time

        # By key: the one order.
        search(frame, **{"b-key": "order-17"})
        assert shown(frame) == [17]
        expect(frame.locator("#messages tr.message").first).to_contain_text("trace")

        # By JSON path, then its view.
        search(frame, **{"b-path": "$.items[0].sku == sku-3"})
        assert shown(frame) == [28, 23, 18, 13, 8, 3]
        frame.locator("#messages tr.message .b-open").first.click()
        view = frame.locator("#b-view")
        expect(view.locator("h2")).to_contain_text(f"{orders} / 1 @ 9")
        expect(view.locator('[data-fact="key"]')).to_have_text("order-28")
        expect(view.locator('#b-view-headers [data-header="trace"]')).to_contain_text("t-28")
        value = frame.locator("#b-view-value")
        expect(value).to_have_attribute("data-mode", "pretty")
        expect(value).to_contain_text('"sku": "sku-3"')
        view.locator('button[data-mode="raw"]').click()
        expect(value).to_have_text(json.dumps(order(28)))
        view.locator('button[data-mode="hex"]').click()
        expect(value).to_contain_text("00000000  7b 22 6f 72 64 65 72 22")  # {"order"
        view.locator("#b-copy").click()
        expect(view.locator("#b-copy")).to_have_text("Copied")
        with page.expect_download() as download:
            view.locator("#b-download").click()
        assert Path(download.value.path()).read_bytes() == json.dumps(order(28)).encode()
        assert download.value.suggested_filename == f"{orders}-1-9.bin"
        shoot(page, deployment.log_dir, f"ui-liftbridge-browser-{mode}.png")

        # Paging both ways, 4 a page.
        search(frame, **{"b-last": "4"})
        assert shown(frame) == [29, 28, 27, 26]
        page_to(frame, "#b-older")
        assert shown(frame) == [25, 24, 23, 22]
        page_to(frame, "#b-older")
        assert shown(frame) == [21, 20, 19, 18]
        page_to(frame, "#b-newer")
        assert shown(frame) == [25, 24, 23, 22]
        frame.locator("#b-order").select_option("oldest")
        search(frame, **{"b-last": "4", "b-offset": "9"})
        assert shown(frame) == [27, 28, 29]
    finally:
        page.emulate_media(color_scheme="light")
        page.set_viewport_size({"width": 1400, "height": 900})


def test_bad_input_is_refused_in_the_form_with_words(deployment: Deployment, page: Any, orders: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{deployment.url}/liftbridge/?tab=browse&stream={orders}")
    expect(page.locator("#messages tr.message")).to_have_count(20)
    error = page.locator("#b-error")
    for field, typed, words in [
        ("b-path", "$.items[", "cannot read the path"),
        ("b-path", "order.id == 1", "starts with $"),
        ("b-offset", "ten", "whole number, 0 or more"),
        ("b-key", "hex:zz", "pairs of hex digits"),
        ("b-last", "1000", "from 1 to 500"),
    ]:
        page.locator(f"#{field}").fill(typed)
        page.locator("#b-go").click()
        expect(error).to_contain_text(words)
        expect(page.locator(f"#{field}")).to_have_attribute("aria-invalid", "true")
        page.locator(f"#{field}").fill("20" if field == "b-last" else "")
    # A time typed in part: the picker holds no value, and the form says what to type.
    page.locator("#b-time").press_sequentially("03")
    page.locator("#b-go").click()
    expect(error).to_contain_text("a date and a time of day")
    page.locator("#b-time").fill("")
    # The server says the same, never a raw 422: a request the form did not check.
    refused = page.request.get(
        f"{deployment.url}/liftbridge/api/connections/liftbridge_default/streams/{orders}/search?time=yesterday"
    )
    assert refused.status == 400 and "2026-12-06T09:30" in refused.json()["detail"]["message"]


def test_a_long_search_stops_and_goes_on_from_there(deployment: Deployment, page: Any) -> None:
    """600 orders of 1 KB match; the browser's network is throttled to 4 KB/s, so the page of 500
    is still arriving when Stop is pressed: the search ends, says so, and keeps what it found;
    Older (the network unthrottled) goes on after the last one shown, none twice."""
    from playwright.sync_api import expect

    name = f"ui-browser-bulk-{uuid.uuid4().hex[:8]}"
    with LiftbridgeClient(deployment.devserver.address) as client:
        client.create_stream(name, name)
        client.publish_many(name, [Record(json.dumps({"n": i, "pad": "x" * 1000}).encode()) for i in range(600)])
    page.goto(f"{deployment.url}/liftbridge/?tab=browse&stream={name}&partition=0&n=500&value=xxx")
    expect(page.locator("#messages tr.message")).to_have_count(500)
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    throttle = {"offline": False, "latency": 0, "uploadThroughput": -1}
    cdp.send("Network.emulateNetworkConditions", throttle | {"downloadThroughput": 4096})
    try:
        page.locator("#b-go").click()
        expect(page.locator("#b-stop")).to_be_visible()
        expect(page.locator("#b-status")).to_contain_text("Searching…")
        page.wait_for_function("document.querySelectorAll('#messages tr.message').length > 0")
        page.locator("#b-stop").click()
        status = page.locator("#b-status")
        expect(status).to_have_attribute("data-reason", "stopped")
        expect(status).to_contain_text(re.compile(r"Stopped by you: \d+ found"))
        expect(page.locator("#b-stop")).to_be_hidden()
    finally:
        cdp.send("Network.emulateNetworkConditions", throttle | {"downloadThroughput": -1})
    first = [int(r.get_attribute("data-offset")) for r in page.locator("#messages tr.message").all()]
    assert 0 < len(first) < 500 and first == list(range(599, 599 - len(first), -1))
    page_to(page, "#b-older")
    after = [int(r.get_attribute("data-offset")) for r in page.locator("#messages tr.message").all()]
    assert after == list(range(first[-1] - 1, first[-1] - 1 - min(500, 600 - len(first)), -1))
    page.screenshot(path=str(deployment.log_dir / "ui-liftbridge-browser-stopped.png"))  # not for the docs
