"""The link kinds the fault campaign draws (``campaign.LINK_KINDS``, ``tests/netfaults.py``) do what
they say: UDP datagrams sent both ways across a struck link, counted at each end. Skipped where
namespaces cannot be made."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netfaults import Link, link, link_unavailable

from .campaign import LINK_KINDS, strike_link

pytestmark = pytest.mark.timeout(120)

#: Datagrams each side sends, and their size (a burst far over the lossy link's 6 KB queue).
COUNT, SIZE = 50, 1400
#: Receive buffers that hold every datagram sent (root may set them past ``rmem_max``).
RCVBUF = 4 << 20
_SO_RCVBUFFORCE = 33  # Linux; not in Python's socket module
#: How long a side waits for datagrams that may never come (a struck direction: nothing arrives
#: however long it waits, as the qdisc drops them, not delays them).
QUIET = 3.0

# Inside the namespace: count datagrams on its address, send COUNT to the outer side, write the count.
_INSIDE = """
import socket, sys, time
inside, outside, port, out, count, size, quiet = sys.argv[1:]
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind((inside, int(port)))
rx.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)  # SO_RCVBUFFORCE
open(out + ".ready", "w").close()
for _ in range(int(count)):
    try:
        rx.sendto(b"o" * int(size), (outside, int(port)))
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
open(out, "w").write(str(got))
"""


@pytest.fixture(scope="module")
def made() -> Iterator[Link]:
    why = link_unavailable()
    if why is not None:
        pytest.skip(why)
    with link() as made:
        yield made


def _exchange(made: Link, tmp: Path, port: int) -> tuple[int, int]:
    """Datagrams that got in (to the namespace) and out (from it), of COUNT each way."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind((made.outside, port))
    rx.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, RCVBUF)
    rx.settimeout(0.2)
    out = tmp / f"count-{port}"
    args = [made.inside, made.outside, str(port), str(out), str(COUNT), str(SIZE), str(QUIET)]
    inside = subprocess.Popen([*made.wrapper(), sys.executable, "-c", _INSIDE, *args])
    try:
        deadline = time.monotonic() + 30
        while not Path(f"{out}.ready").exists():
            assert inside.poll() is None and time.monotonic() < deadline, "the inside end did not start"
            time.sleep(0.05)
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(COUNT):
            try:
                tx.sendto(b"i" * SIZE, (made.inside, port))
            except OSError:
                pass
        tx.close()
        got, last = 0, time.monotonic()
        while got < COUNT and time.monotonic() - last < QUIET:
            try:
                rx.recv(65536)
            except TimeoutError:
                continue
            got, last = got + 1, time.monotonic()
        assert inside.wait(60) == 0
        return int(out.read_text()), got
    finally:
        inside.kill()
        inside.wait()
        rx.close()


@pytest.mark.parametrize("kind", LINK_KINDS)
def test_a_link_kind_does_what_it_says(made: Link, tmp_path: Path, kind: str) -> None:
    port = 20000 + LINK_KINDS.index(kind)
    strike_link(made, kind)
    try:
        got_in, got_out = _exchange(made, tmp_path, port)
    finally:
        made.heal()
    expected = {
        "cut": lambda i, o: i == 0 and o == 0,
        "cut-in": lambda i, o: i == 0 and o == COUNT,
        "cut-out": lambda i, o: i == COUNT and o == 0,
        "slow": lambda i, o: i > 0 and o > 0,  # 256 kbit/s with 5 s of queue: a burst mostly waits
        "lossy": lambda i, o: 0 < i < COUNT and 0 < o < COUNT,  # the burst over the queue is dropped
    }[kind]
    assert expected(got_in, got_out), f"{kind}: {got_in} of {COUNT} got in, {got_out} got out"
    # Healed: everything passes again.
    assert _exchange(made, tmp_path, port + 100) == (COUNT, COUNT)
