"""The Lag and Groups tabs (docs/ui.md, "Lag as a verdict", "Consumer groups") in the system tier's
deployment, in headless Chromium inside Airflow's frame and behind a path prefix, light and dark: a
threshold set as an Airflow Variable is shown beside the example's pipeline; a consumer group of
two members of this test process (one partition each) shows its epoch, its members and who holds
which partition, its lag and the age of its oldest unread message; the member that stopped
reading is STALL, the one over the group's threshold WARN; the address keeps the tab across a
reload; every text of both tabs has a contrast of at least 4.5:1
(``tests/system/contrast.py``). Screenshots go to the deployment's log folder (and to ``docs/`` with
``LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS=1``).

An earlier look of the view is stood in for by one sample written two minutes back (the view
samples at most once a minute), so the group's window has two commits without waiting."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from airflow_provider_liftbridge.client import GroupConsumer, LiftbridgeClient, StreamExistsError
from airflow_provider_liftbridge.ui import samples
from airflow_provider_liftbridge.ui.lag_api import THRESHOLDS_VARIABLE
from scripts.deployment import Deployment
from tests import margins
from tests.system.conftest import ARCHIVE_DAG
from tests.system.contrast import low_contrast
from tests.system.test_ui import assert_refused_without_a_session, logged_in_page
from tests.system.test_ui_liftbridge_view import shoot

pytestmark = [pytest.mark.system, pytest.mark.timeout(1200)]
PIPELINE = f"{ARCHIVE_DAG}.clean_orders"
GROUP = "ui-billing"
GROUP_STREAM = "ui-billing-orders"


def _assigned(a: GroupConsumer, b: GroupConsumer) -> bool:
    a.check_assignments()
    b.check_assignments()
    return all(len(x.assignments.get(GROUP_STREAM, [])) == 1 for x in (a, b))


@pytest.fixture(scope="module")
def group(deployment: Deployment, archive_runs: list[str]) -> Iterator[dict[str, int]]:
    """Members alpha and beta of :data:`GROUP`, one partition each, in this process while the
    module runs. Alpha read its 3 messages, then 2 more came (lag 2, over the group's threshold of
    1); beta read 1 of 3 and no more (lag 2, the same position as two minutes before: stalled).
    The thresholds Variable names the group and the example's pipeline."""
    thresholds = {PIPELINE: {"max_lag": 2, "max_lag_age_s": 3600}, f"group:{GROUP}": {"max_lag": 1}}
    deployment.api("POST", "/variables", {"key": THRESHOLDS_VARIABLE, "value": json.dumps(thresholds)})
    # No max_poll_interval: the members stay in the group while the browser works, however long.
    options: dict[str, Any] = {"auto_offset": "earliest", "auto_commit_interval": None, "max_poll_interval": None}
    try:
        with LiftbridgeClient(deployment.devserver.address, timeout=10.0) as client:
            with contextlib.suppress(StreamExistsError):
                client.create_stream(GROUP_STREAM, GROUP_STREAM, partitions=2)
            for p in (0, 1):
                client.publish_many(GROUP_STREAM, [b'{"n": 1}'] * 3, partition=p)
            with (
                client.group_consumer(GROUP, GROUP_STREAM, consumer_id="alpha", **options) as alpha,
                client.group_consumer(GROUP, GROUP_STREAM, consumer_id="beta", **options) as beta,
            ):
                margins.wait_until(lambda: _assigned(alpha, beta), 60.0, "one partition each", interval=0.2)
                [pa], [pb] = alpha.assignments[GROUP_STREAM], beta.assignments[GROUP_STREAM]
                assert len(list(alpha.messages(max_messages=3, timeout=60))) == 3
                assert len(list(beta.messages(max_messages=1, timeout=60))) == 1
                alpha.commit()
                beta.commit()
                earlier = {pa: (2, 2, 0, 0.0), pb: (0, 2, 2, None)}
                samples.take_samples(
                    client, {}, [samples.Sample("group", GROUP, GROUP_STREAM, time.time() - 120, earlier)]
                )
                client.publish_many(GROUP_STREAM, [b'{"n": 2}'] * 2, partition=pa)
                info = client.fetch_group_metadata([GROUP])[GROUP]
                assert info is not None
                yield {"alpha": pa, "beta": pb, "epoch": info.epoch}
    finally:
        deployment.api("DELETE", f"/variables/{THRESHOLDS_VARIABLE}")


@pytest.mark.parametrize("where", ["inside", "prefix"])
@pytest.mark.parametrize("mode", ["light", "dark"])
def test_lag_and_groups_tabs_show_verdicts_thresholds_and_members(
    deployment: Deployment, group: dict[str, int], mode: str, where: str, request: pytest.FixtureRequest
) -> None:
    """Inside Airflow, or behind the path prefix (``prefixed``: the proxy refuses anything outside
    it, and the fixture checks it refused nothing)."""
    from playwright.sync_api import expect

    base = deployment.url if where == "inside" else str(request.getfixturevalue("prefixed"))
    shot = f"ui-liftbridge-{{}}-{mode}.png" if where == "inside" else f"ui-liftbridge-prefixed-{{}}-{mode}.png"
    with logged_in_page(base) as page:
        page.emulate_media(color_scheme=mode)
        try:
            page.goto(f"{base}/plugin/liftbridge{urlsplit(base).path}/liftbridge/?tab=lag")
            frame = page.frame_locator("iframe")
            expect(frame.locator("html")).to_have_attribute("data-theme", mode)
            pipeline = frame.locator(f'#lag-table tr[data-reader="{PIPELINE}"]')
            expect(pipeline.locator("[data-threshold]")).to_have_text("2 messages, 1 h old")
            expect(pipeline.locator(".badge.status")).to_have_attribute("data-status", re.compile(r"^(OK|WARN)$"))
            reader = frame.locator(f'#lag-table tr[data-reader="{GROUP}"]')
            expect(reader).to_have_attribute("data-status", "STALL")
            expect(reader.locator("[data-lag]")).to_have_text("4")
            # Lag as time: the oldest unread message (beta's offset 1) was published seconds ago.
            expect(reader.locator("[data-lag-age]")).to_have_attribute("data-lag-age", re.compile(r"^\d+(\.\d+)?$"))
            expect(frame.locator("#lag-rules")).to_contain_text(THRESHOLDS_VARIABLE)
            expect(frame.locator(f'[data-chart="lag-history"][data-reader="{GROUP}"] canvas')).to_have_count(1)
            assert low_contrast(frame) == []  # the whole tab
            shoot_here(page, deployment, shot.format("lag"))

            frame.locator('nav button[data-tab="groups"]').click()
            heading = frame.locator(f'h2[data-group="{GROUP}"]')
            expect(heading).to_have_attribute("data-epoch", str(group["epoch"]))
            expect(heading).to_have_attribute("data-status", "STALL")
            expect(heading.locator("[data-lag]")).to_have_text("4")
            expect(heading.locator("[data-lag-age]")).to_have_attribute("data-lag-age", re.compile(r"^\d+(\.\d+)?$"))
            members = frame.locator(f'table[data-members-of="{GROUP}"]')
            for member in ("alpha", "beta"):
                row = members.locator(f'tr[data-member="{member}"]')
                expect(row).to_have_attribute("data-state", "current")
                expect(row).to_contain_text(f"{GROUP_STREAM}: {group[member]}")
            partitions = frame.locator(f'table[data-partitions-of="{GROUP}"]')
            alpha = partitions.locator(f'tr[data-partition="{group["alpha"]}"]')
            beta = partitions.locator(f'tr[data-partition="{group["beta"]}"]')
            expect(alpha).to_contain_text("alpha")
            expect(alpha).to_have_attribute("data-status", "WARN")  # lag 2 > the group's threshold 1
            expect(alpha.locator(".badge.status")).to_have_attribute("title", re.compile("over the threshold"))
            expect(beta).to_contain_text("beta")
            expect(beta).to_have_attribute("data-status", "STALL")
            page.wait_for_url(lambda at: "tab=groups" in at)
            assert low_contrast(frame) == []  # the whole tab
            shoot_here(page, deployment, shot.format("groups"))

            page.reload()  # the address keeps the tab
            frame = page.frame_locator("iframe")
            expect(frame.locator('nav button[data-tab="groups"]')).to_have_class(re.compile(r"\bactive\b"))
            expect(frame.locator(f'h2[data-group="{GROUP}"]')).to_be_visible()
        finally:
            page.screenshot(path=str(deployment.log_dir / shot.format("lag-groups-last")), full_page=True)


def shoot_here(page: Any, deployment: Deployment, name: str) -> None:
    """The screenshot ``name``: for ``docs/`` too when taken inside Airflow (:func:`shoot`)."""
    if name.startswith("ui-liftbridge-prefixed-"):
        page.screenshot(path=str(deployment.log_dir / name), full_page=True)
    else:
        shoot(page, deployment.log_dir, name)


def test_the_new_routes_are_refused_without_a_session(deployment: Deployment) -> None:
    for path in ("lag", "groups"):
        url = f"{deployment.url}/liftbridge/api/connections/liftbridge_default/{path}"
        assert_refused_without_a_session(url)
