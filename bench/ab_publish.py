"""A/B of the publishing and subscribe rows: this tree against another source tree of the project
(e.g. the commit before a change), in one run, on one dev server.

    .venv/bin/python bench/ab_publish.py --base /tmp/base-tree [--rounds 3] [--messages 30000]

Each round runs every case once per tree, interleaved (A, B in even rounds, B, A in odd ones), each in a fresh child
process whose ``PYTHONPATH`` is that tree, so both import their own ``airflow_provider_liftbridge``.
The dev server is a ``DevServerProcess`` of this tree (one broker, its own nats-server), the same
for both. The best run of each tree is kept (msgs/s, and the lowest client CPU per message,
steadier on a loaded machine); ratios are B (this tree) against A (the base): above 1 means B is
faster or cheaper. A second table gives the medians of the rounds and the median of each round's
A / B CPU ratio (the pair that ran back to back): on a busy machine one lucky run can move a best
by several per cent, the medians much less. Subscribe cases read a stream filled before the clock
starts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine  # noqa: E402

from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402

HERE = Path(__file__).resolve().parents[1]

#: The child's code: one case, one run; prints {"count", "seconds"}.
WORKER = r"""
import asyncio, json, sys, time, uuid
from airflow_provider_liftbridge.client import (
    AckPolicy, AsyncLiftbridgeClient, LiftbridgeClient, PublishOptions, StopPosition,
)
case, address, url, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
value = b"x" * 100

async def async_case(stream):
    async with AsyncLiftbridgeClient(address, nats_servers=[url], timeout=60.0) as a:
        await a.publish_many(stream, [value] * 100, path="nats")  # warm
        started, cpu = time.perf_counter(), time.process_time()
        if case == "async bulk":
            count = len(await a.publish_many(stream, [value] * n, window=4096, path="nats"))
        else:
            count = 0
            async for _ in a.subscribe(stream, stop_at=StopPosition.LATEST):
                count += 1
        return count, time.perf_counter() - started, time.process_time() - cpu

with LiftbridgeClient(address, nats_servers=[url], timeout=60.0) as c:
    stream = f"ab-{uuid.uuid4().hex[:8]}"
    c.create_stream(stream, stream)
    c.publish_many(stream, [value] * 100, path="nats")  # warm: connections, metadata
    if case.startswith("subscribe"):
        c.publish_many(stream, [value] * (n - 100), window=4096, path="nats")  # read below
    if case.startswith("async") or case == "subscribe, asyncio":
        count, seconds, used = asyncio.run(async_case(stream))
        print(json.dumps({"count": count, "seconds": seconds, "cpu": used}))
        sys.exit(0)
    started, cpu = time.perf_counter(), time.process_time()
    if case == "unary":
        for _ in range(n):
            c.publish(stream, value)
        count = n
    elif case == "subscribe, sync":
        count = sum(1 for _ in c.subscribe(stream, stop_at=StopPosition.LATEST))
    elif case == "bulk":
        count = len(c.publish_many(stream, [value] * n, window=4096, path="nats"))
    elif case == "batch publisher":
        publisher = c.batch_publisher(stream, PublishOptions(path="nats"), write_stats=True)
        # send_all since issue 56 (publish before it), so a base tree of either age runs.
        send_all = getattr(publisher, "send_all", None) or publisher.publish
        count = send_all(value for _ in range(n)).acknowledged
    elif case == "bulk, ack ALL":
        count = len(c.publish_many(stream, [value] * n, window=4096, path="nats", ack_policy=AckPolicy.ALL))
    else:
        count = len(c.publish_many(stream, [value] * n, window=256, path="grpc"))
    print(json.dumps({"count": count, "seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}))
"""

CASES = {
    "bulk": "publish_many over NATS (window 4096)",
    "bulk, ack ALL": "publish_many over NATS, ack policy ALL",
    "batch publisher": "batch publisher over NATS, read lazily, write stats on",
    "async bulk": "asyncio client publish_many over NATS (window 4096)",
    "grpc": "publish_many over gRPC (window 256)",
    "unary": "publish one at a time over gRPC (wait for each ack)",
    "subscribe, sync": "subscribe, sync client",
    "subscribe, asyncio": "subscribe, asyncio client",
}


def run(tree: Path, case: str, address: str, url: str, n: int) -> tuple[float, float]:
    """One run of ``case`` on ``tree``: (msgs/s, client CPU µs per message)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, case, address, url, str(n)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{case} on {tree} failed:\n{proc.stderr[-2000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    count = float(result["count"])
    return count / float(result["seconds"]), float(result["cpu"]) / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="source tree A (the base)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=30_000, help="messages per NATS run")
    parser.add_argument("--grpc-messages", type=int, default=8_000, help="messages per gRPC run")
    parser.add_argument("--unary", type=int, default=800, help="messages per one-at-a-time run")
    parser.add_argument("--subscribe-messages", type=int, default=20_000, help="messages per subscribe run")
    parser.add_argument("--only", nargs="*", choices=list(CASES), help="run only these cases")
    args = parser.parse_args()
    sizes = {"grpc": args.grpc_messages, "unary": args.unary}
    sizes |= {case: args.subscribe_messages for case in CASES if case.startswith("subscribe")}
    cases = [case for case in CASES if not args.only or case in args.only]
    trees = {"A (base)": args.base.resolve(), "B (this tree)": HERE}
    load_at_start = os.getloadavg()[0]
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}  # (msgs/s, client CPU µs/msg) per round
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data) as server:
        for round_no in range(args.rounds):
            for case in cases:
                n = sizes.get(case, args.messages)
                # A then B, then B then A: neither tree always runs right after the other's run
                # (the dev server may still be busy with what the previous run left it).
                order = list(trees.items()) if round_no % 2 == 0 else list(reversed(trees.items()))
                for name, tree in order:
                    runs.setdefault((case, name), []).append(run(tree, case, server.address, server.nats_url, n))
    best = {key: max(rate for rate, _ in got) for key, got in runs.items()}
    cpu = {key: min(us for _, us in got) for key, got in runs.items()}
    print(
        "| case | A msgs/s | B msgs/s | B / A | A client CPU µs/msg | B client CPU µs/msg | A / B (CPU) |\n"
        "|---|---:|---:|---:|---:|---:|---:|"
    )
    for case in cases:
        label = CASES[case]
        a, b = best[(case, "A (base)")], best[(case, "B (this tree)")]
        ca, cb = cpu[(case, "A (base)")], cpu[(case, "B (this tree)")]
        print(f"| {label} | {a:,.0f} | {b:,.0f} | {b / a:.2f}× | {ca:.1f} | {cb:.1f} | {ca / cb:.2f}× |")
    print(
        "\n| case | A / B (CPU), medians | median of the rounds' A / B (CPU) | B / A (msgs/s), medians |\n"
        "|---|---:|---:|---:|"
    )
    for case in cases:
        a_runs, b_runs = runs[(case, "A (base)")], runs[(case, "B (this tree)")]
        cpu_a, cpu_b = statistics.median(us for _, us in a_runs), statistics.median(us for _, us in b_runs)
        paired = statistics.median(a[1] / b[1] for a, b in zip(a_runs, b_runs, strict=True))
        rate_a, rate_b = statistics.median(r for r, _ in a_runs), statistics.median(r for r, _ in b_runs)
        print(f"| {CASES[case]} | {cpu_a / cpu_b:.3f}× | {paired:.3f}× | {rate_b / rate_a:.2f}× |")
    print(
        f"\nbest (first table) and medians (second) of {args.rounds} interleaved rounds; {machine()}; "
        f"load {load_at_start:.1f} -> {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
