"""The reading operators beside the client's own sync ``subscribe``, over the same messages, in one run.

    .venv/bin/python bench/reading_bench.py [--messages 100000] [--rounds 3] [--out FILE]
    .venv/bin/python bench/reading_bench.py --brokers host:port[,host:port] --nats nats://host:4222 [--server-pid PID]

Without ``--brokers`` the server is a ``DevServerProcess`` the bench starts; with ``--brokers`` and
``--nats`` it is an external Liftbridge (as for ``bench/run.py``; its CPU is measured when
``--server-pid`` names its process). Each run publishes its messages to a fresh stream first.

Rows (targets from issue 34), each in message rate and in client CPU per message:

- ``LiftbridgeConsumeOperator`` with a no-op ``apply_function_batch`` (batches of 1,000, a
  commit after each) vs ``LiftbridgeClient.subscribe`` reading the same partition: ≥ 0.9×;
- ``LiftbridgeStreamToFileOperator`` writing Parquet (text values; one file, row groups of
  10,000) vs that consume row: ≥ 0.8×; and with ``value_format="json"`` (the values' fields as
  columns), no target.

Each operator runs its real code, ``run()`` with the client of a ``liftbridge`` connection (the
dev server's) and a task context of its own, without Airflow's task runner around it (which costs
the same for any operator): a fresh cursor and run id per round, so every round plans and reads
all the messages from offset 0. The messages are JSON objects of about 100 bytes on one partition.
Rounds are interleaved (the variants' order reversed every other round), after one unmeasured
round (the first run of an operator imports Airflow's task machinery). The first table is
``bench/run.py``'s (each variant's best run); the second gives every variant's median and best
rate and client CPU per message over all rounds, with the ratios the targets are about.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="reading-bench-airflow-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

from run import ExternalServer, Meter, Report, Run, Server, rate_row  # noqa: E402

from airflow_provider_liftbridge.client import LiftbridgeClient  # noqa: E402
from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402
from airflow_provider_liftbridge.operators import SinceLastRun

#: (variant, what it is, baseline variant, target of the ratio), for the second table.
COMPARISONS = (
    ("consume", "consume operator, no-op batch function", "subscribe", 0.9),
    ("parquet", "stream-to-file operator, Parquet", "consume", 0.8),
    ("parquet-json", "stream-to-file operator, Parquet, value_format json", "consume", None),
    ("parquet", "stream-to-file operator, Parquet", "subscribe", None),
)
BASELINES = {"subscribe": "sync client subscribe", "consume": "the consume operator row"}


def noop(batch: list[Any]) -> None:
    """The consume row's batch function: nothing, so the row measures the operator."""


def context(task_id: str) -> dict[str, Any]:
    """What the reading operators take from a task's context: the task instance and the run id."""
    return {"ti": SimpleNamespace(dag_id="reading_bench", task_id=task_id, map_index=-1), "run_id": uuid.uuid4().hex}


def operator_run(op: Any) -> int:
    """Run an operator's work with its hook's client; return the messages it processed."""
    try:
        result = op.run(op.hook.client, context(op.task_id))
    finally:
        op.hook.close()
    return int(result["processed"])


def consume(stream: str) -> int:
    from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator

    op = LiftbridgeConsumeOperator(
        task_id="consume", stream=stream, read=SinceLastRun(f"bench-{uuid.uuid4().hex}"), apply_function_batch=noop
    )
    return operator_run(op)


def archive(stream: str, directory: Path, value_format: str) -> int:
    from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

    target = directory / uuid.uuid4().hex
    op = LiftbridgeStreamToFileOperator(
        task_id="archive",
        stream=stream,
        read=SinceLastRun(f"bench-{uuid.uuid4().hex}"),
        path=str(target),
        format="parquet",
        value_format=value_format,
    )
    count = operator_run(op)
    for f in target.iterdir():
        f.unlink()  # keep the disk free between rounds
    return count


def rounds(variants: dict[str, Any], meter: Meter, count: int) -> dict[str, list[Run]]:
    """Run every variant once unmeasured, then once per round, in turn (the order reversed every other
    round); keep all measured runs."""
    print("  warming up (one unmeasured run of each: imports, first connections)", file=sys.stderr)
    for fn in variants.values():
        fn()
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for r in range(count):
        order = list(variants.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            run = meter.measure(fn)
            print(
                f"  {name}: {run.count} in {run.wall:.2f} s = {run.rate:,.0f}/s,"
                f" client CPU {run.client_cpu / max(run.count, 1) * 1e6:.2f} µs/msg",
                file=sys.stderr,
            )
            runs[name].append(run)
    return runs


def cpu_per_message(run: Run) -> float:
    """The client's CPU per message in µs."""
    return run.client_cpu / run.count * 1e6 if run.count else 0.0


def medians_table(runs: dict[str, list[Run]]) -> str:
    """Per comparison: median (and best) rate and client CPU per message of both sides, and the
    ratios of the medians (rate: ours / baseline; CPU: baseline / ours, so > 1 means cheaper)."""
    lines = [
        "| row | msgs/s median (best) | client CPU µs/msg median (best) | baseline | rate ratio | CPU ratio | target |",
        "|---|---|---|---|---:|---:|---|",
    ]

    def figures(name: str) -> tuple[float, float, str, str]:
        rates = [r.rate for r in runs[name]]
        cpus = [cpu_per_message(r) for r in runs[name]]
        rate, cpu = statistics.median(rates), statistics.median(cpus)
        return rate, cpu, f"{rate:,.0f} ({max(rates):,.0f})", f"{cpu:.2f} ({min(cpus):.2f})"

    rate, cpu, rate_text, cpu_text = figures("subscribe")
    lines.append(f"| sync client subscribe | {rate_text} | {cpu_text} | | | | |")
    for name, what, base, target in COMPARISONS:
        rate, cpu, rate_text, cpu_text = figures(name)
        base_rate, base_cpu, _, _ = figures(base)
        rate_ratio, cpu_ratio = rate / base_rate, base_cpu / cpu
        verdict = ""
        if target is not None:
            met = rate_ratio >= target and cpu_ratio >= target
            verdict = f"≥ {target:g}× both: {'yes' if met else '**no**'}"
        ratios = f"{rate_ratio:.2f}× | {cpu_ratio:.2f}×"
        lines.append(f"| {what} | {rate_text} | {cpu_text} | {BASELINES[base]} | {ratios} | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    parser.add_argument(
        "--brokers", help="an external Liftbridge (host:port[,host:port...]) instead of a dev server; needs --nats"
    )
    parser.add_argument("--nats", help="NATS URL of the external Liftbridge (nats://host:port)")
    parser.add_argument("--server-pid", type=int, help="pid of the external broker process, to measure its CPU")
    args = parser.parse_args()
    if bool(args.brokers) != bool(args.nats):
        parser.error("--brokers and --nats go together (the reading operators' connection names both)")
    if args.server_pid and not args.brokers:
        parser.error("--server-pid measures an external server: give --brokers and --nats too")
    n = args.messages
    report = Report(load_start=os.getloadavg())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as data, contextlib.ExitStack() as stack:
        srv: Server
        if args.brokers:
            srv = ExternalServer(args.brokers, args.nats, args.server_pid)
        else:
            srv = stack.enter_context(DevServerProcess(data_dir=data))
        conn = {"conn_type": "liftbridge", "host": srv.brokers if args.brokers else srv.address}
        conn["extra"] = {"nats_servers": srv.nats_url}
        os.environ["AIRFLOW_CONN_LIFTBRIDGE_DEFAULT"] = json.dumps(conn)
        with LiftbridgeClient(srv.address) as client, tempfile.TemporaryDirectory() as out:
            stream = f"reading-{uuid.uuid4().hex[:8]}"
            client.create_stream(stream, stream)
            values = (
                json.dumps({"id": i, "customer": f"c-{i % 97}", "amount": i * 0.25, "note": "x" * 40}) for i in range(n)
            )
            client.publish_many(stream, (v.encode() for v in values))
            meter = Meter(srv.pid)
            print("reading: subscribe / consume / archive", file=sys.stderr)
            runs = rounds(
                {
                    "subscribe": lambda: sum(1 for _ in client.subscribe(stream, stop_at=n - 1)),
                    "consume": lambda: consume(stream),
                    "parquet": lambda: archive(stream, Path(out), "text"),
                    "parquet-json": lambda: archive(stream, Path(out), "json"),
                },
                meter,
                args.rounds,
            )
    for name, done in runs.items():
        for run in done:
            if run.count != n:
                raise SystemExit(f"{name} handled {run.count} of {n} messages")
    best = {name: max(done, key=lambda r: r.rate) for name, done in runs.items()}
    for name, what, base, target in COMPARISONS:
        note = "value_format json" if name == "parquet-json" else ""
        case = what.split(", value_format")[0]
        report.rows.append(rate_row(case, best[name], BASELINES[base], best[base], target, note))
    report.seconds = time.perf_counter() - started
    report.load_end = os.getloadavg()
    namespace = argparse.Namespace(rounds=args.rounds, brokers=args.brokers, nats=args.nats, server_pid=args.server_pid)
    text = report.markdown(namespace)
    text = text.replace("100-byte values", f"{n:,} JSON values of about 100 bytes")
    text += "\n\nMedians over the rounds (ratios of medians; CPU ratio = baseline µs / ours, > 1 means cheaper):\n\n"
    text += medians_table(runs)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
