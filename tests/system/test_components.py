"""The deployment's own processes (see conftest.py): their log servers listen on ports of the
deployment's own while Airflow's default ones (8793, 8794) are held by someone else.
"""

from __future__ import annotations

import urllib.error
import urllib.request

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
