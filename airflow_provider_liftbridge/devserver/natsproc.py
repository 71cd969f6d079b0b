"""The ``nats-server`` child process: finding the binary, starting it on a port, stopping it.

The child is started through util-linux ``setpriv --pdeathsig KILL`` when that is
available (Linux), so that it dies with the thread that started it even when the
dev server is killed with SIGKILL. A ``preexec_fn`` calling ``prctl`` would do the
same, but it makes Python run its fork hooks, and gRPC's fork hook aborts the
child when gRPC threads are busy. The child runs in its own session so that a
Ctrl-C in a terminal reaches only the dev server, which then stops the child in order.

:meth:`NatsServerProcess.supervise` watches a started child from the event loop and starts
a new one on the same port when it dies (crash, OOM kill, SIGKILL): the dev server's NATS
connection and the publishers' reconnect to it by themselves. Restarts happen on the
loop's thread, because the parent-death signal is tied to the thread that started the child.

:class:`NatsServerSecurity` starts the child with TLS (optionally requiring client certificates)
and with one form of authentication (user/password, token, NKEY, or operator mode: JWT accounts
whose users connect with ``.creds`` files), through a nats-server configuration file, so the
provider's NATS security is tested against a real server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from airflow_provider_liftbridge.extras import install_command, needs_extra
from airflow_provider_liftbridge.nats_security import NatsSecurity

from .errors import DevServerError, NatsServerNotFoundError, NatsServerStartError, PortInUseError, ServerStateError

log = logging.getLogger(__name__)

_LISTEN_RE = re.compile(r"Listening for client connections on (\S+):(\d+)")
_POLL = 0.01


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
        f"the 'devserver' extra brings it: {install_command('devserver')} (or pass --nats-url to use a running "
        "NATS server)"
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


@dataclass(frozen=True)
class NatsServerSecurity:
    """What the nats-server child demands of its clients (nothing set: plain and anonymous).

    :param tls_cert_file: PEM certificate of the server: serve TLS only (needs ``tls_key_file``).
    :param tls_key_file: its private key.
    :param tls_client_ca_file: require client certificates signed by this CA (mutual TLS).
    :param user: the one user allowed in (with ``password``).
    :param password: its password.
    :param token: the token clients must present.
    :param nkey_seed_file: a user NKEY seed file: the server admits the matching public key (read
        with the ``nkeys`` package).
    :param operator_jwt: operator mode (decentralized JWT authentication): the operator's JWT. The
        server admits users whose JWT (in their ``.creds`` file) is signed by an account of
        ``account_jwts``, each signed by this operator.
    :param account_jwts: the accounts' JWTs, preloaded into the server's in-memory resolver.
    :param client: how the dev server itself connects to the child (its credentials, the CA that
        signed ``tls_cert_file``); also what tests hand to clients.
    :raises DevServerError: (on construction) a certificate without its key, a password without a
        user, or more than one form of authentication.
    """

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed_file: str | None = None
    operator_jwt: str | None = None
    account_jwts: tuple[str, ...] = ()
    client: NatsSecurity | None = None

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise DevServerError("NATS TLS needs both a certificate file and its key file; give both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise DevServerError("a NATS client CA (mutual TLS) needs the server's certificate and key files too")
        if bool(self.user) != bool(self.password):
            raise DevServerError("NATS user and password go together; give both or neither")
        if sum(map(bool, (self.user, self.token, self.nkey_seed_file, self.operator_jwt))) > 1:
            raise DevServerError(
                "nats-server takes one form of authentication here: user/password, token, NKEY or operator JWT"
            )
        if bool(self.operator_jwt) != bool(self.account_jwts):
            raise DevServerError("operator mode needs the operator JWT and at least one account JWT; give both")

    def config_text(self, host: str, port: int) -> str:
        """The nats-server configuration file (JSON is valid nats-server configuration syntax)."""
        conf: dict[str, object] = {"host": host, "port": port if port else -1}
        if self.tls_cert_file:
            tls: dict[str, object] = {"cert_file": self.tls_cert_file, "key_file": self.tls_key_file}
            if self.tls_client_ca_file:
                tls |= {"ca_file": self.tls_client_ca_file, "verify": True}
            conf["tls"] = tls
        if self.user:
            conf["authorization"] = {"user": self.user, "password": self.password}
        elif self.token:
            conf["authorization"] = {"token": self.token}
        elif self.nkey_seed_file:
            conf["authorization"] = {"users": [{"nkey": _nkey_public_key(self.nkey_seed_file)}]}
        elif self.operator_jwt:
            conf["operator"] = self.operator_jwt
            conf["resolver"] = "MEMORY"
            conf["resolver_preload"] = {_jwt_subject(token): token for token in self.account_jwts}
        return json.dumps(conf, indent=2)


def _jwt_subject(token: str) -> str:
    """The ``sub`` claim of a JWT (an account's public key), read without checking the signature
    (nats-server checks it)."""
    try:
        claims = token.split(".")[1]
        return str(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["sub"])
    except (IndexError, ValueError, KeyError) as exc:
        raise DevServerError(f"an account JWT cannot be read ({exc}); give the JWT text, not a file path") from exc


def _nkey_public_key(seed_file: str) -> str:
    with needs_extra("nats-nkeys", "an NKEY-protected nats-server"):
        import nkeys  # type: ignore[import-untyped]
    try:
        seed = Path(seed_file).read_bytes().strip()
        return str(nkeys.from_seed(seed).public_key.decode())
    except Exception as exc:  # nkeys raises its own types for a malformed seed
        raise DevServerError(f"cannot read the NKEY seed in {seed_file!r}: {exc}") from exc


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
    :param security: TLS and authentication the child demands (``None``: plain, anonymous).
    :param extra_args: more command-line options (e.g. ``--cluster``, ``--routes`` and
        ``--cluster_name`` for a node of a NATS cluster); not with ``security``.
    :param wrapper: a command the child runs under, e.g. ``["ip", "netns", "exec", "ns1"]`` to
        serve from a network namespace (it must exec nats-server, so :attr:`pid` stays its pid;
        the port is then not checked from here, where ``host`` may not exist).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        binary: str | None = None,
        security: NatsServerSecurity | None = None,
        extra_args: Sequence[str] = (),
        wrapper: Sequence[str] = (),
    ) -> None:
        self.wrapper = tuple(wrapper)
        self.host = host
        self.port = port
        self.binary = binary
        self.security = security
        self.extra_args = tuple(extra_args)
        self._conf_path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self._watcher: asyncio.Task[None] | None = None
        #: How many times :meth:`supervise` restarted a dead child.
        self.restarts = 0

    @property
    def url(self) -> str:
        """The client URL (``tls://`` when the child serves TLS)."""
        scheme = "tls" if self.security is not None and self.security.tls_cert_file else "nats"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        """Whether the child is running (false before :meth:`start`, after :meth:`stop` or once it died)."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> str:
        """Start the child and wait until it accepts clients; return its URL.

        :raises NatsServerNotFoundError: no binary.
        :raises PortInUseError: the port is taken.
        :raises NatsServerStartError: the child exited or was not ready within ``timeout``.
        """
        deadline = self._spawn(timeout)
        while (url := self._ready(deadline, timeout)) is None:
            time.sleep(_POLL)
        return url

    async def start_async(self, timeout: float = 10.0) -> str:
        """:meth:`start` without blocking the running event loop while the child gets ready.

        :raises NatsServerNotFoundError, PortInUseError, NatsServerStartError: as :meth:`start`.
        """
        deadline = self._spawn(timeout)
        while (url := self._ready(deadline, timeout)) is None:
            await asyncio.sleep(_POLL)
        return url

    def _spawn(self, timeout: float) -> float:
        """Launch the child (its output goes to a temporary log file); return the readiness deadline."""
        binary = self.binary or find_nats_server()
        if not self.wrapper:
            check_port_free(self.host, self.port, "NATS")
        fd, name = tempfile.mkstemp(prefix="liftbridge-devserver-nats-", suffix=".log")
        self._log_path = Path(name)
        if self.security is None:
            args = [
                *self.wrapper,
                *_parent_death_wrapper(),
                binary,
                "-a",
                self.host,
                "-p",
                str(self.port or -1),
                *self.extra_args,
            ]
        else:
            conf_fd, conf_name = tempfile.mkstemp(prefix="liftbridge-devserver-nats-", suffix=".conf")
            with os.fdopen(conf_fd, "w") as conf:
                conf.write(self.security.config_text(self.host, self.port))
            self._conf_path = Path(conf_name)
            args = [*self.wrapper, *_parent_death_wrapper(), binary, "-c", conf_name]
        with os.fdopen(fd, "wb") as log_file:
            self._proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True
            )
        return time.monotonic() + timeout

    def _ready(self, deadline: float, timeout: float) -> str | None:
        """The URL once the child's log says it is ready, ``None`` while it is still starting.

        :raises PortInUseError, NatsServerStartError: it exited, or ``deadline`` passed.
        """
        assert self._proc is not None and self._log_path is not None
        text = self._log_path.read_text(errors="replace")
        match = _LISTEN_RE.search(text)
        if match and "Server is ready" in text:
            self.port = int(match.group(2))
            return self.url
        if self._proc.poll() is not None:
            self._proc = None
            self._cleanup_log()
            if "address already in use" in text:
                raise PortInUseError(f"NATS port {self.port} on {self.host} is already in use; choose another port")
            raise NatsServerStartError(f"nats-server exited before it was ready: {text.strip()[-500:]}")
        if time.monotonic() > deadline:
            self._terminate()
            raise NatsServerStartError(f"nats-server was not ready after {timeout:.0f}s: {text.strip()[-500:]}")
        return None

    # -- supervision ------------------------------------------------------------
    def supervise(
        self, *, check_every: float = 0.1, max_attempts: int = 10, backoff: float = 0.1, max_backoff: float = 2.0
    ) -> None:
        """Restart the child on its port whenever it dies, from the running event loop, until :meth:`stop`.

        A restart that fails (the port was taken meanwhile, the binary is gone, ...) is retried
        after ``backoff`` seconds, doubling up to ``max_backoff``; after ``max_attempts`` failed
        attempts in a row the supervision gives up and logs an error. Every death and restart is logged.

        :param check_every: seconds between liveness checks.
        :raises ServerStateError: the child was never started.
        :raises RuntimeError: no event loop is running in this thread.
        """
        if self._proc is None:
            raise ServerStateError("start the nats-server child before supervising it")
        if self._watcher is not None and not self._watcher.done():
            return
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch(check_every, max_attempts, backoff, max_backoff), name="nats-server supervisor"
        )

    async def _watch(self, check_every: float, max_attempts: int, backoff: float, max_backoff: float) -> None:
        while True:
            await asyncio.sleep(check_every)
            proc = self._proc
            if proc is None or proc.poll() is None:
                continue
            log.warning(
                "the nats-server child (pid %d, port %d) exited with code %s; restarting it on the same port",
                proc.pid,
                self.port,
                proc.returncode,
            )
            self._proc = None
            self._cleanup_log()
            if not await self._restart(max_attempts, backoff, max_backoff):
                return

    async def _restart(self, max_attempts: int, backoff: float, max_backoff: float) -> bool:
        """Start a new child on the same port, retrying with backoff; whether one came up."""
        wait = backoff
        for attempt in range(1, max_attempts + 1):
            try:
                await self.start_async()
            except DevServerError as exc:
                log.warning("restarting nats-server failed (attempt %d of %d): %s", attempt, max_attempts, exc)
                await asyncio.sleep(wait)
                wait = min(wait * 2, max_backoff)
                continue
            self.restarts += 1
            log.warning("nats-server restarted on %s (pid %s, restart %d)", self.url, self.pid, self.restarts)
            return True
        log.error(
            "gave up restarting nats-server on %s after %d attempts; NATS publishing and acks stay down "
            "until the dev server is restarted",
            self.url,
            max_attempts,
        )
        return False

    def stop(self, timeout: float = 5.0) -> None:
        """Stop supervising and stop the child (SIGTERM, then SIGKILL after ``timeout``). Safe to call twice."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
        self._terminate(timeout)
        self._cleanup_log()

    def kill(self) -> None:
        """SIGKILL the child and wait for it (a node dying without a word); :meth:`stop` cleans up."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def _terminate(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _cleanup_log(self) -> None:
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None
        if self._conf_path is not None:
            self._conf_path.unlink(missing_ok=True)
            self._conf_path = None
