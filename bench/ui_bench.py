"""How long the Liftbridge view takes to list a cluster of many streams (docs/ui.md; the issue's
target: 1,000 streams in under 2 s against the dev server).

A dev server runs in its own process (``DevServerProcess``) with ``--streams`` streams of
``--partitions`` partitions. Three things are timed, each ``--rounds`` times: the client's
``fetch_metadata()``; ``ui.model.cluster`` (the same plus building the page's JSON); and
``GET /liftbridge/api/connections/<id>/cluster`` through the view's FastAPI app with Airflow's
auth (a SimpleAuthManager JWT; in-process, no HTTP socket), which also opens and closes the
connection's client. A markdown table goes to stdout, with the machine's load.

    .venv/bin/python bench/ui_bench.py [--streams 1000] [--partitions 1] [--rounds 5]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

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
            start = time.perf_counter()
            for i in range(args.streams):
                client.create_stream(f"bench-{i:05d}", f"bench-{i:05d}", partitions=args.partitions)
            created = time.perf_counter() - start
            http = TestClient(root, headers={"Authorization": f"Bearer {token}"})

            def endpoint() -> None:
                response = http.get(f"{URL_PREFIX}/api/connections/ui_bench/cluster")
                assert response.status_code == 200, response.text
                assert len(response.json()["streams"]) >= args.streams

            rows = [
                ("client.fetch_metadata()", timed(client.fetch_metadata, args.rounds)),
                ("ui.model.cluster(client)", timed(lambda: model.cluster(client), args.rounds)),
                ("GET .../cluster (auth, new client, JSON)", timed(endpoint, args.rounds)),
            ]
    print(f"\nui_bench: {args.streams} streams x {args.partitions} partition(s), {args.rounds} rounds")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"(creating the streams took {created:.1f} s)\n")
    print("| what | median s | min s | max s |")
    print("|---|---:|---:|---:|")
    for name, times in rows:
        print(f"| {name} | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} |")


if __name__ == "__main__":
    main()
