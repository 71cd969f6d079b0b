"""How long the Liftbridge view takes (docs/ui.md, "Speed"; issue 58 item 7: interactive within
1 s of the Browse → Liftbridge click at 100 streams on 2 cores).

Two parts, each a markdown table on stdout with the machine and its load:

1. **In-process** (always): a dev server in its own process (``DevServerProcess``) with
   ``--streams`` streams of ``--partitions`` partitions; timed ``--rounds`` times after a warm-up:
   the client's ``fetch_metadata()``, ``ui.model.cluster``, and ``GET .../cluster`` and
   ``GET .../streams`` (a page of 50, sorted by size) through the view's FastAPI app with
   Airflow's auth (a SimpleAuthManager JWT; in-process, no socket).
2. **In a browser** (``--browser``): a real Airflow (``scripts/deployment.py``: api-server,
   scheduler, dag-processor, triggerer, an empty DAGs folder) and headless Chromium logged in as a
   user. For each count of ``--browser-streams`` (streams created in its dev server): the time
   from the click on Browse → Liftbridge to the view's first data shown (the Pipelines tab,
   ``liftbridgeView.firstShown``), **cold** (the api-server just restarted, the browser's cache
   empty: the first click of the day) ``--cold`` times and **warm** (the same browser, from
   Airflow's home page again) ``--warm`` times; then a click on the Streams tab to its first page
   shown. The cold rows also say where the time went (the frame's page, its script, the data
   calls) from the frame's Resource Timing.

    .venv/bin/python bench/ui_bench.py [--streams 1000] [--rounds 5]
    .venv/bin/python bench/ui_bench.py --browser [--browser-streams 100,1000] [--cold 3] [--warm 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _measure import machine

HOME = Path(tempfile.mkdtemp(prefix="ui-bench-airflow-"))
os.environ.update({"AIRFLOW_HOME": str(HOME), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from airflow_provider_liftbridge.client import LiftbridgeClient  # noqa: E402
from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402


def timed(work: Callable[[], object], rounds: int) -> list[float]:
    """Wall seconds of ``rounds`` calls of ``work`` (after one warm-up call)."""
    work()
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        work()
        out.append(time.perf_counter() - start)
    return out


def create_streams(client: LiftbridgeClient, first: int, last: int, partitions: int) -> float:
    """Streams ``bench-<first>`` to ``bench-<last - 1>``, each with ``i % 7`` messages per partition
    (sizes differ, so sorting by size has work to do); the seconds it took."""
    start = time.perf_counter()
    for i in range(first, last):
        name = f"bench-{i:05d}"
        client.create_stream(name, name, partitions=partitions)
        if i % 7:
            client.publish_many(name, [b"x" * 100] * (i % 7))
    return time.perf_counter() - start


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def table(rows: list[tuple[str, list[float]]]) -> None:
    print("| what | median s | min s | max s | n |")
    print("|---|---:|---:|---:|---:|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | {len(times)} |")


def in_process(args: argparse.Namespace) -> None:
    from airflow.api_fastapi.app import get_auth_manager, init_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from airflow.utils import db
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from airflow_provider_liftbridge.ui import model
    from airflow_provider_liftbridge.ui.api import app
    from airflow_provider_liftbridge.ui.plugin import URL_PREFIX

    db.initdb()
    root = FastAPI()
    init_auth_manager(root)
    root.mount(URL_PREFIX, app)
    token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="bench", role="op"))

    with tempfile.TemporaryDirectory() as data, DevServerProcess(data) as server:
        os.environ["AIRFLOW_CONN_UI_BENCH"] = json.dumps({"conn_type": "liftbridge", "host": server.address})
        with LiftbridgeClient(server.address) as client:
            created = create_streams(client, 0, args.streams, args.partitions)
            http = TestClient(root, headers={"Authorization": f"Bearer {token}"})

            def endpoint(path: str, **params: str) -> Callable[[], None]:
                def call() -> None:
                    response = http.get(f"{URL_PREFIX}/api/connections/ui_bench/{path}", params=params)
                    assert response.status_code == 200, response.text
                    body = response.json()
                    assert len(body["streams"]) >= min(args.streams, 50), body

                return call

            rows = [
                ("client.fetch_metadata()", timed(client.fetch_metadata, args.rounds)),
                ("ui.model.cluster(client)", timed(lambda: model.cluster(client), args.rounds)),
                ("GET .../cluster (auth, new client, JSON)", timed(endpoint("cluster"), args.rounds)),
                (
                    "GET .../streams, a page of 50 by size (auth, new client, 50 oldest-offset reads)",
                    timed(endpoint("streams", sort="committed", order="desc", limit="50"), args.rounds),
                ),
            ]
    print(f"\nui_bench, in-process: {args.streams} streams x {args.partitions} partition(s), {args.rounds} rounds")
    print(f"machine: {machine()}; load average {load()}")
    print(f"(creating the streams took {created:.1f} s)\n")
    table(rows)


# -- in a browser ---------------------------------------------------------------------------------
def _frame(page: Any) -> Any:
    """The view's frame of an Airflow page (its page is at .../liftbridge/)."""
    for frame in page.frames:
        if "/liftbridge/" in frame.url and frame is not page.main_frame:
            return frame
    return None


def _wait_frame(page: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = _frame(page)
        if frame is not None:
            return frame
        page.wait_for_timeout(10)
    raise TimeoutError("the view's frame did not appear")


def click_to_interactive(page: Any, base: str) -> tuple[float, dict[str, float]]:
    """From Airflow's home page, click Browse → Liftbridge; seconds from the click to the view's
    first data shown, and where the time went (ms after the click, from Resource Timing)."""
    page.goto(f"{base}/")
    page.get_by_role("button", name="Browse").click()
    item = page.get_by_role("menuitem", name="Liftbridge")
    item.wait_for()
    clicked = time.time()
    item.click()
    frame = _wait_frame(page)
    frame.wait_for_function("window.liftbridgeView && window.liftbridgeView.firstShown", timeout=120_000, polling=20)
    shown = frame.evaluate("window.liftbridgeView.firstShown") / 1000
    parts = frame.evaluate(
        """() => {
          const origin = performance.timeOrigin, out = {};
          const nav = performance.getEntriesByType("navigation")[0];
          if (nav) {
            out["frame page"] = origin + nav.responseEnd;
            out["scripts run"] = origin + nav.domContentLoadedEventEnd;
          }
          for (const r of performance.getEntriesByType("resource")) {
            const name = r.name.includes("/api/connections/") && !r.name.endsWith("/api/connections")
              ? "tab data" : r.name.endsWith("/api/connections") ? "connections" : null;
            if (name) out[name] = origin + r.responseEnd;
          }
          return out;
        }"""
    )
    return shown - clicked, {k: (v / 1000 - clicked) * 1000 for k, v in parts.items()}


def streams_tab(page: Any) -> float:
    """Seconds from a click on the Streams tab to its first page shown."""
    frame = _frame(page)
    count = int(frame.evaluate("Number(document.getElementById('updated').dataset.count)"))
    clicked = time.time()
    frame.locator('nav button[data-tab="streams"]').click()
    frame.wait_for_function(
        f"Number(document.getElementById('updated').dataset.count) > {count} && document.getElementById('stream-list')",
        timeout=120_000,
        polling=20,
    )
    return time.time() - clicked


def browser(args: argparse.Namespace) -> None:
    from scripts.deployment import Deployment, wait_until
    from tests.system.test_ui import logged_in_page

    dags = HOME / "empty-dags"
    dags.mkdir()
    deployment = Deployment(HOME / "deployment", dags_folder=dags)
    counts = [int(n) for n in args.browser_streams.split(",")]
    rows: list[tuple[str, list[float]]] = []
    notes: list[str] = []
    try:
        deployment.start()
        made = 0
        for count in counts:
            with LiftbridgeClient(deployment.devserver.address) as client:
                create_streams(client, made, count, args.partitions)
            made = count
            cold, breakdown = [], []
            for _ in range(args.cold):
                deployment.stop_component("api-server")
                deployment.start_component("api-server")
                wait_until("the api-server", deployment._api_up, timeout=300)
                with logged_in_page(deployment.url) as page:  # a fresh browser: an empty cache
                    seconds, parts = click_to_interactive(page, deployment.url)
                cold.append(seconds)
                breakdown.append(parts)
            warm, tab = [], []
            with logged_in_page(deployment.url) as page:
                click_to_interactive(page, deployment.url)  # fills the browser's cache
                for _ in range(args.warm):
                    warm.append(click_to_interactive(page, deployment.url)[0])
                    tab.append(streams_tab(page))
            rows += [
                (f"{count} streams: Browse → Liftbridge, cold (api-server restarted, empty browser cache)", cold),
                (f"{count} streams: Browse → Liftbridge, warm", warm),
                (f"{count} streams: Streams tab click to its first page (50 rows)", tab),
            ]
            for parts in breakdown:
                notes.append(
                    f"{count} streams, cold: "
                    + ", ".join(f"{k} +{v:.0f} ms" for k, v in sorted(parts.items(), key=lambda kv: kv[1]))
                )
    finally:
        deployment.stop()
    print(
        f"\nui_bench, in Chromium: a real Airflow (api-server, scheduler, ...) on this machine,"
        f" {args.partitions} partition(s) a stream"
    )
    print(f"machine: {machine()}; load average at the end {load()}\n")
    table(rows)
    print()
    for note in notes:
        print(f"- {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--browser", action="store_true", help="also time the view in Chromium in a real Airflow")
    parser.add_argument("--browser-only", action="store_true", help="only the browser part")
    parser.add_argument("--browser-streams", default="100,1000")
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--warm", type=int, default=5)
    args = parser.parse_args()
    if not args.browser_only:
        in_process(args)
    if args.browser or args.browser_only:
        browser(args)


if __name__ == "__main__":
    main()
