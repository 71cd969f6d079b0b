"""Exactly-once under a frozen broker in each role, and beside a zombie try (issue 24 points 1
and 2, ADR 8): every record in the stream once. The scenarios are in ``exactly_once_frozen.py``;
on the code before ADR 8 the frozen first broker and the overlapping tries stored records twice.

With ``LIFTBRIDGE_TEST_BROKERS`` they run against that cluster: the overlapping tries as they are,
the frozen brokers with ``--freeze-cmd`` / ``--thaw-cmd`` (and ``--metadata-leader`` for the roles
that freeze it), skipped with the reason otherwise (``freezing.py``)."""

from __future__ import annotations

import pytest

from tests.conftest import EXTERNAL_BROKERS

from . import exactly_once_frozen as scenarios
from .freezing import FreezableCluster

pytestmark = [pytest.mark.external_cluster, pytest.mark.timeout(240)]


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
@pytest.mark.parametrize("role", scenarios.ROLES)
def test_exactly_once_with_a_broker_frozen_mid_publish(
    role: str, occ: bool, freezable: FreezableCluster | None
) -> None:
    if freezable is not None and freezable.metadata_leader is None and role in ("metadata leader", "first broker"):
        pytest.skip(
            f"freezing the {role} of the external cluster needs its metadata leader: --metadata-leader (index, id "
            "or address) or --metadata-leader-cmd (a command printing it); the API does not tell"
        )
    figures = scenarios.frozen_broker(role, occ, cluster=freezable)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent, figures


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
def test_two_overlapping_tries_of_one_exactly_once_task(occ: bool) -> None:
    addresses = [a.strip() for a in EXTERNAL_BROKERS.split(",")] if EXTERNAL_BROKERS else None
    figures = scenarios.overlapping_tries(occ, addresses=addresses)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent, figures
