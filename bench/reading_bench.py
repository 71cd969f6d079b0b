"""The reading operators beside the client's own sync ``subscribe``, over the same messages, in one run.

    .venv/bin/python bench/reading_bench.py [--messages 100000] [--rounds 3] [--out FILE]

Rows (targets from issue 22):

- ``LiftbridgeConsumeOperator`` with a no-op ``apply_function_batch`` (batches of 1,000, a
  commit after each) vs ``LiftbridgeClient.subscribe`` reading the same partition: ≥ 0.8×;
- ``LiftbridgeStreamToFileOperator`` writing Parquet (text values; one file, row groups of
  10,000) vs that consume row: ≥ 0.5×; and with ``value_format="json"`` (the values' fields as
  columns), no target.

Each operator runs its real code, ``run()`` with the client of a ``liftbridge`` connection (the
dev server's) and a task context of its own, without Airflow's task runner around it (which costs
the same for any operator): a fresh cursor and run id per round, so every round plans and reads
all the messages from offset 0. The messages are JSON objects of about 100 bytes on one partition.
Rounds are interleaved (``bench/run.py``'s ``interleaved``), each variant's best kept; the CPU
columns and the machine line are ``bench/run.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
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

from run import Meter, Report, interleaved, rate_row  # noqa: E402

from airflow_provider_liftbridge.client import LiftbridgeClient  # noqa: E402
from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402


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
        task_id="consume", stream=stream, cursor_id=f"bench-{uuid.uuid4().hex}", apply_function_batch=noop
    )
    return operator_run(op)


def archive(stream: str, directory: Path, value_format: str) -> int:
    from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator

    target = directory / uuid.uuid4().hex
    op = LiftbridgeStreamToFileOperator(
        task_id="archive",
        stream=stream,
        cursor_id=f"bench-{uuid.uuid4().hex}",
        path=str(target),
        format="parquet",
        value_format=value_format,
    )
    count = operator_run(op)
    for f in target.iterdir():
        f.unlink()  # keep the disk free between rounds
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args()
    n = args.messages
    report = Report(load_start=os.getloadavg())
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data_dir=data) as srv:
        conn = {"conn_type": "liftbridge", "host": srv.address, "extra": {"nats_servers": srv.nats_url}}
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
            best = interleaved(
                {
                    "subscribe": lambda: sum(1 for _ in client.subscribe(stream, stop_at=n - 1)),
                    "consume": lambda: consume(stream),
                    "parquet": lambda: archive(stream, Path(out), "text"),
                    "parquet-json": lambda: archive(stream, Path(out), "json"),
                },
                meter,
                args.rounds,
            )
    for name, run in best.items():
        if run.count != n:
            raise SystemExit(f"{name} handled {run.count} of {n} messages")
    report.rows += [
        rate_row(
            "consume operator, no-op batch function", best["consume"], "sync client subscribe", best["subscribe"], 0.8
        ),
        rate_row("stream-to-file operator, Parquet", best["parquet"], "the consume operator row", best["consume"], 0.5),
        rate_row(
            "stream-to-file operator, Parquet",
            best["parquet-json"],
            "the consume operator row",
            best["consume"],
            None,
            "value_format json",
        ),
        rate_row("stream-to-file operator, Parquet", best["parquet"], "sync client subscribe", best["subscribe"], None),
    ]
    report.seconds = time.perf_counter() - started
    report.load_end = os.getloadavg()
    text = report.markdown(argparse.Namespace(rounds=args.rounds, brokers=None, nats=None, server_pid=None))
    text = text.replace("100-byte values", f"{n:,} JSON values of about 100 bytes")
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
