"""A/B of exactly-once publishing between two checkouts, in one run against one dev server.

``python bench/exactly_once_ab.py --a /path/to/old/checkout --b .`` starts a dev server (from
this checkout), then in interleaved rounds runs, in a child process per checkout and round, an
exactly-once publish (a fresh producer, over NATS, as ``bench/run.py`` does) and an at-least-once
publish of the same records with the same client and path, and prints the best rate of each and
the ratios as a table, with the least client CPU per message of each (steadier than rates on a
loaded machine: the client process's own CPU time, all threads). Children take turns, so both
checkouts see the same load; the load average is printed with the table.

``--brokers host:port --nats nats://host:port`` runs against an external Liftbridge instead (A and B
may then be the same checkout, for more rounds of one). Besides the best runs, the median over the
rounds of each round's own ratio (exactly-once / at-least-once, measured side by side in one child)
is printed: on a loaded machine it is steadier than a ratio of two best runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from airflow_provider_liftbridge.devserver import DevServer  # noqa: E402

#: What each child runs (``sys.argv``: broker address, NATS URL, record count, tag).
CHILD = """
import json, sys, time, uuid
from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher
try:
    from airflow_provider_liftbridge.client import PublishOptions
except ImportError:  # a checkout from before PublishOptions
    PublishOptions = None

address, url, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
values = [b"x" * 100] * n
with LiftbridgeClient(address, nats_servers=[url], timeout=60.0) as client:
    rates = {}
    for case in ("exactly-once", "at-least-once", "exactly-once, read lazily", "at-least-once, read lazily"):
        stream = f"ab-{tag}-{uuid.uuid4().hex[:8]}"
        client.create_stream(stream, stream)
        client.publish(stream, b"warm-up")
        lazy = (v for v in values) if "lazily" in case else values
        started, cpu = time.perf_counter(), time.process_time()
        if case.startswith("exactly-once"):
            result = ExactlyOncePublisher(client, stream, f"ab-{uuid.uuid4().hex}").publish(lazy)
            assert result.written == n, result
        elif "lazily" in case:
            publisher = (
                client.batch_publisher(stream, path="nats")
                if PublishOptions is None
                else client.batch_publisher(stream, PublishOptions(path="nats"))
            )
            with publisher:
                # send_all since issue 56 (publish before it), so a checkout of either age runs.
                (getattr(publisher, "send_all", None) or publisher.publish)(lazy)
        else:
            client.publish_many(stream, lazy, path="nats")
        rates[case] = n / (time.perf_counter() - started)
        rates[case + " cpu"] = (time.process_time() - cpu) / n * 1e6
print(json.dumps(rates))
"""


def _child(checkout: Path, address: str, url: str, n: int, tag: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, address, url, str(n), tag], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="checkout A (e.g. a worktree of the old commit)")
    parser.add_argument("--b", type=Path, default=HERE.parent, help="checkout B (default: this one)")
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--brokers", help="an external Liftbridge (host:port) instead of a dev server; needs --nats")
    parser.add_argument("--nats", help="NATS URL of the external Liftbridge")
    args = parser.parse_args()
    if bool(args.brokers) != bool(args.nats):
        parser.error("--brokers and --nats go together")
    best: dict[str, dict[str, float]] = {"A": {}, "B": {}}
    ratios: dict[str, dict[str, list[float]]] = {"A": {"list": [], "lazily": []}, "B": {"list": [], "lazily": []}}
    load_start = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        if args.brokers:
            address, url = args.brokers, args.nats
        else:
            server = stack.enter_context(DevServer())
            address, url = server.address, server.nats_url
        for r in range(args.rounds):
            for name, checkout in (("A", args.a), ("B", args.b)) if r % 2 == 0 else (("B", args.b), ("A", args.a)):
                rates = _child(checkout.resolve(), address, url, args.messages, f"{name}{r}")
                for case, rate in rates.items():
                    keep = min if case.endswith(" cpu") else max  # the least CPU, the best rate
                    best[name][case] = keep(best[name].get(case, rate), rate)
                ratios[name]["list"].append(rates["exactly-once"] / rates["at-least-once"])
                ratios[name]["lazily"].append(rates["exactly-once, read lazily"] / rates["at-least-once, read lazily"])
                print(name, {k: round(v, 1) for k, v in rates.items()}, file=sys.stderr)
    load = os.getloadavg()[0]
    server_name = f"external Liftbridge {args.brokers}" if args.brokers else "dev server"
    print(
        f"A = {args.a}, B = {args.b}; {server_name}; {args.messages:,} records per run, best of {args.rounds};"
        f" load1 {load_start:.1f} -> {load:.1f}"
    )
    print("| case | A msgs/s | B msgs/s | B / A | A client CPU µs/msg | B client CPU µs/msg |")
    print("|---|---:|---:|---:|---:|---:|")
    for case in [c for c in best["A"] if not c.endswith(" cpu")]:
        a, b = best["A"][case], best["B"][case]
        a_cpu, b_cpu = best["A"][case + " cpu"], best["B"][case + " cpu"]
        print(f"| {case} | {a:,.0f} | {b:,.0f} | {b / a:.2f}× | {a_cpu:.1f} | {b_cpu:.1f} |")
    for name in ("A", "B"):
        got = best[name]
        print(
            f"| {name}: exactly-once / at-least-once | list {got['exactly-once'] / got['at-least-once']:.2f}× | "
            f"lazily {got['exactly-once, read lazily'] / got['at-least-once, read lazily']:.2f}× | | | |"
        )
    for name in ("A", "B"):
        per_round = ratios[name]
        print(
            f"| {name}: median of the rounds' ratios | list {statistics.median(per_round['list']):.2f}× | "
            f"lazily {statistics.median(per_round['lazily']):.2f}× | | | |"
        )


if __name__ == "__main__":
    main()
