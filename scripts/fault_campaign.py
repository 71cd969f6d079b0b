"""The long run of the randomized fault campaign (issue 36; tests/reliability/campaign.py).

Runs N schedules drawn from consecutive seeds (or the seeds given), each on a fresh dev cluster
(three brokers over a three-node NATS cluster of real nats-server processes), or against an
external cluster; prints a line per run as it ends, then a table of runs, faults and violations.
Exit status 1 when any run broke an invariant.

    python scripts/fault_campaign.py --runs 300 --base-seed 1000 --out campaign.jsonl
    python scripts/fault_campaign.py --seed 36004              # one run again, from its seed
    python scripts/fault_campaign.py --link-faults --runs 50   # also strike the client's link (root)
    python scripts/fault_campaign.py --link-faults --link-kinds cut --targets client-link  # as before the kinds
    python scripts/fault_campaign.py --broker-cuts --runs 50   # also cut a leader off (a minority leader)
    python scripts/fault_campaign.py --broker-cuts --link-kinds cut,cut-in,cut-out,slow,lossy  # every kind
    python scripts/fault_campaign.py --brokers h1:9292,h2:9292,h3:9292 --nats nats://h1:4222 \\
        --freeze-cmd 'docker pause lb-{index}' --thaw-cmd 'docker unpause lb-{index}' \\
        --kill-cmd 'docker kill lb-{index}' --start-cmd 'docker start lb-{index}'
    python scripts/fault_campaign.py --brokers ... --link-faults --broker-cuts \\
        --cut-cmd 'python -m tests.netfabric strike lbf {target} {kind} {index}' \\
        --heal-cmd 'python -m tests.netfabric heal lbf'   # an external cluster's links (docs/reliability.md)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_provider_liftbridge.client import LiftbridgeClient  # noqa: E402
from tests.netfaults import link_unavailable  # noqa: E402
from tests.reliability.campaign import (  # noqa: E402
    BROKER_CUT_TARGETS,
    EXTRA_PATHS,
    LINK_KINDS,
    LINK_TARGETS,
    METADATA_READY_WITHIN,
    PATHS,
    TARGETS,
    DevRig,
    ExternalRig,
    Verdict,
    draw,
    run,
)
from tests.reliability.freezing import ExternalFreezable, find_broker, match_brokers  # noqa: E402


def _args(argv: Sequence[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=20, help="runs, from --base-seed on (default 20)")
    p.add_argument("--base-seed", type=int, default=int(time.time()), help="first seed (default: the time)")
    p.add_argument("--seed", type=int, action="append", help="run exactly this seed (repeatable)")
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"paths to draw from (default {','.join(PATHS)}; also {','.join(EXTRA_PATHS)})",
    )
    p.add_argument("--targets", default="", help=f"targets to draw from (default: all the cluster allows; {TARGETS})")
    p.add_argument(
        "--link-faults",
        action="store_true",
        help=f"draw link faults too ({','.join(LINK_TARGETS)}): the dev cluster runs in a network namespace (needs"
        " root, ip and tc, else the campaign runs without them and says why); an external one is struck by --cut-cmd",
    )
    p.add_argument(
        "--link-kinds",
        help=f"with --link-faults: what a link fault does, drawn from these (default {','.join(LINK_KINDS)});"
        " the link seeds drawn before the kinds existed are those of --link-kinds cut. With --broker-cuts,"
        " also what a broker cut does (default: cut only, as before the kinds)",
    )
    p.add_argument(
        "--broker-cuts",
        action="store_true",
        help=f"also cut the partition leader off while the client still reaches it "
        f"({','.join(BROKER_CUT_TARGETS)}: from NATS and so from its peers, or from its peers only; on the dev "
        "cluster the dev server's fault hooks, total cuts, no namespaces needed; on an external one --cut-cmd, "
        "every --link-kinds)",
    )
    p.add_argument(
        "--cut-cmd",
        default=env("LIFTBRIDGE_TEST_CUT_CMD", ""),
        help="external cluster, with --link-faults/--broker-cuts: strike a link (template: {target}, {kind} and the "
        "partition leader's placeholders)",
    )
    p.add_argument("--heal-cmd", default=env("LIFTBRIDGE_TEST_HEAL_CMD", ""), help="heal what --cut-cmd struck")
    p.add_argument("--out", type=Path, help="also write each run as a JSON line to this file")
    p.add_argument("--brokers", default=env("LIFTBRIDGE_TEST_BROKERS", ""), help="an external cluster's brokers")
    p.add_argument("--nats", default=env("LIFTBRIDGE_TEST_NATS", ""), help="its NATS servers (comma-separated)")
    p.add_argument("--freeze-cmd", default=env("LIFTBRIDGE_TEST_FREEZE_CMD", ""), help="stop a broker (template)")
    p.add_argument("--thaw-cmd", default=env("LIFTBRIDGE_TEST_THAW_CMD", ""), help="continue a stopped broker")
    p.add_argument("--kill-cmd", default=env("LIFTBRIDGE_TEST_KILL_CMD", ""), help="kill a broker (template)")
    p.add_argument("--start-cmd", default=env("LIFTBRIDGE_TEST_START_CMD", ""), help="start a killed broker")
    p.add_argument("--metadata-leader", default=env("LIFTBRIDGE_TEST_METADATA_LEADER", ""), help="index, id or address")
    p.add_argument(
        "--metadata-leader-cmd",
        default=env("LIFTBRIDGE_TEST_METADATA_LEADER_CMD", ""),
        help="a shell command printing the metadata leader (index, id or address), run before each strike of it",
    )
    p.add_argument(
        "--ready-within",
        type=float,
        default=METADATA_READY_WITHIN,
        help="external cluster: how long each run waits for the cluster to create a probe stream and"
        " acknowledge one record published to it with ack ALL, and tries --metadata-leader-cmd again while it"
        " fails, before the run is not judged"
        f" (default {METADATA_READY_WITHIN:g} s)",
    )
    return p.parse_args(argv)


def _rigs(args: argparse.Namespace) -> tuple[Any, tuple[str, ...], tuple[str, ...]]:
    """A factory of rigs, and the targets and actions they allow."""
    if not args.brokers:
        why = link_unavailable() if args.link_faults else None
        if why is not None:
            print(f"fault_campaign: no link faults in this campaign: {why}", file=sys.stderr, flush=True)
        cuts = BROKER_CUT_TARGETS if args.broker_cuts else ()
        if args.link_faults and why is None:
            return (lambda: DevRig(link_faults=True)), (*TARGETS, *LINK_TARGETS, *cuts), ("kill", "stop")
        return DevRig, (*TARGETS, *cuts), ("kill", "stop")
    links = (*(LINK_TARGETS if args.link_faults else ()), *(BROKER_CUT_TARGETS if args.broker_cuts else ()))
    if links and not (args.cut_cmd and args.heal_cmd):
        sys.exit("--link-faults and --broker-cuts on an external cluster need --cut-cmd and --heal-cmd")
    if not (args.freeze_cmd and args.thaw_cmd):
        sys.exit("an external cluster needs --freeze-cmd and --thaw-cmd (and --kill-cmd, --start-cmd for kills)")
    addresses = [a.strip() for a in args.brokers.split(",")]
    with LiftbridgeClient(addresses, timeout=5.0) as client:
        brokers = match_brokers(addresses, client.fetch_metadata().brokers)
    leader = find_broker(args.metadata_leader, brokers) if args.metadata_leader else None
    cluster = ExternalFreezable(
        brokers, args.freeze_cmd, args.thaw_cmd, leader, args.metadata_leader_cmd, leader_within=args.ready_within
    )
    nats = [u for u in args.nats.split(",") if u]
    rig = ExternalRig(
        cluster,
        nats,
        args.kill_cmd,
        args.start_cmd,
        cut_cmd=args.cut_cmd,
        heal_cmd=args.heal_cmd,
        link_targets=links,
        metadata_within=args.ready_within,
    )
    return (lambda: rig), rig.targets(), rig.actions()


def _verdicts(args: argparse.Namespace) -> Iterator[Verdict]:
    make_rig, targets, actions = _rigs(args)
    if args.targets:
        targets = tuple(t for t in args.targets.split(",") if t)
    kinds = _link_kinds(args.link_kinds)
    seeds = args.seed or range(args.base_seed, args.base_seed + args.runs)
    for seed in seeds:
        schedule = draw(
            seed,
            paths=args.paths.split(","),
            targets=targets,
            actions=actions,
            link_kinds=kinds or LINK_KINDS,
            broker_kinds=kinds or LINK_KINDS[:1],
        )
        rig: AbstractContextManager[Any] = make_rig()
        with rig as ready:
            yield run(schedule, ready)


def _link_kinds(given: str | None) -> tuple[str, ...]:
    """The kinds ``--link-kinds`` names (empty when not given: each target's default then).

    A broker cut's kind is drawn only when they are given, so that the broker-cut seeds run before
    the kinds keep their schedules (a client link's are drawn from every kind by default)."""
    if given is None:
        return ()
    kinds = tuple(k for k in given.split(",") if k)
    unknown = set(kinds) - set(LINK_KINDS)
    if unknown or not kinds:
        sys.exit(f"--link-kinds: unknown {sorted(unknown) or 'none given'}; choose from {','.join(LINK_KINDS)}")
    return kinds


def _table(title: str, rows: dict[str, list[Verdict]]) -> None:
    print(f"\n{title:<28} {'runs':>5} {'returned':>9} {'raised':>7} {'unsettled':>10} {'violations':>11}")
    for key in sorted(rows):
        vs = rows[key]
        returned = sum(v.outcome.startswith("returned") for v in vs)
        unsettled = sum(bool(v.unsettled) for v in vs)
        bad = sum(bool(v.violations) for v in vs)
        print(f"{key:<28} {len(vs):>5} {returned:>9} {len(vs) - returned - unsettled:>7} {unsettled:>10} {bad:>11}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _args(argv)
    logging.basicConfig(level=logging.ERROR)
    started = time.monotonic()
    done: list[Verdict] = []
    out = args.out.open("a") if args.out else None
    try:
        for v in _verdicts(args):
            done.append(v)
            mark = "VIOLATION" if v.violations else "unsettled" if v.unsettled else "ok"
            print(f"{len(done):>4} {mark:<9} {v.seconds:5.1f}s {v.schedule} | {v.struck} | {v.outcome}", flush=True)
            for violation in v.violations:
                print(f"          - {violation}", flush=True)
            if v.unsettled:
                print(f"          - not judged: {v.unsettled}", flush=True)
            if out is not None:
                record = {**vars(v.schedule), "outcome": v.outcome, "struck": v.struck, "unsettled": v.unsettled}
                out.write(json.dumps(record | {"violations": v.violations, "seconds": round(v.seconds, 1)}) + "\n")
                out.flush()
    finally:
        if out is not None:
            out.close()
    by: dict[str, dict[str, list[Verdict]]] = defaultdict(lambda: defaultdict(list))
    for v in done:
        s = v.schedule
        by["path"][s.path].append(v)
        by["fault"][f"{s.action} {s.target}"].append(v)
        by["moment"][s.moment].append(v)
    for title in ("path", "fault", "moment"):
        _table(title, by[title])
    bad = [v for v in done if v.violations]
    unsettled = [v for v in done if v.unsettled]
    minutes = (time.monotonic() - started) / 60
    print(f"\n{len(done)} runs, {len(bad)} with violations, {len(unsettled)} not judged, {minutes:.1f} min")
    for v in bad:
        print(f"  seed {v.schedule.seed}: {v.violations}")
    for v in unsettled:
        print(f"  not judged: {v.unsettled}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
