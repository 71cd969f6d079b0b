"""A network fabric for a cluster of separate processes: each endpoint (a NATS node, a broker, the
client) in a network namespace of its own, all joined by veth pairs to one bridge in a hub
namespace, so that a silent fault can strike the traffic between any two endpoints, one way or
both, and leave the rest alone (issue 59; :mod:`tests.netfaults` has the single-link
:class:`~tests.netfaults.Link` the dev-cluster tests use).

Layout: the hub namespace ``<name>-hub`` holds a bridge; endpoint ``k`` has the address
``10.233.X.(k+1)/24`` on its end of a pair (one subnet per fabric, ``X`` free when it was made) and
runs in the namespace ``<name>-<endpoint>``; the endpoint named ``here`` (the test's client) stays in
this namespace, so the test's own process reaches every endpoint through the fabric. Programs run in
an endpoint with :meth:`Fabric.wrapper` (``ip netns exec ...``) and listen on its address (a port
per endpoint: each has its own port space).

A fault is an ``htb`` root qdisc on the hub's port towards the endpoint that receives, whose
``u32`` filter sends the packets of one source address to a class with the fault's queue (no
``prio`` here): ``pfifo
limit 0`` drops them (a cut: silent, nothing is reset), ``tbf`` delays them (slow) or drops what
exceeds a shallow queue (lossy) as :class:`~tests.netfaults.Link` does; this kernel has no
``netem``. Only IP packets are matched, so ARP still passes and a one-way cut stays one way. A
healed fault removes the qdiscs.

:data:`TARGETS` are the fault campaign's link targets on a fabric of the endpoints ``client``,
``nats0``.., ``broker0``.. (broker ``i`` connected to NATS node ``i``): :func:`target_pairs`.

The fabric is described in a state file (``/run/netfabric/<name>.json``), so a command line
(``python -m tests.netfabric``: ``up``, ``addr``, ``strike``, ``cut``, ``heal``, ``down``) can
strike it from any process, e.g. from the fault campaign's ``--cut-cmd`` against an external
cluster. Needs root and ``ip``/``tc`` (:func:`tests.netfaults.link_unavailable` says why not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KINDS", "TARGETS", "Fabric", "target_pairs"]

#: Where fabrics are described, one JSON file each.
STATE_DIR = Path(os.environ.get("NETFABRIC_STATE_DIR", "/run/netfabric"))
#: What a fault does, as the campaign's ``LINK_KINDS``: ``cut`` both ways; ``cut-in`` drops what the
#: first endpoint of a pair sends to the second, ``cut-out`` the other way; ``slow`` and ``lossy``
#: both ways.
KINDS = ("cut", "cut-in", "cut-out", "slow", "lossy")
#: The band's queue of each kind (as ``campaign.strike_link`` gives a :class:`~tests.netfaults.Link`).
_QUEUES = {
    "cut": ["pfifo", "limit", "0"],
    "slow": ["tbf", "rate", "256kbit", "burst", "1600", "latency", "5s"],
    "lossy": ["tbf", "rate", "1mbit", "burst", "3000", "limit", "6000"],
}
#: The campaign's link targets on a fabric of ``client``, ``nats<i>`` and ``broker<i>`` endpoints.
TARGETS = ("client-link", "broker-nats", "broker-peers")


def target_pairs(target: str, index: int, endpoints: Sequence[str]) -> list[tuple[str, str]]:
    """The endpoint pairs a campaign ``target`` strikes, the first of each pair on the side a
    one-way ``cut-in`` silences: ``client-link``, the client and every other endpoint;
    ``broker-nats``, broker ``index`` and its NATS node ``nats<index>``; ``broker-peers``, NATS node
    ``index`` and every other NATS node (its cluster routes: Liftbridge's brokers talk to each other
    only through NATS, so broker ``index`` on that node is cut off from its peers, and clients of
    the node still reach it).

    :raises ValueError: an unknown target, or an endpoint it needs is not in ``endpoints``.
    """
    if target == "client-link":
        pairs = [("client", e) for e in endpoints if e != "client"]
    elif target == "broker-nats":
        pairs = [(f"broker{index}", f"nats{index}")]
    elif target == "broker-peers":
        pairs = [(f"nats{index}", e) for e in endpoints if e.startswith("nats") and e != f"nats{index}"]
    else:
        raise ValueError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    missing = sorted({e for pair in pairs for e in pair} - set(endpoints)) or ([] if pairs else [target])
    if missing:
        raise ValueError(
            f"target {target!r} (index {index}) needs the endpoints {missing}, which the fabric lacks "
            f"(it has {', '.join(endpoints)}; name them client, nats0.., broker0..)"
        )
    return pairs


def _run(*args: str, stdin: str | None = None) -> None:
    done = subprocess.run(list(args), input=stdin, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} exited with {done.returncode}: {done.stderr.strip()}")


def _free_subnet() -> int:
    """An ``X`` whose ``10.233.X.0/24`` no interface here and no described fabric uses."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    taken = {json.loads(p.read_text())["subnet"] for p in STATE_DIR.glob("*.json")} if STATE_DIR.is_dir() else set()
    for x in range(1, 255):
        if f" 10.233.{x}." not in used and x not in taken:
            return x
    raise RuntimeError("every 10.233.X.0/24 subnet is taken; remove stale fabrics (python -m tests.netfabric down)")


@dataclass(frozen=True)
class Fabric:
    """A fabric described by its state file (see the module docstring); :meth:`make` builds one,
    :meth:`load` finds one built before (by another process too)."""

    name: str
    subnet: int
    endpoints: tuple[str, ...]
    here: str | None

    @property
    def hub(self) -> str:
        return f"{self.name}-hub"

    def address(self, endpoint: str) -> str:
        """The endpoint's address.

        :raises ValueError: no such endpoint."""
        return f"10.233.{self.subnet}.{self._index(endpoint) + 1}"

    def namespace(self, endpoint: str) -> str | None:
        """The endpoint's namespace (``None``: this one)."""
        return None if endpoint == self.here else f"{self.name}-{endpoint}"

    def wrapper(self, endpoint: str) -> list[str]:
        """The command prefix that runs a program in the endpoint's namespace."""
        ns = self.namespace(endpoint)
        return ["ip", "netns", "exec", ns] if ns else []

    def _index(self, endpoint: str) -> int:
        if endpoint not in self.endpoints:
            raise ValueError(f"fabric {self.name!r} has no endpoint {endpoint!r} (it has {', '.join(self.endpoints)})")
        return self.endpoints.index(endpoint)

    def _port(self, endpoint: str) -> str:
        """The hub's port towards the endpoint (device names are at most 15 characters)."""
        return f"{self.name[:8]}h{self._index(endpoint)}"

    @classmethod
    def make(cls, name: str, endpoints: Sequence[str], here: str | None = None) -> Fabric:
        """Build a fabric and describe it in its state file.

        :raises ValueError: a bad name or endpoint list. :raises RuntimeError: an ``ip`` command
            failed (what was made is removed again) or a fabric of that name exists.
        """
        if not name.isalnum() or len(name) > 8:
            raise ValueError(f"a fabric name is 1-8 letters or digits (got {name!r}): it becomes device names")
        if len(set(endpoints)) != len(endpoints) or not endpoints or len(endpoints) > 250:
            raise ValueError(f"the endpoints must be 1-250 distinct names (got {list(endpoints)})")
        if here is not None and here not in endpoints:
            raise ValueError(f"here={here!r} is not one of the endpoints {list(endpoints)}")
        if (STATE_DIR / f"{name}.json").exists():
            raise RuntimeError(f"a fabric {name!r} exists; remove it first (python -m tests.netfabric down {name})")
        fabric = cls(name, _free_subnet(), tuple(endpoints), here)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        fabric._save()
        try:
            _run("ip", "netns", "add", fabric.hub)
            _run("ip", "-n", fabric.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", fabric.hub, "link", "set", "br0", "up")
            for endpoint in endpoints:
                fabric._attach(endpoint)
        except BaseException:
            fabric.remove()
            raise
        return fabric

    def _attach(self, endpoint: str) -> None:
        port, ns = self._port(endpoint), self.namespace(endpoint)
        leaf = f"{self.name[:8]}e{self._index(endpoint)}"
        if ns:
            _run("ip", "netns", "add", ns)
        _run("ip", "-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", leaf)
        _run("ip", "-n", self.hub, "link", "set", leaf, "netns", ns or str(os.getpid()))
        _run("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
        where = ["-n", ns] if ns else []
        if ns:
            _run("ip", *where, "link", "set", "lo", "up")
        _run("ip", *where, "addr", "add", f"{self.address(endpoint)}/24", "dev", leaf)
        _run("ip", *where, "link", "set", leaf, "up")

    def _save(self) -> None:
        state = {"name": self.name, "subnet": self.subnet, "endpoints": list(self.endpoints), "here": self.here}
        (STATE_DIR / f"{self.name}.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, name: str) -> Fabric:
        """The fabric ``name`` as its state file describes it.

        :raises LookupError: no fabric of that name was made (or it was removed)."""
        path = STATE_DIR / f"{name}.json"
        if not path.exists():
            raise LookupError(f"no fabric {name!r} (no {path}); make it with: python -m tests.netfabric up {name} ...")
        s = json.loads(path.read_text())
        return cls(s["name"], s["subnet"], tuple(s["endpoints"]), s["here"])

    def strike(self, pairs: Iterable[tuple[str, str]], kind: str) -> None:
        """Strike the traffic between each pair as ``kind`` says (:data:`KINDS`), replacing any
        fault struck before.

        :raises ValueError: an unknown kind or endpoint. :raises RuntimeError: ``tc`` failed.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
        senders: dict[str, list[str]] = {}  # receiving endpoint -> the sources dropped on its way
        for a, b in pairs:
            ways = {"cut-in": [(a, b)], "cut-out": [(b, a)]}.get(kind, [(a, b), (b, a)])
            for src, dst in ways:
                senders.setdefault(dst, []).append(self.address(src))
        queue = " ".join(_QUEUES.get(kind, _QUEUES["cut"]))
        self.heal()
        lines = []
        for dst, sources in senders.items():
            dev = self._port(dst)
            lines += [
                f"qdisc add dev {dev} root handle 1: htb default 1",
                f"class add dev {dev} parent 1: classid 1:1 htb rate 10gbit quantum 60000",
                f"class add dev {dev} parent 1: classid 1:2 htb rate 10gbit quantum 60000",
                f"qdisc add dev {dev} parent 1:2 handle 20: {queue}",
            ]
            lines += [
                f"filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip src {s}/32 flowid 1:2" for s in sources
            ]
        _run("tc", "-n", self.hub, "-batch", "-", stdin="\n".join(lines) + "\n")

    def heal(self) -> None:
        """Let every packet through again (remove every fault's qdiscs)."""
        lines = [f"qdisc del dev {self._port(e)} root" for e in self.endpoints]
        subprocess.run(
            ["tc", "-force", "-n", self.hub, "-batch", "-"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
        )

    def running(self) -> dict[str, list[int]]:
        """The pids of the processes in each endpoint's namespace (the endpoint ``here`` omitted)."""
        out = {}
        for e in self.endpoints:
            ns = self.namespace(e)
            if ns:
                done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
                out[e] = [int(p) for p in done.stdout.split()]
        return out

    def remove(self) -> None:
        """Remove the namespaces, the pairs and the state file. Idempotent. Stop the processes in
        the namespaces first: one keeps its namespace alive but unreachable."""
        for e in self.endpoints:
            ns = self.namespace(e)
            if ns:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            else:
                subprocess.run(["ip", "link", "del", f"{self.name[:8]}e{self._index(e)}"], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.hub], capture_output=True)
        (STATE_DIR / f"{self.name}.json").unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``python -m tests.netfabric --help``)."""
    p = argparse.ArgumentParser(prog="python -m tests.netfabric", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build a fabric; prints each endpoint's address as JSON")
    up.add_argument("name")
    up.add_argument("endpoints", nargs="+")
    up.add_argument("--here", help="the endpoint that stays in this namespace (the client)")
    addr = sub.add_parser("addr", help="print an endpoint's address")
    addr.add_argument("name")
    addr.add_argument("endpoint")
    strike = sub.add_parser("strike", help=f"strike a campaign target ({', '.join(TARGETS)}) as KIND")
    strike.add_argument("name")
    strike.add_argument("target", choices=TARGETS)
    strike.add_argument("kind", choices=KINDS)
    strike.add_argument("index", type=int, help="the broker (broker-nats) or NATS node (broker-peers)")
    cut = sub.add_parser("cut", help="strike endpoint pairs A:B as KIND (cut-in drops what A sends B)")
    cut.add_argument("name")
    cut.add_argument("kind", choices=KINDS)
    cut.add_argument("pairs", nargs="+")
    for name in ("heal", "down"):
        sub.add_parser(name, help={"heal": "remove every fault", "down": "remove the fabric"}[name]).add_argument(
            "name"
        )
    args = p.parse_args(argv)
    try:
        if args.command == "up":
            fabric = Fabric.make(args.name, args.endpoints, args.here)
            print(json.dumps({e: fabric.address(e) for e in fabric.endpoints}))
            return 0
        fabric = Fabric.load(args.name)
        if args.command == "addr":
            print(fabric.address(args.endpoint))
        elif args.command == "strike":
            fabric.strike(target_pairs(args.target, args.index, fabric.endpoints), args.kind)
        elif args.command == "cut":
            bad = [pair for pair in args.pairs if pair.count(":") != 1]
            if bad:
                p.error(f"a pair is A:B, two endpoints (got {bad})")
            fabric.strike([tuple(pair.split(":")) for pair in args.pairs], args.kind)  # type: ignore[misc]
        elif args.command == "heal":
            fabric.heal()
        else:
            alive = {e: pids for e, pids in fabric.running().items() if pids}
            if alive:
                print(f"netfabric: processes still run in {alive}; stop them first", file=sys.stderr)
                return 1
            fabric.remove()
    except (ValueError, LookupError, RuntimeError) as exc:
        print(f"netfabric: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
