"""Helpers for tests that start, stop and signal processes of their own: a child run to its end
with no time-out of its own (``run_child``), free ports, a SIGSTOP that waits until the process
really stopped, a killed ``nats-server`` started again on its port, and a NATS cluster of real
``nats-server`` nodes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess
from tests.margins import bounded


def run_child(
    args: Sequence[str], *, capture_output: bool = False, check: bool = False, **popen: Any
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, ...)`` without a time-out of its own: the test's pytest-timeout is
    the hang guard (a second, tighter bound only fails a slow machine: an Airflow child took over
    120 s at load 16). The child runs in a session of its own; if the wait is interrupted (the
    test timed out, KeyboardInterrupt) its whole process group is SIGKILLed before the exception
    goes on, so no child or grandchild outlives the test.
    """
    if "timeout" in popen:
        raise TypeError("run_child takes no timeout: pytest-timeout bounds the test")
    if capture_output:
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    with subprocess.Popen(args, start_new_session=True, **popen) as proc:
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now (bound, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def sigstop(pid: int, within: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until every thread of it has stopped: ``os.kill`` returns before
    the signal reached them all, and a thread still running meanwhile answers (seen: 7 flushes in
    40 got their PONG after ``os.kill`` had returned).

    :raises RuntimeError: the process did not stop within ``within`` seconds.
    """
    os.kill(pid, signal.SIGSTOP)
    with bounded("the process stopped", within):
        deadline = time.monotonic() + within
        while any(
            stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t")
            for stat in Path(f"/proc/{pid}/task").glob("*/stat")
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"process {pid} did not stop within {within:g} s")
            time.sleep(0.001)


def restart_nats(node: NatsServerProcess, within: float = 10.0) -> None:
    """Start a killed ``node`` again on its port, which the system frees a moment after the kill.

    :raises Exception: what ``node.start()`` raised last, once ``within`` seconds have passed.
    """
    with bounded("the port free for a restart", within):
        deadline = time.monotonic() + within
        while True:
            try:
                node.start()
                return
            except Exception:  # the port is not free yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def nats_cluster(n: int = 3, host: str = "127.0.0.1", wrapper: Sequence[str] = ()) -> list[NatsServerProcess]:
    """``n`` ``nats-server`` nodes routed to each other (one NATS cluster), not started yet;
    clients reach them on ``host``, and they run under ``wrapper`` (see ``NatsServerProcess``;
    the routes stay on the loopback of the namespace they run in)."""
    ports = free_ports(2 * n)
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports[n:])
    return [
        NatsServerProcess(
            host,
            port=ports[i],
            extra_args=["--cluster_name", "t", "--cluster", f"nats://127.0.0.1:{ports[n + i]}", "--routes", routes],
            wrapper=wrapper,
        )
        for i in range(n)
    ]
