"""The dev server's cluster mode under the faults that broke on a real three-broker Liftbridge
cluster (issue 13): a stalled follower and a killed leader leaving an uncommitted tail under an
exactly-once publish, and a full-cluster restart under everything that waits (a subscription,
an offset trigger, a message sensor's trigger, an event trigger). Each counts the stream record
by record (see scenarios.py)."""

from __future__ import annotations

import pytest

from . import scenarios

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("airflow_db")]


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
def test_follower_stalled_during_exactly_once_publishing(occ: bool) -> None:
    figures = scenarios.stalled_follower(occ)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent
    assert "resumes 0" not in figures.notes, figures  # the stall was met, not missed


def test_leader_killed_with_an_uncommitted_tail() -> None:
    figures = scenarios.leader_killed_with_tail()
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent


@pytest.mark.parametrize("kind", scenarios.WAITERS)
def test_full_cluster_restart_under_a_waiter(kind: str) -> None:
    figures = scenarios.full_restart(kind)
    assert figures.notes.startswith("finished"), figures
    assert (figures.lost, figures.duplicated) == (0, 0), figures
