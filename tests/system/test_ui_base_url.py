"""The Liftbridge view when Airflow is served under a path prefix (``[api] base_url =
http://127.0.0.1:<proxy>/airflow``), behind a small reverse proxy that serves that path only
(:mod:`tests.system.prefix_proxy`: anything outside it is a 404, as behind a company's proxy).

A second api-server of the system tier's deployment (same home, database and JWT secret) runs
for this module with that base URL and with ``[core] lazy_discover_providers = False`` (then
Airflow loads providers' plugins as well as entry-point plugins: the view must be registered
once). In headless Chromium: log in through the proxy, Browse → Liftbridge, the view's data in
Airflow's frame, its links to Airflow staying under the prefix; no plugin import error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from scripts.deployment import Deployment, airflow_command, free_port, wait_until
from tests.processes import run_child
from tests.system.conftest import ARCHIVE_DAG
from tests.system.prefix_proxy import prefix_proxy
from tests.system.test_ui import logged_in_page
from tests.system.test_ui_address import check_the_address_lasts
from tests.system.test_ui_liftbridge_view import PIPELINE, open_from_browse_menu

pytestmark = [pytest.mark.system, pytest.mark.timeout(900)]
PREFIX = "/airflow"
NAME = "api-server-prefixed"
#: The second api-server's own settings.
EAGER = {"AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}


@pytest.fixture(scope="module")
def prefixed(deployment: Deployment) -> Iterator[str]:
    """The proxy's address of Airflow (``http://127.0.0.1:<port>/airflow``), a second api-server
    behind it; stopped after the module."""
    import urllib.request

    from scripts.deployment import Component

    upstream = free_port(exclude={deployment.api_port, deployment.execution_api_port})
    with prefix_proxy(PREFIX, upstream) as proxy:
        base = f"http://127.0.0.1:{proxy.server_address[1]}{PREFIX}"
        args = ["api-server", "--host", "127.0.0.1", "--port", str(upstream), "--apps", "core"]
        env = EAGER | {"AIRFLOW__API__BASE_URL": base, "AIRFLOW__API__PORT": str(upstream)}
        deployment.components[NAME] = Component(NAME, args, deployment.log_dir / f"{NAME}.log", env=env)
        deployment.start_component(NAME)

        def up() -> bool:
            deployment.check_running()
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=30) as response:
                    return response.status == 200
            except OSError:
                return False

        try:
            wait_until("the prefixed api-server", up, timeout=180)
            yield base
            assert not [p for p in proxy.refused if "favicon" not in p], f"requests left {PREFIX}: {proxy.refused}"
        finally:
            deployment.stop_component(NAME)
            del deployment.components[NAME]


def test_browse_menu_opens_the_view_under_the_prefix(
    deployment: Deployment, prefixed: str, archive_runs: list[str]
) -> None:
    """Everything the page and its frame load stays under the prefix (the proxy refuses the rest,
    and the module checks it refused nothing); a DAG link of the view opens Airflow's DAG page
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


def test_a_reload_and_a_shared_link_open_the_same_view_under_the_prefix(
    deployment: Deployment, prefixed: str, archive_runs: list[str]
) -> None:
    """The address keeps the view's state under the prefix too (see ``test_ui_address.py``)."""
    with logged_in_page(prefixed) as page:

        def shots(p: Any, name: str) -> None:
            p.screenshot(path=str(deployment.log_dir / f"ui-liftbridge-prefixed-address-{name}.png"), full_page=True)

        try:
            check_the_address_lasts(page, prefixed, shots)
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
