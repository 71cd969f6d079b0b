"""The link kinds the fault campaign draws (``campaign.LINK_KINDS``, ``tests/netfaults.py``) do what
they say: UDP datagrams sent both ways across a struck link, counted at each end. Skipped where
namespaces cannot be made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netfaults import Link, link, link_unavailable
from tests.udp_burst import COUNT, exchange, kind_holds

from .campaign import LINK_KINDS, strike_link

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def made() -> Iterator[Link]:
    why = link_unavailable()
    if why is not None:
        pytest.skip(why)
    with link() as made:
        yield made


def _exchange(made: Link, tmp: Path, port: int) -> tuple[int, int]:
    """Datagrams that got in (to the namespace) and out (from it), of COUNT each way."""
    return exchange(([], made.outside), (made.wrapper(), made.inside), port, tmp)


@pytest.mark.parametrize("kind", LINK_KINDS)
def test_a_link_kind_does_what_it_says(made: Link, tmp_path: Path, kind: str) -> None:
    port = 20000 + LINK_KINDS.index(kind)
    strike_link(made, kind)
    try:
        got_in, got_out = _exchange(made, tmp_path, port)
    finally:
        made.heal()
    assert kind_holds(kind, got_in, got_out), f"{kind}: {got_in} of {COUNT} got in, {got_out} got out"
    # Healed: everything passes again.
    assert _exchange(made, tmp_path, port + 100) == (COUNT, COUNT)
