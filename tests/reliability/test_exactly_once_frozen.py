"""Exactly-once under a frozen broker in each role, and beside a zombie try (issue 24 points 1
and 2, ADR 8): every record in the stream once. The scenarios are in ``exactly_once_frozen.py``;
on the code before ADR 8 the frozen first broker and the overlapping tries stored records twice."""

from __future__ import annotations

import pytest

from . import exactly_once_frozen as scenarios

pytestmark = [pytest.mark.timeout(240)]


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
@pytest.mark.parametrize("role", scenarios.ROLES)
def test_exactly_once_with_a_broker_frozen_mid_publish(role: str, occ: bool) -> None:
    figures = scenarios.frozen_broker(role, occ)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent, figures


@pytest.mark.parametrize("occ", [False, True], ids=["plain", "occ"])
def test_two_overlapping_tries_of_one_exactly_once_task(occ: bool) -> None:
    figures = scenarios.overlapping_tries(occ)
    assert (figures.lost, figures.duplicated) == (0, 0), figures
    assert figures.in_stream == figures.sent, figures
