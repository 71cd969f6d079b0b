"""The deployment's own processes (see conftest.py): their log servers listen on ports of the
deployment's own while Airflow's default ones (8793, 8794) are held by someone else, and the
execution API answers the workers while a REST API call waits for SQLite's write lock.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from scripts.deployment import Deployment, wait_until

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]


def answers_http(port: int) -> bool:
    """Something on 127.0.0.1:``port`` answers HTTP (Airflow's log server refuses an unsigned
    request: any status will do)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/log/none.log", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.parametrize("component", ["scheduler", "triggerer"])
def test_log_servers_listen_on_ports_of_the_deployments_own(deployment: Deployment, component: str) -> None:
    port = deployment.worker_log_port if component == "scheduler" else deployment.trigger_log_port
    assert port not in (8793, 8794)
    wait_until(f"the {component}'s log server on port {port}", lambda: answers_http(port), timeout=60)
    log = deployment.log_text(component)
    assert f":{port} " in log  # "Starting log server on http://[::]:PORT [...]"
    assert "address already in use" not in log, f"see {deployment.components[component].log}"


def answers(url: str, within: float) -> bool:
    """``url`` answers 200 within ``within`` seconds."""
    try:
        with urllib.request.urlopen(url, timeout=within) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):  # a timeout is an OSError
        return False


def test_the_execution_api_answers_while_a_rest_call_waits_for_the_write_lock(deployment: Deployment) -> None:
    """Airflow 3.3.2's REST API writes its audit log from the api-server's event loop, so a REST
    write waiting for SQLite's write lock stops that api-server answering anything. Task workers'
    execution API calls must not wait behind it: in one process with the REST API, a worker's
    call holding the write lock could not finish either, and both waited out the 60 s busy
    timeout (HTTP 500 "database is locked"; see COMPONENTS in scripts/deployment.py)."""
    core_health = f"{deployment.url}/api/v2/monitor/health"
    execution_health = f"{deployment.execution_api_url}health"
    answer: dict[str, Any] = {}

    def rest_write() -> None:
        answer.update(deployment.api("POST", "/variables", {"key": "system_lock_probe", "value": "1"}))

    lock = sqlite3.connect(deployment.db_path, timeout=30, isolation_level=None)
    writer = threading.Thread(target=rest_write, daemon=True)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the write lock, as a worker's call in the middle of a write holds it
        writer.start()
        wait_until("the REST call to stall its api-server", lambda: not answers(core_health, 1), timeout=30)
        started = time.monotonic()
        assert answers(execution_health, 10), "the execution API waited behind the REST call"
        waited = time.monotonic() - started
    finally:
        lock.rollback()
        lock.close()
    writer.join(60)
    assert answer.get("key") == "system_lock_probe", "the REST call did not go through once the lock was free"
    print(f"\nexecution API answered in {waited:.2f} s while the REST API waited for the lock")
