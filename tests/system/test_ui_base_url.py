"""The Liftbridge view when Airflow is served under a path prefix (``[api] base_url =
http://127.0.0.1:<proxy>/airflow``), behind a small reverse proxy that serves that path only
(:mod:`tests.system.prefix_proxy`: anything outside it is a 404, as behind a company's proxy).

A second api-server of the system tier's deployment (same home, database and JWT secret; the
``prefixed`` fixture of ``conftest.py``, shared by every module that looks behind the prefix) runs
with that base URL and with ``[core] lazy_discover_providers = False`` (then
Airflow loads providers' plugins as well as entry-point plugins: the view must be registered
once). In headless Chromium: log in through the proxy, Browse → Liftbridge, the view's data in
Airflow's frame, its links to Airflow staying under the prefix; no plugin import error. The
screenshots of a view reloaded from its address (light and dark) go to ``docs/`` with
``LIFTBRIDGE_UI_SCREENSHOTS_TO_DOCS=1``.
"""

from __future__ import annotations

from typing import Any

import pytest

from scripts.deployment import Deployment, airflow_command
from tests.processes import run_child
from tests.system.conftest import ARCHIVE_DAG, EAGER
from tests.system.test_ui import logged_in_page
from tests.system.test_ui_address import check_the_address_lasts
from tests.system.test_ui_liftbridge_view import PIPELINE, open_from_browse_menu, shoot

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]


def test_browse_menu_opens_the_view_under_the_prefix(
    deployment: Deployment, prefixed: str, archive_runs: list[str]
) -> None:
    """Everything the page and its frame load stays under the prefix (the proxy refuses the rest,
    and the fixture checks it refused nothing); a DAG link of the view opens Airflow's DAG page
    there."""
    from playwright.sync_api import expect

    with logged_in_page(prefixed) as page:
        try:
            frame = open_from_browse_menu(page, prefixed)
            expect(frame.locator(PIPELINE)).to_contain_text("shop-orders, cursor shop-orders-clean")
            dag_link = frame.locator(f"{PIPELINE} a").first
            expect(dag_link).to_have_text(ARCHIVE_DAG)
            dag_link.click()
            page.wait_for_url(f"{prefixed}/dags/{ARCHIVE_DAG}**")
            expect(page.get_by_text("clean_orders").first).to_be_visible()
        finally:
            page.screenshot(path=str(deployment.log_dir / "ui-liftbridge-prefixed.png"), full_page=True)


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_a_reload_and_a_shared_link_open_the_same_view_under_the_prefix(
    deployment: Deployment, prefixed: str, archive_runs: list[str], mode: str
) -> None:
    """The address keeps the view's state under the prefix too (see ``test_ui_address.py``): the
    message browser's search by a JSON path, its paging and a message open, in either colour mode."""
    from playwright.sync_api import expect

    with logged_in_page(prefixed) as page:
        page.emulate_media(color_scheme=mode)

        def shots(p: Any, name: str) -> None:
            if name == "reloaded":  # for docs/ui.md, "The address"
                shoot(p, deployment.log_dir, f"ui-liftbridge-address-{mode}.png")
            else:
                p.screenshot(
                    path=str(deployment.log_dir / f"ui-liftbridge-prefixed-address-{name}-{mode}.png"), full_page=True
                )

        try:
            check_the_address_lasts(page, prefixed, shots)
            expect(page.frame_locator("iframe").locator("html")).to_have_attribute("data-theme", mode)
        finally:
            shots(page, "last")


def test_the_view_is_registered_once_with_eager_provider_discovery(deployment: Deployment, prefixed: str) -> None:
    """With ``lazy_discover_providers = False``: no plugin import error names the view, in the
    UI's list (the REST API it reads) or in ``airflow plugins``."""
    import json
    import urllib.request

    token = deployment.token()
    request = urllib.request.Request(
        f"{prefixed}/api/v2/plugins/importErrors", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        errors = json.loads(response.read())["import_errors"]
    assert not [e for e in errors if "iftbridge" in json.dumps(e)], errors
    with urllib.request.urlopen(
        urllib.request.Request(f"{prefixed}/api/v2/plugins", headers={"Authorization": f"Bearer {token}"}), timeout=60
    ) as response:
        plugins = [p["name"] for p in json.loads(response.read())["plugins"]]
    assert plugins.count("liftbridge_ui") == 1, plugins
    listed = run_child(
        [*airflow_command(), "plugins", "--output", "json"],
        env=deployment.env() | EAGER,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "liftbridge_ui" in listed.stdout
    output = (listed.stdout + listed.stderr).splitlines()
    assert not [line for line in output if "already registered" in line and "iftbridge" in line], output[-40:]
