"""Fault-injection scenarios, each returning its figures; run by the tests and by ``report``.

Every scenario starts its own servers, injects its faults, then reads the stream back record by
record and counts what is missing (lost) and what is there more than once (duplicated). Records
are told apart by their value (``rec-000123``), so the check does not trust the publisher's own
headers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    PublishError,
    Record,
    StartPosition,
    StopPosition,
)
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher
from airflow_provider_liftbridge.devserver import DevServer, DevServerProcess

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Figures:
    """One row of the reliability table."""

    scenario: str
    faults: str
    sent: int
    in_stream: int
    lost: int
    duplicated: int
    seconds: float = 0.0
    notes: str = ""


def values(n: int, prefix: str = "rec") -> list[bytes]:
    """``n`` distinct payloads."""
    return [f"{prefix}-{i:06d}".encode() for i in range(n)]


def read_stream(client: LiftbridgeClient, stream: str, partitions: Sequence[int] = (0,)) -> list[bytes]:
    """Every committed value of the given partitions."""
    out: list[bytes] = []
    for p in partitions:
        if client.fetch_partition_metadata(stream, p).high_watermark < 0:
            continue
        out += [
            m.value
            for m in client.subscribe(stream, partition=p, start_at=StartPosition.EARLIEST, stop_at=StopPosition.LATEST)
        ]
    return out


def count(expected: Sequence[bytes], stored: Sequence[bytes]) -> tuple[int, int, int]:
    """``(records of ours in the stream, lost, duplicated)``, record by record."""
    wanted = set(expected)
    seen = Counter(v for v in stored if v in wanted)
    lost = sum(1 for v in expected if seen[v] == 0)
    duplicated = sum(c - 1 for c in seen.values() if c > 1)
    return sum(seen.values()), lost, duplicated


def _wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        time.sleep(0.02)


def _hw(client: LiftbridgeClient, stream: str, partition: int = 0) -> int:
    try:
        return client.fetch_partition_metadata(stream, partition).high_watermark
    except Exception:  # the server is down or restarting
        return -1


# ---------------------------------------------------------------------------------------------
# Dev server SIGKILLed mid-publish
# ---------------------------------------------------------------------------------------------


def _publish_at_least_once(client: LiftbridgeClient, stream: str, records: list[bytes], batch: int) -> None:
    """The usual retry loop: send again whatever has no ack (duplicates possible)."""
    for start in range(0, len(records), batch):
        todo = records[start : start + batch]
        for _ in range(40):
            try:
                client.publish_many(stream, todo, window=128)
                break
            except PublishError as exc:
                todo = [r for r, a in zip(todo, exc.acks, strict=True) if a is None]
                time.sleep(0.25)
        else:
            raise RuntimeError("at-least-once publisher gave up")


def server_kill(exactly_once: bool, n: int = 6000, kill_at: int = 2000) -> Figures:
    """SIGKILL the dev server process while a publish is running, restart it on the same data."""
    started = time.monotonic()
    data = tempfile.mkdtemp(prefix="reliability-kill-")
    stream = f"kill-{uuid.uuid4().hex[:8]}"
    records = values(n)
    with DevServerProcess(data_dir=data) as server:
        watcher = LiftbridgeClient(server.address, timeout=2.0, max_retries=1)
        client = LiftbridgeClient(server.address, timeout=3.0, max_retries=8, backoff_base=0.1)
        client.create_stream(stream, stream)
        failure: list[BaseException] = []
        result: list[Any] = []

        def publish() -> None:
            try:
                if exactly_once:
                    pub = ExactlyOncePublisher(client, stream, "kill-test", batch=500, timeout=3.0, max_resumes=12)
                    result.append(pub.publish(records))
                else:
                    _publish_at_least_once(client, stream, records, 500)
            except BaseException as exc:  # reported by the caller
                failure.append(exc)

        thread = threading.Thread(target=publish)
        thread.start()
        _wait_until(lambda: _hw(watcher, stream) >= kill_at, 60, f"offset {kill_at}")
        server.kill()
        time.sleep(0.3)
        server.start()
        thread.join(120)
        if thread.is_alive():
            raise TimeoutError("the publisher did not finish within 120 s of the restart")
        if failure:
            raise failure[0]
        in_stream, lost, dup = count(records, read_stream(watcher, stream))
        notes = ""
        if result:
            notes = f"written {result[0].written}, resumes {result[0].resumes}"
        client.close()
        watcher.close()
    return Figures(
        "dev server SIGKILL + restart" + (" (exactly-once)" if exactly_once else " (at-least-once)"),
        "1 SIGKILL of the server mid-publish",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        notes,
    )


# ---------------------------------------------------------------------------------------------
# Publishing task killed, retried through Airflow
# ---------------------------------------------------------------------------------------------

DAG_ID = "liftbridge_reliability_publish"


def run_dag_subprocess(env: dict[str, str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run the reliability DAG once with ``dag.test()`` in a fresh Python process."""
    return subprocess.run(
        [sys.executable, "-m", "tests.reliability.run_dag"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def task_kill(lb_address: str, fault: str, n: int = 3000, crash_at: int = 1300) -> Figures:
    """The publishing task dies part-way on its first try (``fault="exit"``: ``os._exit`` kills
    the process; ``"raise"``: an exception fails the try and Airflow retries it), then the task is
    run again for the same DAG run; the stream is checked record by record.

    Needs ``AIRFLOW_HOME`` with a migrated database in the environment (tests.airflow_support).
    """
    started = time.monotonic()
    stream = f"task-{uuid.uuid4().hex[:8]}"
    marker = Path(tempfile.mkdtemp(prefix="reliability-task-")) / "first-try"
    out = marker.with_name("result.json")
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream, stream)
        env = dict(os.environ) | {
            "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).parent / "dags"),
            "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps({"conn_type": "liftbridge", "host": lb_address}),
            "EO_STREAM": stream,
            "EO_RECORDS": str(n),
            "EO_CRASH_AT": str(crash_at),
            "EO_FAULT": fault,
            "EO_MARKER": str(marker),
            "EO_OUT": str(out),
            "PYTHONPATH": str(REPO),
        }
        runs = []
        timings = []
        for _ in range(2):
            t0 = time.monotonic()
            proc = run_dag_subprocess(env)
            timings.append(round(time.monotonic() - t0, 1))
            runs.append(proc)
            if len(runs) == 1:
                after_first = count(values(n), read_stream(client, stream))[0]
            if out.exists():
                break
        if not out.exists():
            raise AssertionError(
                "the DAG never finished: " + " | ".join(f"rc={p.returncode} {p.stderr[-1500:]}" for p in runs)
            )
        summary = json.loads(out.read_text())
        in_stream, lost, dup = count(values(n), read_stream(client, stream))
    how = "os._exit in the task process" if fault == "exit" else "exception mid-publish, Airflow retry"
    return Figures(
        f"task killed, retried ({'new process' if fault == 'exit' else 'Airflow retry'})",
        f"1 ({how})",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"runs {len(runs)}, exit codes {[p.returncode for p in runs]}, after the first run {after_first}, "
        f"retry wrote {summary['publish']['written']} skipped {summary['publish']['skipped']}; "
        f"state {summary['state']}, tries {summary['tries']}, run seconds {timings}",
    )


# ---------------------------------------------------------------------------------------------
# A broker of a cluster stopped mid-run
# ---------------------------------------------------------------------------------------------


def cluster_failover(n: int = 3000) -> Figures:
    """Stop the broker the publisher uses (the partition leader) while an exactly-once publish runs."""
    started = time.monotonic()
    with DevServer(brokers=3) as cluster:
        stream = f"failover-{uuid.uuid4().hex[:8]}"
        client = LiftbridgeClient(cluster.addresses, timeout=3.0, max_retries=6, backoff_base=0.05)
        client.create_stream(stream, stream, partitions=2, replication_factor=3)
        records = [Record(v, partition=i % 2) for i, v in enumerate(values(n))]
        leader = client.fetch_metadata([stream]).streams[stream].partitions[0].leader
        stop_index = cluster.broker_ids.index(leader)
        result: list[Any] = []
        failure: list[BaseException] = []

        def publish() -> None:
            try:
                pub = ExactlyOncePublisher(client, stream, "failover", batch=200, timeout=3.0, max_resumes=10)
                result.append(pub.publish(records))
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=publish)
        thread.start()
        _wait_until(lambda: _hw(client, stream, 0) >= n // 6, 60, "a sixth of the records")
        cluster.stop_broker(stop_index)
        stopped_leader = leader
        thread.join(120)
        if failure:
            raise failure[0]
        new_leader = client.fetch_metadata([stream]).streams[stream].partitions[0].leader
        in_stream, lost, dup = count(values(n), read_stream(client, stream, (0, 1)))
        client.close()
    return Figures(
        "cluster: partition leader stopped",
        "1 broker (of 3) stopped mid-publish",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"leader {stopped_leader} -> {new_leader}; resumes {result[0].resumes}",
    )


# ---------------------------------------------------------------------------------------------
# A stalled server (SIGSTOP) and a network that stops forwarding
# ---------------------------------------------------------------------------------------------


def server_stall(n: int = 4000, stall: float = 2.5) -> Figures:
    """SIGSTOP the server process for ``stall`` seconds mid-publish (acks time out, the publisher
    settles and re-scans once the server answers again), then SIGCONT."""
    import signal

    started = time.monotonic()
    data = tempfile.mkdtemp(prefix="reliability-stall-")
    stream = f"stall-{uuid.uuid4().hex[:8]}"
    records = values(n)
    with DevServerProcess(data_dir=data) as server:
        client = LiftbridgeClient(server.address, timeout=1.0, max_retries=3, backoff_base=0.1)
        client.create_stream(stream, stream)
        result: list[Any] = []
        failure: list[BaseException] = []

        def publish() -> None:
            try:
                pub = ExactlyOncePublisher(client, stream, "stall", batch=400, timeout=1.0, max_resumes=12)
                result.append(pub.publish(records))
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=publish)
        thread.start()
        _wait_until(lambda: _hw(client, stream) >= n // 4, 60, "a quarter of the records")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        time.sleep(stall)
        os.kill(server.pid, signal.SIGCONT)
        thread.join(120)
        if failure:
            raise failure[0]
        in_stream, lost, dup = count(records, read_stream(client, stream))
        client.close()
    return Figures(
        "server stalled (SIGSTOP) mid-publish (exactly-once)",
        f"SIGSTOP {stall:g} s, ack timeout 1 s",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"resumes {result[0].resumes}",
    )


def nats_restart(n: int = 200) -> Figures:
    """Restart the nats-server under a dev server (external NATS on a fixed port) between two
    exactly-once NATS-direct publishes; the server's NATS side reconnects and resubscribes."""
    from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess

    started = time.monotonic()
    nats_proc = NatsServerProcess()
    url = nats_proc.start()
    port = nats_proc.port
    try:
        with DevServer(nats_url=url) as server:
            stream = f"nats-{uuid.uuid4().hex[:8]}"
            client = LiftbridgeClient(server.address, timeout=3.0)
            client.create_stream(stream, stream)
            records = values(n)
            pub = ExactlyOncePublisher(client, stream, "nats-restart", nats_servers=[url], timeout=1.0, backoff=0.2)
            pub.publish(records[: n // 2])
            nats_proc.stop()
            nats_proc = NatsServerProcess(port=port)
            nats_proc.start()
            second = pub.publish(records[n // 2 :])
            in_stream, lost, dup = count(records, read_stream(client, stream))
            client.close()
    finally:
        nats_proc.stop()
    return Figures(
        "nats-server restarted between publishes (exactly-once, NATS-direct)",
        "1 nats-server stop + start (same port)",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"second half: written {second.written}, resumes {second.resumes}",
    )
