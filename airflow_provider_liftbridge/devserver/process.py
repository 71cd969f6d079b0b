"""The dev server as a child process: :class:`DevServerProcess` runs the CLI so it can be SIGKILLed
and restarted, and :func:`parse_ready_line` reads the line the CLI prints once it serves.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from .config import GRPC_TRANSPORTS
from .errors import DevServerError, ServerStateError
from .model import ClusterTimings, broker_id

READY_PREFIX = "liftbridge-devserver ready"


def parse_ready_line(line: str) -> tuple[list[str], str]:
    """Read the broker addresses and the NATS URL from the CLI's ready line.

    :raises DevServerError: ``line`` is not a ready line.
    """
    if not line.startswith(READY_PREFIX):
        raise DevServerError(f"not a dev-server ready line: {line!r}")
    fields = dict(tok.split("=", 1) for tok in line[len(READY_PREFIX) :].split() if "=" in tok)
    try:
        return fields["grpc"].split(","), fields["nats"]
    except KeyError as exc:
        raise DevServerError(f"ready line lacks {exc}: {line!r}") from exc


class DevServerProcess:
    """The dev server as a child process (``python -m airflow_provider_liftbridge.devserver``).

    The first :meth:`start` picks free ports; later starts reuse them and the same data
    directory, so a :meth:`kill` (SIGKILL, which also takes the NATS child down) followed by
    :meth:`start` is a crash and restart.

    :param data_dir: data directory (kept across restarts; not removed).
    :param brokers: number of brokers.
    :param host: listen address.
    :param nats_url: an external NATS server instead of a child.
    :param fsync: pass ``--fsync``.
    :param startup_timeout: seconds to wait for the ready line.
    :param grpc_transport: ``--grpc-transport`` (default: the child's default, normally ``h2``).
    :param tls_cert_file: ``--tls-cert``.
    :param tls_key_file: ``--tls-key``.
    :param tls_client_ca_file: ``--tls-client-ca``.
    :param timings: cluster mode's time-outs, minimum ISR and restart window (the ``--replica-*``,
        ``--min-insync-replicas`` and ``--restart-window`` options); default: Liftbridge's.
    :param wrapper: a command the child runs under, e.g. ``["ip", "netns", "exec", "ns1"]`` to serve
        from a network namespace (the wrapper must exec the server, so :attr:`pid` stays its pid).

    The child reads fault commands on its stdin (``--control stdin``), so the cluster fault hooks of
    :class:`DevServer` work on it too: :meth:`stall_broker`, :meth:`resume_broker`,
    :meth:`kill_broker`, :meth:`start_broker`, :meth:`stop_broker`, :meth:`restart_cluster`,
    :meth:`move_metadata_leader`, and :attr:`metadata_leader` asks which broker leads.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        brokers: int = 1,
        host: str = "127.0.0.1",
        nats_url: str | None = None,
        *,
        fsync: bool = False,
        startup_timeout: float = 30.0,
        grpc_transport: str | None = None,
        tls_cert_file: str | os.PathLike[str] | None = None,
        tls_key_file: str | os.PathLike[str] | None = None,
        tls_client_ca_file: str | os.PathLike[str] | None = None,
        timings: ClusterTimings | None = None,
        wrapper: Sequence[str] = (),
    ) -> None:
        self._wrapper = list(wrapper)
        if grpc_transport is not None and grpc_transport not in GRPC_TRANSPORTS:
            raise ValueError(f"unknown gRPC transport {grpc_transport!r}; choose one of {', '.join(GRPC_TRANSPORTS)}")
        self.grpc_transport = grpc_transport
        self._extra_args: list[str] = []
        for flag, value in (
            ("--tls-cert", tls_cert_file),
            ("--tls-key", tls_key_file),
            ("--tls-client-ca", tls_client_ca_file),
        ):
            if value is not None:
                self._extra_args += [flag, os.fspath(value)]
        if timings is not None:
            self._extra_args += [
                "--replica-max-lag-time",
                str(timings.replica_max_lag_time),
                "--replica-max-leader-timeout",
                str(timings.replica_max_leader_timeout),
                "--min-insync-replicas",
                str(timings.min_insync_replicas),
                "--restart-window",
                timings.restart_window(),
                "--metadata-election-timeout",
                str(timings.metadata_election_timeout),
                "--metadata-cache-max-age",
                str(timings.metadata_cache_max_age),
                "--stream-propagation",
                str(timings.stream_propagation),
                "--replica-max-idle-wait",
                str(timings.replica_max_idle_wait),
                "--hw-checkpoint-interval",
                str(timings.hw_checkpoint_interval),
            ]
        self.data_dir = Path(data_dir)
        self.brokers = brokers
        self.host = host
        self._external_nats = nats_url
        self.fsync = fsync
        self.startup_timeout = startup_timeout
        self._ports: list[int] = [0] * brokers
        self._nats_port = 0
        self._addresses: list[str] = []
        self._nats_url = nats_url or ""
        self._proc: subprocess.Popen[str] | None = None
        #: The child's last ready line (addresses, NATS URL, data directory, ``tls=on``).
        self.ready_line = ""
        self._stderr_path = Path(tempfile.mkstemp(prefix="liftbridge-devserver-", suffix=".log")[1])

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    @property
    def address(self) -> str:
        if not self._addresses:
            raise ServerStateError("the dev server process has not been started")
        return self._addresses[0]

    @property
    def nats_url(self) -> str:
        return self._nats_url

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def stderr_log(self) -> Path:
        """File that receives the child's log output."""
        return self._stderr_path

    def start(self) -> DevServerProcess:
        """Start (or restart) the child and wait for its ready line.

        :raises DevServerError: the child exited or printed no ready line in time (its log is in the message).
        """
        if self._proc is not None and self._proc.poll() is None:
            raise ServerStateError("the dev server process is already running")
        args = [
            *self._wrapper,
            sys.executable,
            "-m",
            "airflow_provider_liftbridge.devserver",
            "--host",
            self.host,
            "--data-dir",
            str(self.data_dir),
            "--brokers",
            str(self.brokers),
            "--ports",
            ",".join(map(str, self._ports)),
        ]
        if self._external_nats:
            args += ["--nats-url", self._external_nats]
        else:
            args += ["--nats-port", str(self._nats_port)]
        if self.fsync:
            args.append("--fsync")
        if self.grpc_transport is not None:
            args += ["--grpc-transport", self.grpc_transport]
        args += self._extra_args
        args += ["--control", "stdin"]
        with open(self._stderr_path, "ab") as err:
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.PIPE, text=True)
        line = self.ready_line = self._read_ready_line(self._proc)
        self._addresses, self._nats_url = parse_ready_line(line)
        self._ports = [int(a.rsplit(":", 1)[1]) for a in self._addresses]
        if not self._external_nats:
            self._nats_port = int(self._nats_url.rsplit(":", 1)[1])
        return self

    def _read_ready_line(self, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=0.1):
                    line = proc.stdout.readline()
                    if line.startswith(READY_PREFIX):
                        return line.strip()
                    if not line and proc.poll() is not None:
                        break
                elif proc.poll() is not None:
                    break
        self._terminate(proc, signal.SIGKILL)
        tail = self._stderr_path.read_text(errors="replace")[-1500:]
        raise DevServerError(f"the dev server process did not become ready (exit code {proc.returncode}): {tail}")

    # -- cluster fault hooks (see DevServer) -------------------------------------
    def stall_broker(self, index: int) -> None:
        """Freeze broker ``index`` like SIGSTOP (see :meth:`DevServer.stall_broker`).

        :raises DevServerError: the child refused the command (single broker, no such broker) or is not running.
        """
        self._command(f"stall {index}")

    def resume_broker(self, index: int) -> None:
        """Let a stalled broker run again (see :meth:`DevServer.resume_broker`)."""
        self._command(f"resume {index}")

    def cut_broker_from_nats(self, index: int, kind: str = "cut") -> None:
        """Cut broker ``index`` off from NATS and its peers (see :meth:`DevServer.cut_broker_from_nats`)."""
        self._command(f"cut-nats {index} {kind}")

    def cut_broker_from_peers(self, index: int, kind: str = "cut") -> None:
        """Cut broker ``index`` off from its peers (see :meth:`DevServer.cut_broker_from_peers`)."""
        self._command(f"cut-peers {index} {kind}")

    def heal_broker(self, index: int) -> None:
        """Heal a broker's cut (see :meth:`DevServer.heal_broker`)."""
        self._command(f"heal {index}")

    def kill_broker(self, index: int) -> None:
        """Kill one broker like SIGKILL (see :meth:`DevServer.kill_broker`); :meth:`start_broker` brings it back."""
        self._command(f"kill {index}")

    def start_broker(self, index: int) -> None:
        """Serve a stopped or killed broker again (see :meth:`DevServer.start_broker`)."""
        self._command(f"start {index}")

    def stop_broker(self, index: int) -> None:
        """Stop one broker cleanly (see :meth:`DevServer.stop_broker`)."""
        self._command(f"stop {index}")

    def move_metadata_leader(self, index: int) -> None:
        """Make broker ``index`` the metadata leader (see :meth:`DevServer.move_metadata_leader`)."""
        self._command(f"metadata-leader {index}")

    def replace_history(self, stream: str, partition: int, index: int, keep_to: int) -> int:
        """Replace a partition's history from broker ``index`` (see :meth:`DevServer.replace_history`)."""
        return int(self._command(f"replace-history {stream} {partition} {index} {keep_to}"))

    @property
    def metadata_leader(self) -> int:
        """Index of the metadata leader, asked of the child (see :meth:`DevServer.metadata_leader`).

        :raises DevServerError: a single-broker server, or the child is not running.
        """
        return int(self._command("metadata-leader"))

    def set_reception_clock(self, stream: str, at: dt.datetime | None) -> None:
        """Stamp ``stream``'s next messages as if the child's clock read ``at`` now (``None``: the
        real clock); see :func:`~.clock.set_reception_clock`.

        :raises DevServerError: ``at`` is naive, or the child is not running.
        """
        self._command(f"clock {stream} {at.isoformat() if at is not None else 'real'}")

    @property
    def broker_ids(self) -> list[str]:
        """Broker ids as FetchMetadata reports them, in broker order."""
        return [broker_id(i) for i in range(self.brokers)]

    def restart_cluster(self, down: float = 0.0) -> None:
        """Restart every broker inside the child process through the restart window (see
        :meth:`DevServer.restart_cluster`; :meth:`kill` then :meth:`start` restarts the process instead)."""
        self._command(f"restart {down}", timeout=30.0 + down)

    def _command(self, line: str, timeout: float = 30.0) -> str:
        """Send ``line`` on the control channel; return what the child answered after ``ok LINE:``
        (empty for a fault command)."""
        proc = self._proc
        if proc is None or proc.poll() is not None or proc.stdin is None or proc.stdout is None:
            raise ServerStateError("the dev server process is not running; call start() first")
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=0.1):
                    if proc.poll() is not None:
                        break
                    continue
                reply = proc.stdout.readline().strip()
                if reply == f"ok {line}":
                    return ""
                if reply.startswith(f"ok {line}: "):
                    return reply[len(f"ok {line}: ") :]
                if reply.startswith(f"error {line}"):
                    raise DevServerError(f"the dev server refused {line!r}: {reply.split(': ', 1)[-1]}")
                if not reply and proc.poll() is not None:
                    break
        raise DevServerError(f"no answer from the dev server process to {line!r} within {timeout:.0f}s")

    def kill(self) -> None:
        """SIGKILL the server (no clean shutdown; its NATS child dies with it) and wait until its ports are free."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc, signal.SIGKILL)
        self._wait_ports_free()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server cleanly (SIGTERM; SIGKILL after ``timeout``). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc, signal.SIGTERM, timeout)
            self._wait_ports_free()

    def _terminate(self, proc: subprocess.Popen[str], sig: int, timeout: float = 10.0) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdout, proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def _wait_ports_free(self, timeout: float = 10.0) -> None:
        ports = [p for p in self._ports if p]
        if not self._external_nats and self._nats_port:
            ports.append(self._nats_port)
        deadline = time.monotonic() + timeout
        for port in ports:
            while time.monotonic() < deadline:
                with socket.socket() as sock:
                    if sock.connect_ex((self.host, port)) != 0:
                        break
                time.sleep(0.02)

    def close(self) -> None:
        """Stop the child and remove its log file."""
        self.stop()
        self._stderr_path.unlink(missing_ok=True)

    def __enter__(self) -> DevServerProcess:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
