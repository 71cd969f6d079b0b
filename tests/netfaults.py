"""Silent link faults for tests: a network namespace joined to the test's own by a veth pair, whose
link a test cuts (packets dropped, nothing reset, both ends up) and heals.

:class:`Link` makes the namespace and the pair: this side ``10.231.N.1``, the namespace's side
``10.231.N.2``. A server started in the namespace (:meth:`Link.wrapper` in front of its command,
e.g. :class:`~airflow_provider_liftbridge.devserver.process.DevServerProcess`'s ``wrapper``)
listens on :attr:`Link.inside` and is reached from here only through the pair, so
:meth:`Link.cut` silences every connection to it at once, in one direction or both.

A cut is a root qdisc that drops every packet on the sending side of the pair (``pfifo limit 0``:
this machine's kernel has no ``netem``; a drop at the qdisc is silent to the peer, and the local
TCP only retransmits, so the sockets stay open); :meth:`Link.hold` drops one connection's packets
only. :meth:`Link.slow` instead puts a ``tbf`` rate
limit there (a slow link: packets wait in a deep queue), and :meth:`Link.lossy` a ``tbf`` with a
shallow queue (packets over the rate and the queue are dropped: a share that grows with the load,
not a fixed share, which would need ``netem``).

Making namespaces needs root and the ``ip`` and ``tc`` commands; :func:`link_unavailable` says why
they cannot be made here (tests skip with that reason). :meth:`Link.close` removes the namespace,
which takes the pair and its qdiscs with it; :func:`link` is the context manager that always does,
and :func:`linked_devserver` the fixture of a dev server behind a link.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

from airflow_provider_liftbridge.devserver.process import DevServerProcess

__all__ = ["Direction", "Link", "link", "link_unavailable", "linked_devserver"]

#: ``"both"``, ``"in"`` (to the namespace: what this side sends) or ``"out"`` (from it).
Direction = Literal["both", "in", "out"]

_counter = itertools.count(1)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _free_subnet() -> int:
    """A third octet ``N`` whose ``10.231.N.0/30`` no interface of this namespace uses yet."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    start = (os.getpid() + next(_counter)) % 250
    for i in range(250):
        n = (start + i) % 250 + 1
        if f" 10.231.{n}." not in used:
            return n
    raise RuntimeError("every 10.231.N.0/30 subnet is taken; remove the stale lbt-* network namespaces")


def _mac(dev: str, namespace: str | None = None) -> str:
    """The MAC address of ``dev`` (in ``namespace``, else in this one)."""
    where = ["-n", namespace] if namespace else []
    out = subprocess.run(["ip", *where, "-j", "link", "show", "dev", dev], check=True, capture_output=True, text=True)
    return str(json.loads(out.stdout)[0]["address"])


def link_unavailable() -> str | None:
    """Why a :class:`Link` cannot be made on this machine, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "silent link faults need root (network namespaces, veth pairs and tc qdiscs)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"silent link faults need the {tool!r} command (iproute2), which is not installed"
    probe = f"lbt-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot make a network namespace here: {exc.stderr.strip() or exc}"
    try:
        _ip("-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1")
        done = subprocess.run(
            ["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "p0", "root", "pfifo", "limit", "0"],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            return f"cannot add a dropping qdisc (tc pfifo limit 0): {done.stderr.strip()}"
    except subprocess.CalledProcessError as exc:
        return f"cannot make a veth pair here: {exc.stderr.strip() or exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Link:
    """A network namespace and the veth pair that joins it to this one (see the module docstring).

    :raises subprocess.CalledProcessError: (on construction) the namespace or the pair could not be
        made (anything made is removed again).
    """

    def __init__(self) -> None:
        n = _free_subnet()
        self.namespace = f"lbt-{os.getpid()}-{n}"
        self.outer_dev, self.inner_dev = f"lbt{n}h{os.getpid() % 10000}", "lbtn"
        #: This side's address, and the namespace's (where its servers listen).
        self.outside, self.inside = f"10.231.{n}.1", f"10.231.{n}.2"
        _ip("netns", "add", self.namespace)
        try:
            _ip("link", "add", self.outer_dev, "type", "veth", "peer", "name", self.inner_dev, "netns", self.namespace)
            _ip("addr", "add", f"{self.outside}/30", "dev", self.outer_dev)
            _ip("link", "set", self.outer_dev, "up")
            _ip("-n", self.namespace, "addr", "add", f"{self.inside}/30", "dev", self.inner_dev)
            _ip("-n", self.namespace, "link", "set", self.inner_dev, "up")
            _ip("-n", self.namespace, "link", "set", "lo", "up")
            # Each side knows the other's MAC for good: with ARP, a cut one way also starved the
            # neighbour probes of their answers, so after some seconds the other way stopped too
            # (and a healed link waited for ARP again).
            _ip(
                "neigh",
                "replace",
                self.inside,
                "lladdr",
                _mac(self.inner_dev, self.namespace),
                "nud",
                "permanent",
                "dev",
                self.outer_dev,
            )
            _ip(
                "-n",
                self.namespace,
                "neigh",
                "replace",
                self.outside,
                "lladdr",
                _mac(self.outer_dev),
                "nud",
                "permanent",
                "dev",
                self.inner_dev,
            )
        except BaseException:
            self.close()
            raise
        self._cut: set[str] = set()

    def wrapper(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        return ["ip", "netns", "exec", self.namespace]

    def _tc(self, side: str, *args: str) -> None:
        dev = self.outer_dev if side == "in" else self.inner_dev
        prefix = [] if side == "in" else self.wrapper()
        subprocess.run(
            [*prefix, "tc", "qdisc", *args[:1], "dev", dev, "root", *args[1:]], check=True, capture_output=True
        )

    def _sides(self, direction: Direction) -> tuple[str, ...]:
        return ("in", "out") if direction == "both" else (direction,)

    def cut(self, direction: Direction = "both") -> None:
        """Drop every packet in ``direction`` from now on, silently (nothing is reset)."""
        for side in self._sides(direction):
            self._tc(side, "replace", "pfifo", "limit", "0")
            self._cut.add(side)

    def slow(self, rate: str = "8kbit", direction: Direction = "both") -> None:
        """Let packets through at ``rate`` only (``tbf``; a burst of one packet), in ``direction``."""
        for side in self._sides(direction):
            self._tc(side, "replace", "tbf", "rate", rate, "burst", "1600", "latency", "5s")
            self._cut.add(side)

    def lossy(self, rate: str = "1mbit", queue: int = 6000, direction: Direction = "both") -> None:
        """Let packets through at ``rate`` with ``queue`` bytes of queue, dropping the rest (``tbf``),
        in ``direction``: bursts lose a share of their packets, a trickle loses none."""
        for side in self._sides(direction):
            self._tc(side, "replace", "tbf", "rate", rate, "burst", "3000", "limit", str(queue))
            self._cut.add(side)

    def hold(self, port: int) -> None:
        """Drop every packet this side sends from its TCP port ``port`` (one connection of this
        side), silently, and let everything else towards the namespace through at full speed
        (an ``htb`` root whose ``u32`` filter sends that port to a dropping class).

        :raises subprocess.CalledProcessError: the kernel has no ``htb`` or ``u32`` (tests that
            hold a connection skip then).
        """
        dev = self.outer_dev
        for args in (
            ["qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "10gbit"],
            ["qdisc", "add", "dev", dev, "parent", "1:20", "pfifo", "limit", "0"],
            ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "u32"]
            + ["match", "ip", "sport", str(port), "0xffff", "flowid", "1:20"],
        ):
            subprocess.run(["tc", *args], check=True, capture_output=True)
        self._cut.add("in")

    def heal(self) -> None:
        """Let every packet through again (remove what :meth:`cut`, :meth:`slow`, :meth:`lossy` or
        :meth:`hold` added)."""
        for side in sorted(self._cut):
            with contextlib.suppress(subprocess.CalledProcessError):
                self._tc(side, "del")
        self._cut.clear()

    def close(self) -> None:
        """Remove the namespace; the pair and its qdiscs go with it. Idempotent. Kill what runs in
        the namespace first (a process there keeps it alive but unreachable)."""
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.outer_dev], capture_output=True)


@contextlib.contextmanager
def link() -> Iterator[Link]:
    """A :class:`Link`, healed and removed on the way out, whatever happened."""
    made = Link()
    try:
        yield made
    finally:
        made.heal()
        made.close()


@functools.cache
def _why_not() -> str | None:
    return link_unavailable()


@pytest.fixture
def linked_devserver(tmp_path: Path) -> Iterator[tuple[Link, DevServerProcess]]:
    """A single-broker dev server (with its nats-server) in a namespace of its own, reached only
    through a :class:`Link`; skips with the reason where links cannot be made. Healed, stopped and
    removed afterwards, whatever the test did."""
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    with link() as made:
        server = DevServerProcess(tmp_path / "linked-devserver", host=made.inside, wrapper=made.wrapper())
        try:
            server.start()
            yield made, server
        finally:
            made.heal()  # the stop waits for the ports through the link
            server.close()
