"""Publishing under injected faults: server SIGKILL, task death + retry, broker failover.
Each checks the stream record by record (see scenarios.py)."""

from __future__ import annotations

import pytest

from . import scenarios

pytestmark = pytest.mark.timeout(240)


def test_server_sigkill_exactly_once_loses_and_duplicates_nothing() -> None:
    figures = scenarios.server_kill(exactly_once=True)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent


def test_server_sigkill_at_least_once_loses_nothing() -> None:
    figures = scenarios.server_kill(exactly_once=False)
    assert figures.lost == 0, figures
    assert figures.in_stream == figures.sent + figures.duplicated


@pytest.mark.usefixtures("airflow_db")
@pytest.mark.parametrize(
    "fault",
    [
        # os._exit kills the process; the second dag.test() run then takes 20-30 s here (Airflow
        # start-up twice, and the dead try's task instance to clear), so it is marked slow.
        pytest.param("exit", marks=pytest.mark.slow),
        "raise",
    ],
)
def test_task_killed_then_retried_through_airflow(lb_address: str, fault: str) -> None:
    figures = scenarios.task_kill(lb_address, fault)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent
    assert "skipped 0" not in figures.notes, figures  # the retry found the first try's records


def test_partition_leader_stopped_mid_publish() -> None:
    figures = scenarios.cluster_failover()
    assert (figures.lost, figures.duplicated) == (0, 0), figures


def test_server_stalled_mid_publish_exactly_once() -> None:
    figures = scenarios.server_stall()
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert "resumes 0" not in figures.notes  # the stall was noticed and resumed, not waited out


def test_nats_server_restart_between_publishes() -> None:
    figures = scenarios.nats_restart()
    assert (figures.lost, figures.duplicated) == (0, 0), figures
