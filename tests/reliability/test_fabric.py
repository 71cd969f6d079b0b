"""The fabric the fault campaign strikes an external cluster's links in (``tests/netfabric.py``):
each kind strikes the pair it names and only that pair, in the direction it names, and each
campaign target strikes the endpoints it says. UDP datagrams sent both ways between two endpoints,
counted at each end. Skipped where namespaces cannot be made."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import netfabric
from tests.netfabric import KINDS, Fabric, target_pairs
from tests.netfaults import link_unavailable

pytestmark = pytest.mark.timeout(180)

#: Datagrams each side sends, and their size (a burst far over the lossy kind's 6 KB queue).
COUNT, SIZE = 50, 1400
#: How long a side waits for datagrams that may never come (a struck direction: nothing arrives
#: however long it waits, as the qdisc drops them, not delays them).
QUIET = 3.0

# One end: bind its address, send COUNT datagrams to the other end, count what arrives, print it.
_END = """
import socket, sys, time
me, peer, port, ready, start, count, size, quiet = sys.argv[1:]
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind((me, int(port)))
rx.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)  # SO_RCVBUFFORCE
open(ready, "w").close()
while not __import__("os").path.exists(start):
    time.sleep(0.01)
for _ in range(int(count)):
    try:
        rx.sendto(b"x" * int(size), (peer, int(port)))
    except OSError:
        pass  # a dropping qdisc may refuse the datagram at once
got, last = 0, time.monotonic()
rx.settimeout(0.2)
while got < int(count) and time.monotonic() - last < float(quiet):
    try:
        rx.recv(65536)
    except TimeoutError:
        continue
    got, last = got + 1, time.monotonic()
print(got)
"""

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
    port = next(_ports)
    start = tmp / f"start-{port}"
    ends = []
    for me, peer in ((a, b), (b, a)):
        ready = tmp / f"ready-{port}-{me}"
        args = [fabric.address(me), fabric.address(peer), str(port), str(ready), str(start)]
        args += [str(COUNT), str(SIZE), str(QUIET)]
        cmd = [*fabric.wrapper(me), sys.executable, "-c", _END, *args]
        ends.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True), ready))
    try:
        deadline = time.monotonic() + 60
        while not all(ready.exists() for _, ready in ends):
            assert all(p.poll() is None for p, _ in ends) and time.monotonic() < deadline, "an end did not start"
            time.sleep(0.05)
        start.touch()
        got_a, got_b = (int(p.communicate(timeout=60)[0]) for p, _ in ends)
        return got_b, got_a
    finally:
        for p, _ in ends:
            p.kill()
            p.wait()


@pytest.mark.parametrize("kind", KINDS)
def test_a_kind_strikes_its_pair_only_and_in_its_direction(fabric: Fabric, tmp_path: Path, kind: str) -> None:
    fabric.strike([("client", "broker0")], kind)
    try:
        to_broker, to_client = _exchange(fabric, "client", "broker0", tmp_path)
        beside = _exchange(fabric, "nats0", "broker0", tmp_path)
    finally:
        fabric.heal()
    expected = {
        "cut": lambda i, o: i == 0 and o == 0,
        "cut-in": lambda i, o: i == 0 and o == COUNT,
        "cut-out": lambda i, o: i == COUNT and o == 0,
        "slow": lambda i, o: i > 0 and o > 0,  # 256 kbit/s with 5 s of queue: a burst mostly waits
        "lossy": lambda i, o: 0 < i < COUNT and 0 < o < COUNT,  # the burst over the queue is dropped
    }[kind]
    assert expected(to_broker, to_client), f"{kind}: {to_broker} of {COUNT} reached broker0, {to_client} the client"
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
