"""Client throughput and CPU cost against a dev server in its own process.

Prints, in one run: sync publish, pipelined publish (sync and asyncio clients) and subscribe in
messages per second and client CPU seconds per 10,000 messages (``time.process_time`` of this
process; the server runs in a ``DevServerProcess`` so it does not share our GIL), next to a raw
generated-stub baseline (``APIStub.PublishAsync`` with a window of 256, raw ``Subscribe``).
Values are 100 bytes.

    .venv/bin/python bench/client_bench.py [--messages 20000] [--single 2000]

``--bulk`` measures the bulk NATS path instead (``publish_many(path="nats")``, window 1024):
ours, ours on nats-py's public API only (the fallback of ``nats_adapter.py``) and the raw
nats-py + codec baseline of ``bench/run.py``, interleaved over ``--rounds``, with client CPU
microseconds per message (the steadier figure on a shared machine) and the median.

    .venv/bin/python bench/client_bench.py --bulk [--messages 30000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable

import baselines

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, LiftbridgeClient, StopPosition
from airflow_provider_liftbridge.devserver import DevServerProcess

VALUE = baselines.VALUE


def measure(fn: Callable[[], int]) -> tuple[float, float, int]:
    """Run ``fn`` (returns the message count); wall seconds, CPU seconds, count."""
    wall, cpu = time.perf_counter(), time.process_time()
    n = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, n


def bulk(n: int, rounds: int) -> None:
    """The bulk NATS path beside its fallback and the raw baseline; see the module docstring."""
    import statistics

    from airflow_provider_liftbridge import nats_adapter

    def ours(address: str, url: str, stream: str, internals: bool) -> tuple[float, float, int]:
        nats_adapter.USE_INTERNALS = internals  # read when a connection is first used
        try:
            with LiftbridgeClient(address, nats_servers=[url], timeout=60.0) as c:
                c.publish_many(stream, [VALUE] * 100, window=1024, path="nats")  # connect outside the measure
                return measure(lambda: len(c.publish_many(stream, [VALUE] * n, window=1024, path="nats")))
        finally:
            nats_adapter.USE_INTERNALS = True

    names = ["publish_many over NATS", "same, nats-py public API only", "raw nats-py envelopes + ack inbox"]
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data_dir=data) as srv:
        address, url = srv.address, srv.nats_url
        with LiftbridgeClient(address) as c:
            for name in ("bulk", "bulk-public", "bulk-raw"):
                c.create_stream(name, name)
        variants: dict[str, Callable[[], tuple[float, float, int]]] = {
            names[0]: lambda: ours(address, url, "bulk", True),
            names[1]: lambda: ours(address, url, "bulk-public", False),
            names[2]: lambda: measure(lambda: asyncio.run(baselines.raw_nats_envelopes(url, "bulk-raw", n, 1024))),
        }
        for r in range(rounds):
            for name in names if r % 2 == 0 else reversed(names):
                results[name].append(variants[name]())
    print(f"{'bulk path (window 1024, 100-byte values)':<40} {'msgs/s best':>12} {'CPU µs/msg min':>15} {'median':>7}")
    for name in names:
        rates = [count / wall for wall, _, count in results[name]]
        cpus = [cpu / count * 1e6 for _, cpu, count in results[name]]
        print(f"{name:<40} {max(rates):>12,.0f} {min(cpus):>15.2f} {statistics.median(cpus):>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per pipelined/subscribe run")
    parser.add_argument("--single", type=int, default=2_000, help="messages for one-at-a-time publish")
    parser.add_argument("--bulk", action="store_true", help="measure the bulk NATS path instead (see above)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of --bulk")
    args = parser.parse_args()
    if args.bulk:
        bulk(args.messages if args.messages != 20_000 else 30_000, args.rounds)
        return
    n, single = args.messages, args.single
    rows: list[tuple[str, float, float, int]] = []

    with tempfile.TemporaryDirectory() as data, DevServerProcess(data_dir=data) as srv:
        address = srv.address
        with LiftbridgeClient(address, timeout=30.0) as c:
            for s in ("raw", "single", "many", "amany"):
                c.create_stream(s, s)

            raw = measure(lambda: baselines.raw_publish_async(address, "raw", n))
            rows.append(("raw stub PublishAsync (window 256)", *raw))
            rows.append(("client.publish (one at a time)",
                         *measure(lambda: sum(1 for _ in range(single) if c.publish("single", VALUE)))))  # fmt: skip
            rows.append(("client.publish_many (window 256)",
                         *measure(lambda: len(c.publish_many("many", [VALUE] * n, window=256)))))  # fmt: skip

            async def amany() -> int:
                async with AsyncLiftbridgeClient(address, timeout=30.0) as ac:
                    return len(await ac.publish_many("amany", [VALUE] * n, window=256))

            rows.append(("async publish_many (window 256)", *measure(lambda: asyncio.run(amany()))))
            rows.append(("raw stub Subscribe", *measure(lambda: baselines.raw_subscribe(address, "many", n))))
            latest = StopPosition.LATEST
            rows.append(("client.subscribe", *measure(lambda: sum(1 for _ in c.subscribe("many", stop_at=latest)))))

            async def asub() -> int:
                async with AsyncLiftbridgeClient(address) as ac:
                    return len([m async for m in ac.subscribe("many", stop_at=StopPosition.LATEST)])

            rows.append(("async subscribe", *measure(lambda: asyncio.run(asub()))))

    print(f"{'path':<38} {'msgs':>7} {'msgs/s':>9} {'CPU s / 10k msgs':>17}")
    for name, wall, cpu, count in rows:
        print(f"{name:<38} {count:>7} {count / wall:>9,.0f} {cpu / count * 10_000:>17.2f}")


if __name__ == "__main__":
    main()
