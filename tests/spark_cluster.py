"""Real Spark processes for the tests, started from the installed pyspark: a standalone cluster
(one master, N workers, each its own JVM on loopback) and a Spark Connect server.

Every process is started in its own session with a parent-death signal (``setpriv --pdeathsig``
when available) and stopped by its PID: SIGTERM, then SIGKILL after a grace period. A worker's
SIGTERM also stops the executors it launched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyspark

# Ports drawn below the kernel's ephemeral range: a JVM takes seconds to bind its port, and a port
# from that range (bind to port 0) can be taken meanwhile by any process's outgoing connection;
# Spark then moves to the next port, and the cluster's workers look for the master in vain.
from scripts.deployment import free_port
from tests.margins import bounded

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"


def _process_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Spark daemon: loopback, and no PYTHONPATH (executors must import this
    package from their own environment, not from the test checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "SPARK_HOME")}
    env.update({"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", **(extra or {})})
    return env


def _death_signal() -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


class _Daemon:
    """One JVM started through ``spark-class``, logging to a file, stopped by PID."""

    def __init__(self, name: str, args: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [*_death_signal(), str(SPARK_CLASS), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.process.returncode}; log:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 15.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1.

    :param directory: where logs and the workers' work directories go.
    :param workers: how many workers.
    :param cores: cores each worker offers.
    :param memory: memory each worker offers (``"1g"``).
    """

    def __init__(self, directory: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.directory = directory
        self.port = free_port()
        self.ui_port = free_port(exclude={self.port})
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self._workers = workers
        self._cores = cores
        self._memory = memory
        self._daemons: list[_Daemon] = []

    def start(self, timeout: float = 120.0) -> StandaloneCluster:
        """Start the master and the workers; return once every worker is ALIVE at the master."""
        self.directory.mkdir(parents=True, exist_ok=True)
        # No REST submission server: it would take the fixed port 6066, shared with other runs.
        env = _process_env({"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
        try:
            master = _Daemon(
                "spark master",
                [
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.ui_port),
                ],
                self.directory / "master.log",
                env,
                self.directory,
            )
            self._daemons.append(master)
            for n in range(self._workers):
                work = self.directory / f"worker-{n}"
                work.mkdir(exist_ok=True)
                self._daemons.append(
                    _Daemon(
                        f"spark worker {n}",
                        [
                            "org.apache.spark.deploy.worker.Worker",
                            self.master_url,
                            "--host",
                            "127.0.0.1",
                            "--cores",
                            str(self._cores),
                            "--memory",
                            self._memory,
                            "--webui-port",
                            "0",
                            "--work-dir",
                            str(work),
                        ],
                        self.directory / f"worker-{n}.log",
                        env,
                        work,
                    )
                )
            self._wait_for_workers(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the worker JVMs (their executors and Python workers are their descendants)."""
        return [d.process.pid for d in self._daemons[1:]]

    def alive_workers(self) -> list[dict[str, object]]:
        """The workers the master reports ALIVE (its ``/json`` status page)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as answer:
            status = json.load(answer)
        return [w for w in status.get("workers", []) if w.get("state") == "ALIVE"]

    def _wait_for_workers(self, timeout: float) -> None:
        with bounded("the Spark workers registered", timeout):
            deadline = time.monotonic() + timeout
            while True:
                for daemon in self._daemons:
                    daemon.check_alive()
                try:
                    if len(self.alive_workers()) >= self._workers:
                        return
                except OSError:
                    pass  # the master's UI is not up yet
                except ValueError:
                    # Up, but its /json page not yet: the UI answers any path it does not serve with
                    # its HTML page (seen once in a CI run, right after "Bound MasterWebUI").
                    pass
                if time.monotonic() > deadline:
                    logs = "\n".join(f"--- {d.name}\n{d.tail(15)}" for d in self._daemons)
                    raise TimeoutError(f"{self._workers} Spark workers did not register within {timeout} s:\n{logs}")
                time.sleep(0.5)

    def stop(self) -> None:
        """Stop the workers (and their executors), then the master, by PID."""
        for daemon in reversed(self._daemons):
            daemon.stop()
        self._daemons.clear()


class ConnectServer:
    """A Spark Connect server (``SparkConnectServer`` through ``spark-submit``) on 127.0.0.1.

    :param directory: where its log goes.
    :param master: the Spark master it runs its jobs on.
    :param conf: more Spark settings.
    :param env: more environment variables (``PYSPARK_PYTHON``: the Python of its data sources).
    :param cwd: its working directory (relative ``spark.pyspark.python`` paths resolve there).
    """

    def __init__(
        self,
        directory: Path,
        master: str,
        conf: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.directory = directory
        self._env = dict(env or {})
        self._cwd = cwd or directory
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        self._master = master
        self._conf = dict(conf or {})
        self._daemon: _Daemon | None = None

    def start(self, timeout: float = 120.0) -> ConnectServer:
        """Start the server; return once its gRPC port accepts connections."""
        self.directory.mkdir(parents=True, exist_ok=True)
        conf = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            **self._conf,
        }
        args = ["org.apache.spark.deploy.SparkSubmit", "--master", self._master, "--name", "liftbridge-connect"]
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        args += ["--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "spark-internal"]
        self._daemon = _Daemon(
            "spark connect server", args, self.directory / "connect.log", _process_env(self._env), self._cwd
        )
        deadline = time.monotonic() + timeout
        try:
            with bounded("Spark Connect listening", timeout):
                while True:
                    self._daemon.check_alive()
                    try:
                        with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                            return self
                    except OSError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"Spark Connect did not listen within {timeout} s:\n{self._daemon.tail()}")
                    time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server by PID."""
        if self._daemon is not None:
            self._daemon.stop()
            self._daemon = None
