"""UDP bursts across a struck link, counted at each end: what the link-kind tests
(``tests/reliability/test_link_kinds.py``, ``test_fabric.py``) hold each kind to.

Each end is a process of its own, run through a wrapper (``ip netns exec ...``, or none on the
host): it binds its address, sends :data:`COUNT` datagrams of :data:`SIZE` bytes to the other end
once both are ready, and prints how many of the other end's arrived (waiting :data:`QUIET` s
after the last one)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from itertools import count
from pathlib import Path

#: Datagrams each side sends, and their size (a burst far over the lossy kind's 6 KB queue).
COUNT, SIZE = 50, 1400
#: How long a side waits for datagrams that may never come (a struck direction: nothing arrives
#: however long it waits, as the qdisc drops them, not delays them).
QUIET = 3.0
#: How long an end may take to start, and both to finish (a loaded machine).
START_WITHIN, END_WITHIN = 60.0, 60.0

# One end: bind its address, send COUNT datagrams to the other end, count what arrives, print it.
_END = """
import os, socket, sys, time
me, peer, port, ready, start, count, size, quiet = sys.argv[1:]
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind((me, int(port)))
rx.setsockopt(socket.SOL_SOCKET, 33, 4 << 20)  # SO_RCVBUFFORCE (root may pass rmem_max)
open(ready, "w").close()
while not os.path.exists(start):
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

_runs = count()


def exchange(a: tuple[Sequence[str], str], b: tuple[Sequence[str], str], port: int, tmp: Path) -> tuple[int, int]:
    """Datagrams that reached ``b`` from ``a`` and ``a`` from ``b``, of :data:`COUNT` each way.

    ``a`` and ``b`` are each an end's wrapper command (empty: on the host) and its address.
    """
    run = next(_runs)
    start = tmp / f"start-{port}-{run}"
    ends = []
    for i, ((wrapper, me), (_, peer)) in enumerate(((a, b), (b, a))):
        ready = tmp / f"ready-{port}-{run}-{i}"
        args = [me, peer, str(port), str(ready), str(start), str(COUNT), str(SIZE), str(QUIET)]
        cmd = [*wrapper, sys.executable, "-c", _END, *args]
        ends.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True), ready))
    try:
        deadline = time.monotonic() + START_WITHIN
        while not all(ready.exists() for _, ready in ends):
            assert all(p.poll() is None for p, _ in ends) and time.monotonic() < deadline, "an end did not start"
            time.sleep(0.05)
        start.touch()
        got_a, got_b = (int(p.communicate(timeout=END_WITHIN)[0]) for p, _ in ends)
        return got_b, got_a
    finally:
        for p, _ in ends:
            p.kill()
            p.wait()


def kind_holds(kind: str, there: int, back: int) -> bool:
    """Whether ``there`` datagrams reaching the struck side and ``back`` coming from it are what a
    link struck as ``kind`` lets through (``cut-in`` drops what goes to the struck side)."""
    return {
        "cut": there == 0 and back == 0,
        "cut-in": there == 0 and back == COUNT,
        "cut-out": there == COUNT and back == 0,
        "slow": there > 0 and back > 0,  # 256 kbit/s with 5 s of queue: a burst mostly waits
        "lossy": 0 < there < COUNT and 0 < back < COUNT,  # the burst over the queue is dropped
    }[kind]
