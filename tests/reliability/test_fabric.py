"""The fabric the fault campaign strikes an external cluster's links in (``tests/netfabric.py``):
each kind strikes the pair it names and only that pair, in the direction it names, and each
campaign target strikes the endpoints it says. UDP datagrams sent both ways between two endpoints,
counted at each end. Skipped where namespaces cannot be made."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netfabric
from tests.netfabric import KINDS, Fabric, target_pairs
from tests.netfaults import link_unavailable
from tests.udp_burst import COUNT, exchange, kind_holds

pytestmark = pytest.mark.timeout(180)

_ports = iter(range(21000, 22000))


@pytest.fixture(scope="module")
def fabric(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fabric]:
    why = link_unavailable()
    if why is not None:
        pytest.skip(why)
    state = netfabric.STATE_DIR
    netfabric.STATE_DIR = tmp_path_factory.mktemp("netfabric")  # not the machine's /run/netfabric
    made = Fabric.make("tfab", ["client", "nats0", "nats1", "broker0"], here="client")
    try:
        yield made
    finally:
        made.heal()
        made.remove()
        netfabric.STATE_DIR = state


def _exchange(fabric: Fabric, a: str, b: str, tmp: Path) -> tuple[int, int]:
    """Datagrams that reached ``b`` from ``a`` and ``a`` from ``b``, of COUNT each way."""
    ends = [(fabric.wrapper(end), fabric.address(end)) for end in (a, b)]
    return exchange(ends[0], ends[1], next(_ports), tmp)


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_strikes_its_pair_only_and_in_its_direction(fabric: Fabric, tmp_path: Path, kind: str) -> None:
    fabric.strike([("client", "broker0")], kind)
    try:
        to_broker, to_client = _exchange(fabric, "client", "broker0", tmp_path)
        beside = _exchange(fabric, "nats0", "broker0", tmp_path)
    finally:
        fabric.heal()
    assert kind_holds(kind, to_broker, to_client), (
        f"{kind}: {to_broker} of {COUNT} reached broker0, {to_client} the client"
    )
    assert beside == (COUNT, COUNT), f"{kind} on client-broker0 also struck nats0-broker0: {beside}"
    assert _exchange(fabric, "client", "broker0", tmp_path) == (COUNT, COUNT), "not healed"


@pytest.mark.parametrize(
    ("target", "struck", "spared"),
    [
        ("client-link", [("client", "nats1"), ("client", "broker0")], [("broker0", "nats1")]),
        ("broker-nats", [("broker0", "nats0")], [("client", "broker0"), ("nats0", "nats1")]),
        ("broker-peers", [("nats0", "nats1")], [("client", "nats0"), ("broker0", "nats0")]),
    ],
)
def test_a_campaign_target_cuts_its_endpoints_and_spares_the_rest(
    fabric: Fabric,
    tmp_path: Path,
    target: str,
    struck: list[tuple[str, str]],
    spared: list[tuple[str, str]],
) -> None:
    fabric.strike(target_pairs(target, 0, fabric.endpoints), "cut")
    try:
        for a, b in struck:
            assert _exchange(fabric, a, b, tmp_path) == (0, 0), f"{target}: {a}-{b} not cut"
        for a, b in spared:
            assert _exchange(fabric, a, b, tmp_path) == (COUNT, COUNT), f"{target}: {a}-{b} struck too"
    finally:
        fabric.heal()


def test_target_pairs_name_what_is_missing() -> None:
    endpoints = ("client", "nats0", "nats1", "nats2", "broker0", "broker1", "broker2")
    assert target_pairs("broker-peers", 2, endpoints) == [("nats2", "nats0"), ("nats2", "nats1")]
    assert target_pairs("broker-nats", 1, endpoints) == [("broker1", "nats1")]
    assert len(target_pairs("client-link", 0, endpoints)) == 6
    with pytest.raises(ValueError, match=r"needs the endpoints \['broker3', 'nats3'\]"):
        target_pairs("broker-nats", 3, endpoints)
    with pytest.raises(ValueError, match="unknown target 'leader'"):
        target_pairs("leader", 0, endpoints)
