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
    AckPolicy,
    LiftbridgeClient,
    PublishError,
    Record,
    StartPosition,
    StopPosition,
)
from airflow_provider_liftbridge.client.exactly_once import ExactlyOncePublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer, DevServerProcess
from tests import margins
from tests.margins import bounded
from tests.processes import run_child

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
    try:
        margins.wait_until(predicate, timeout, what, interval=0.02)
    except AssertionError as err:
        raise TimeoutError(f"{what} did not happen within {timeout:g} s") from err


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
                    pub = ExactlyOncePublisher(
                        client, stream, "kill-test", batch=500, max_resumes=12, options=PublishOptions(timeout=3.0)
                    )
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


def run_dag_subprocess(env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run the reliability DAG once with ``dag.test()`` in a fresh Python process. Unbounded by
    default: the test's own time-out bounds it (a child killed by it goes with the test), rather
    than a second, shorter bound sized for a quiet machine (one child took over 120 s at load 16)."""
    argv = [sys.executable, "-m", "tests.reliability.run_dag"]
    if timeout is None:  # the child's process group goes if the test is interrupted
        return run_child(argv, cwd=REPO, env=env, capture_output=True, text=True)
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


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
                pub = ExactlyOncePublisher(
                    client, stream, "failover", batch=200, max_resumes=10, options=PublishOptions(timeout=3.0)
                )
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
                pub = ExactlyOncePublisher(
                    client, stream, "stall", batch=400, max_resumes=12, options=PublishOptions(timeout=1.0)
                )
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
            client = LiftbridgeClient(server.address, nats_servers=[url], timeout=3.0)
            client.create_stream(stream, stream)
            records = values(n)
            pub = ExactlyOncePublisher(
                client, stream, "nats-restart", backoff=0.2, options=PublishOptions(path="nats", timeout=1.0)
            )
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


# ---------------------------------------------------------------------------------------------
# Cluster mode as Liftbridge replicates (issue 13): an uncommitted tail, a full-cluster restart
# ---------------------------------------------------------------------------------------------


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any], list[BaseException]]:
    """Run ``work`` on a thread; its result or exception lands in the returned lists."""
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # reported by the caller
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result, failure


def _joined(thread: threading.Thread, result: list[Any], failure: list[BaseException], timeout: float) -> Any:
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"the publisher or waiter did not finish within {timeout:g} s")
    if failure:
        raise failure[0]
    return result[0]


def _partition(client: LiftbridgeClient, stream: str) -> Any:
    return client.fetch_metadata([stream]).streams[stream].partitions[0]


def _tail(client: LiftbridgeClient, stream: str) -> int:
    """Records above the high watermark of partition 0 (0 when the leader cannot be asked)."""
    try:
        info = client.fetch_partition_metadata(stream, 0)
    except Exception:  # the leader is stalled or gone
        return 0
    return info.newest_offset - info.high_watermark


def stalled_follower(occ: bool, n: int = 600, stall: float = 3.0) -> Figures:
    """The issue's reproduction on the dev server's cluster: a follower stops (SIGSTOP-like) for
    ``stall`` seconds while an exactly-once publish with ack policy ALL runs; the leader keeps
    appending but cannot commit, acks time out after 1 s, and the follower stays in the ISR
    (``replica_max_lag_time`` 6 s) until it resumes."""
    started = time.monotonic()
    timings = ClusterTimings.fast(replica_max_lag_time=6.0, replica_max_leader_timeout=6.0)
    with DevServer(brokers=3, timings=timings) as cluster:
        stream = f"stall-f-{uuid.uuid4().hex[:8]}"
        client = LiftbridgeClient(cluster.addresses, timeout=5.0, max_retries=6)
        client.create_stream(stream, stream, replication_factor=3, optimistic_concurrency_control=occ)
        part = _partition(client, stream)
        follower = next(r for r in part.replicas if r != part.leader)
        records = values(n)
        publisher = ExactlyOncePublisher(
            client,
            stream,
            "stalled",
            batch=50,
            max_resumes=12,
            options=PublishOptions(ack_policy=AckPolicy.ALL, window=16, timeout=1.0),
        )
        thread, result, failure = _in_thread(lambda: publisher.publish(records))
        _wait_until(lambda: _hw(client, stream) >= n // 4, 60, "a quarter of the records")
        index = cluster.broker_ids.index(follower)
        cluster.stall_broker(index)
        _wait_until(lambda: _tail(client, stream) > 0, 10, "an uncommitted tail")
        time.sleep(stall)
        cluster.resume_broker(index)
        done = _joined(thread, result, failure, 120)
        in_stream, lost, dup = count(records, read_stream(client, stream))
        client.close()
    return Figures(
        f"cluster: follower stalled mid-publish (exactly-once, {'OCC' if occ else 'no OCC'})",
        f"1 follower (of 3) stalled {stall:g} s, ack ALL, ack timeout 1 s",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"written {done.written}, resumes {done.resumes}, duplicates seen {publisher.duplicates_seen}",
    )


def leader_killed_with_tail(n: int = 600) -> Figures:
    """A follower stalls, so the leader holds an uncommitted tail (acks ALL time out); then the
    leader is killed. The other follower takes over after the leader timeout (1 s) with what it
    had fetched, the stalled one leaves the ISR after the lag time (3 s), and the tail commits."""
    started = time.monotonic()
    timings = ClusterTimings.fast(replica_max_lag_time=3.0, replica_max_leader_timeout=1.0)
    with DevServer(brokers=3, timings=timings) as cluster:
        stream = f"kill-l-{uuid.uuid4().hex[:8]}"
        client = LiftbridgeClient(cluster.addresses, timeout=5.0, max_retries=8)
        client.create_stream(stream, stream, replication_factor=3)
        part = _partition(client, stream)
        stalled = next(r for r in part.replicas if r != part.leader)
        records = values(n)
        publisher = ExactlyOncePublisher(
            client,
            stream,
            "killed",
            batch=50,
            max_resumes=16,
            options=PublishOptions(ack_policy=AckPolicy.ALL, window=16, timeout=1.0),
        )
        thread, result, failure = _in_thread(lambda: publisher.publish(records))
        _wait_until(lambda: _hw(client, stream) >= n // 4, 60, "a quarter of the records")
        cluster.stall_broker(cluster.broker_ids.index(stalled))
        _wait_until(lambda: _tail(client, stream) > 0, 10, "an uncommitted tail")
        tail = _tail(client, stream)
        cluster.kill_broker(cluster.broker_ids.index(part.leader))
        done = _joined(thread, result, failure, 120)
        new_leader = _partition(client, stream).leader
        in_stream, lost, dup = count(records, read_stream(client, stream))
        cluster.resume_broker(cluster.broker_ids.index(stalled))
        cluster.start_broker(cluster.broker_ids.index(part.leader))
        client.close()
    return Figures(
        "cluster: leader killed with an uncommitted tail (exactly-once)",
        "1 follower stalled, then the leader killed (of 3), ack ALL",
        n,
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"tail {tail} when killed; leader {part.leader} -> {new_leader}; written {done.written}, "
        f"resumes {done.resumes}",
    )


#: What waits across a full-cluster restart, for :func:`full_restart`.
WAITERS = ("subscription", "offset trigger", "message sensor", "event trigger")


async def _first_event(trigger: Any) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


def _waiter(kind: str, addresses: list[str], stream: str, target: bytes) -> Callable[[], Any]:
    """A callable that waits for record 3 (``target``) of ``stream`` and returns what it got."""
    import asyncio

    from airflow_provider_liftbridge.sensors.message import LiftbridgeMessageSensor
    from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger
    from airflow_provider_liftbridge.triggers.offset import LiftbridgeOffsetTrigger

    match = {
        "apply_function": "tests.reliability.dag_support.note_and_match",
        "apply_function_kwargs": {"target": target.decode()},
    }
    if kind == "subscription":

        def subscribe() -> list[int]:
            with LiftbridgeClient(addresses, resubscribe_wait=60.0) as reader:
                return [m.offset for m in reader.subscribe(stream, start_at=StartPosition.EARLIEST, stop_at=3)]

        return subscribe
    if kind == "offset trigger":
        return lambda: asyncio.run(_first_event(LiftbridgeOffsetTrigger(stream=stream, target_offset=3)))
    if kind == "message sensor":
        sensor = LiftbridgeMessageSensor(task_id="wait", stream=stream, start_at="earliest", deferrable=True, **match)
        sensor.prepare({})  # type: ignore[arg-type]
        return lambda: asyncio.run(_first_event(sensor.make_trigger({})))  # type: ignore[arg-type]
    if kind == "event trigger":
        trigger = LiftbridgeEventTrigger(stream=stream, start_at="earliest", poll_interval=0.5, **match)
        return lambda: asyncio.run(_first_event(trigger))
    raise ValueError(f"unknown waiter {kind!r}; one of {WAITERS}")


def full_restart(kind: str, down: float = 2.0) -> Figures:
    """Every broker of a three-broker cluster stops for ``down`` seconds and starts again through
    the restart window of a real cluster (metadata without streams, then no leaders and "no such
    stream" on publish, then high watermarks -1) while ``kind`` waits for record 3; the record is
    published once the cluster is back. The waiter must finish successfully.

    The window's first phase is stretched from the real 0.3 s to 2.5 s (no leaders until 3 s,
    high watermarks -1 until 4 s): a waiter retries at most 2 s apart, so every waiter meets it,
    where on the real cluster it is met by chance (2 of 2 subscriptions, 4 of 6 offset triggers).
    """
    from tests.airflow_support import conn_env_name, liftbridge_conn_json

    started = time.monotonic()
    timings = ClusterTimings.fast(restart_no_streams=2.5, restart_no_leaders=3.0, restart_hw_unknown=4.0)
    with DevServer(brokers=3, timings=timings) as cluster:
        env = conn_env_name("liftbridge_default")
        saved = os.environ.get(env)
        os.environ[env] = liftbridge_conn_json(",".join(cluster.addresses), resubscribe_wait=60)
        stream = f"restart-{uuid.uuid4().hex[:8]}"
        records = values(4)
        try:
            client = LiftbridgeClient(cluster.addresses, timeout=10.0, max_retries=8)
            client.create_stream(stream, stream, replication_factor=3)
            client.publish_many(stream, records[:3], ack_policy=AckPolicy.ALL)
            thread, result, failure = _in_thread(_waiter(kind, cluster.addresses, stream, records[3]))
            time.sleep(1.0)  # the waiter is subscribed and waiting for offset 3
            if not thread.is_alive():
                _joined(thread, result, failure, 0)
                raise AssertionError(f"the {kind} finished before the restart")
            cluster.restart_cluster(down=down)
            _publish_when_back(client, stream, records[3])
            got = _joined(thread, result, failure, 60)
            in_stream, lost, dup = count(records, read_stream(client, stream))
            client.close()
        finally:
            if saved is None:
                os.environ.pop(env, None)
            else:
                os.environ[env] = saved
    ok = got == [0, 1, 2, 3] if kind == "subscription" else got.get("status") == "success"
    return Figures(
        f"cluster: full restart under a waiting {kind}",
        f"3 brokers (of 3) down {down:g} s, then the restart window (no streams 2.5 s)",
        len(records),
        in_stream,
        lost,
        dup,
        time.monotonic() - started,
        f"{'finished' if ok else 'FAILED'}: {got if kind == 'subscription' else _brief(got)}",
    )


def _brief(event: dict[str, Any]) -> dict[str, Any]:
    """The event without the message's bytes: its status, error, and the offset it fired on."""
    brief = {k: event[k] for k in ("status", "error_type", "offset") if k in event}
    message = event.get("message")
    brief.update(
        {"offset": message["offset"]} if isinstance(message, dict) else {"message": message} if message else {}
    )
    return brief


def _publish_when_back(client: LiftbridgeClient, stream: str, value: bytes, within: float = 30.0) -> None:
    """Publish ``value`` as a task would right after the restart: the client retries "no such
    stream" for a stream it has seen; beyond its budget this loop keeps trying, for ``within`` s."""
    with bounded("a publish after the restart", within):
        deadline = time.monotonic() + within
        while True:
            try:
                client.publish(stream, value, ack_policy=AckPolicy.ALL)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
