"""Helpers for tests that start, stop and signal processes of their own: free ports, a SIGSTOP
that waits until the process really stopped, a killed ``nats-server`` started again on its port,
and a NATS cluster of real ``nats-server`` nodes."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

from airflow_provider_liftbridge.devserver.natsproc import NatsServerProcess


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
    deadline = time.monotonic() + within
    while True:
        try:
            node.start()
            return
        except Exception:  # the port is not free yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def nats_cluster(n: int = 3) -> list[NatsServerProcess]:
    """``n`` ``nats-server`` nodes routed to each other (one NATS cluster), not started yet."""
    ports = free_ports(2 * n)
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports[n:])
    return [
        NatsServerProcess(
            port=ports[i],
            extra_args=["--cluster_name", "t", "--cluster", f"nats://127.0.0.1:{ports[n + i]}", "--routes", routes],
        )
        for i in range(n)
    ]
