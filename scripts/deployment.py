"""A real Airflow 3 deployment on this machine, with a Liftbridge dev server beside it.

Shared by ``tests/system/`` and ``scripts/demo.py --ui``. What it starts, each as its own process
(stopped by PID, children such as ``airflow serve-logs`` included):

* the dev server (``python -m airflow_provider_liftbridge.devserver``, with its nats-server child);
* ``airflow api-server --apps core`` (UI and REST API), ``airflow api-server --apps execution``
  (the execution API the task workers and the triggerer talk to; see :data:`COMPONENTS` for why
  it is a process of its own), ``airflow scheduler`` (LocalExecutor, SQLite),
  ``airflow dag-processor`` and ``airflow triggerer``.

The ``AIRFLOW_HOME`` is a directory of its own: ``airflow.db`` (SQLite), ``airflow.cfg`` (written by
``airflow db migrate``, holding the JWT secret every component must share), ``logs/`` (one
``<component>.log`` per process, Airflow's task logs under it). The ``liftbridge_default``
connection is stored in the metadata database, so the UI lists it and the triggerer reads it
through the API. The UI login is the simple auth manager's user ``admin`` with the password
``admin`` (written to the passwords file before the api-server starts).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_DAGS = REPO / "dags_examples"
#: The Airflow processes, in start order. The execution API runs apart from the UI / REST API
#: (``api-server``): on Airflow 3.3.2 the REST API's audit log (``action_logging``, on every POST,
#: PATCH and DELETE) is an async dependency that commits through a sync session, so while it waits
#: for SQLite's write lock the api-server's event loop stands still. In one process with the
#: execution API that is a deadlock whenever a worker's execution call (an XCom push, say) holds
#: the write lock: its session is committed by a step the stalled event loop has to schedule. Both
#: then wait out SQLite's busy timeout (60 s here) and the REST call fails with "database is
#: locked" (HTTP 500), while the scheduler and triggerer stall on the lock. In two processes the
#: audit log only waits until the worker's call has committed.
COMPONENTS = ("api-server", "execution-api", "scheduler", "dag-processor", "triggerer")
USERNAME = "admin"
PASSWORD = "admin"  # a dev deployment on 127.0.0.1 only; the simple auth manager is not for production
#: A read-only user (the simple auth manager's viewer role), for the UI's refusal tests.
VIEWER = "viewer"
VIEWER_PASSWORD = "viewer"

_T = TypeVar("_T")


class DeploymentError(Exception):
    """A step of starting or driving the deployment failed; the message says which and where the logs are."""


#: Where free_port() looks: above the well-known services, below Linux's ephemeral range.
PORT_RANGE = (10_000, 32_768)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for outgoing connections and ``bind(port 0)``."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return PORT_RANGE[1]


def free_port(exclude: Collection[int] = ()) -> int:
    """A TCP port nothing is bound to right now, on any address (log servers bind all of them).

    Drawn at random below the kernel's ephemeral range: the many client connections of the
    deployment's own processes take their local ports from that range, so none of them can land
    on the port between this check and the server's bind, and two deployments started at the
    same time are unlikely to draw the same port (the bind check catches one already bound).

    :raises DeploymentError: no free port found in a few hundred tries.
    """
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], _ephemeral_low())
    if high - low < 1000:  # an ephemeral range reaching down here: take PORT_RANGE as it is
        high = PORT_RANGE[1]
    for port in random.SystemRandom().sample(range(low, high), 400):
        if port in exclude:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))  # no SO_REUSEADDR: a port in TIME_WAIT counts as taken
            except OSError:
                continue
            return port
    raise DeploymentError(f"no free TCP port found in {low}-{high}")


def airflow_command() -> list[str]:
    """The ``airflow`` CLI of this interpreter's environment."""
    candidate = Path(sys.executable).with_name("airflow")
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "airflow"]


#: Called by :func:`wait_until` with (what was awaited, seconds used, the deadline, timed out)
#: after each wait; the tests' margin report (tests/margins.py) sets it.
on_wait: Callable[..., None] | None = None


def wait_until(what: str, check: Callable[[], _T | None], timeout: float, interval: float = 0.5) -> _T:
    """Call ``check`` until it returns something other than ``None``/``False``; return that.

    :raises DeploymentError: ``timeout`` seconds passed first (``what`` says what was awaited).
    """
    start = time.monotonic()
    while True:
        result = check()
        used = time.monotonic() - start
        if result is not None and result is not False:
            if on_wait is not None:
                on_wait(what, used, timeout, timed_out=False)
            return result
        if used > timeout:
            if on_wait is not None:
                on_wait(what, used, timeout, timed_out=True)
            raise DeploymentError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _descendants(pid: int) -> list[int]:
    """PIDs of a process's children, grandchildren, ... (from /proc; empty once it is gone)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    found.append(int(child))
                    todo.append(int(child))
    return found


def _signal_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until the processes are gone (reaped, or zombies of a parent that will reap them);
    return those still alive."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.1)
    return alive


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@dataclass
class Component:
    """One Airflow process of the deployment."""

    name: str
    args: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    #: Settings of this process only, over the deployment's (e.g. a second api-server's base URL).
    env: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Deployment:
    """Dev server + api-server, scheduler, dag-processor and triggerer as separate processes.

    :param home: the AIRFLOW_HOME (created; kept: the caller decides when to remove it).
    :param dags_folder: the DAGs folder (default: the example DAGs).
    :param api_port: the api-server's port, UI and REST API (default: a free one).
    :param config: more ``AIRFLOW__SECTION__KEY`` environment settings for every component.

    The log servers of the scheduler (LocalExecutor task logs) and the triggerer get free ports
    too, not Airflow's fixed 8793 and 8794: another Airflow on the machine (or a second
    deployment) holding those would leave this one without them, and its api-server would fetch
    logs of running tasks from the other one's.
    """

    home: Path
    dags_folder: Path = EXAMPLE_DAGS
    api_port: int = 0
    execution_api_port: int = field(default=0, init=False)
    worker_log_port: int = field(default=0, init=False)
    trigger_log_port: int = field(default=0, init=False)
    config: dict[str, str] = field(default_factory=dict)
    components: dict[str, Component] = field(default_factory=dict, init=False)
    devserver: Any = field(default=None, init=False)
    _token: str | None = field(default=None, init=False)
    #: The JWT secret every component shares: 64 random bytes, as HS512 (Airflow's choice for a
    #: secret) wants; the one ``airflow db migrate`` writes is 16 and PyJWT warns of it.
    jwt_secret: str = field(default_factory=lambda: secrets.token_urlsafe(64), init=False, repr=False)

    @property
    def url(self) -> str:
        """The UI and REST API address."""
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def execution_api_url(self) -> str:
        """Where task workers and the triggerer reach the execution API."""
        return f"http://127.0.0.1:{self.execution_api_port}/execution/"

    @property
    def db_path(self) -> Path:
        return self.home / "airflow.db"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    # -- start and stop ------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment of every Airflow process: this deployment's settings only (whatever the
        calling process has in ``AIRFLOW__*``/``AIRFLOW_CONN_*`` is left out), the repository first
        on ``PYTHONPATH``."""
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AIRFLOW__", "AIRFLOW_CONN_", "AIRFLOW_VAR_")) and k != "AIRFLOW_HOME"
        }
        python_path = [str(REPO)] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
        settings = {
            "AIRFLOW_HOME": str(self.home),
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(python_path)),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", "")]),
            "PYSPARK_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            # SQLite allows one writer at a time; under load the triggerer (storing asset events)
            # and the scheduler wait for each other longer than pysqlite's default 5 s, and
            # "database is locked" ends the triggerer.
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.db_path}?timeout=60",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            # Task workers reach the execution API here; without it they look on port 8080 and fail.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": self.execution_api_url,
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self.worker_log_port),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(self.trigger_log_port),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin,{VIEWER}:viewer",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",
            "AIRFLOW__API_AUTH__JWT_SECRET": self.jwt_secret,
            # A killed triggerer's triggers move to the next one once its heartbeat is this old.
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            # Airflow 3.3.2 fails a resumed deferred task when the scheduler reads the worker's
            # "success" of the deferral after the resumed attempt is already running (Airflow
            # issue #72716). The worker reports that exit up to min_heartbeat_interval (5 s) late;
            # at 1 s the report comes before the trigger has fired and the task is queued again.
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            # A worker's call to the execution API times out after 5 s by default and is then
            # sent again; a slow first `/run` (the api-server stalled 25 s at load 13 here) that
            # succeeded makes its retry a 400 and the task fails before it starts.
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        }
        return base | settings | self.config

    def start(self) -> Deployment:
        """Start everything and wait until the api-server answers and the DAGs are parsed.

        :raises DeploymentError: a step failed (the message names the log to read).
        """
        from airflow_provider_liftbridge.devserver import DevServerProcess

        self.home.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        if not self.api_port:
            self.api_port = free_port()
        self.execution_api_port = free_port(exclude={self.api_port})
        self.worker_log_port = free_port(exclude={self.api_port, self.execution_api_port})
        self.trigger_log_port = free_port(exclude={self.api_port, self.execution_api_port, self.worker_log_port})
        self.devserver = DevServerProcess(self.home / "liftbridge-data").start()
        self.run_cli(["db", "migrate"], timeout=300)
        self.run_cli(["connections", "add", "liftbridge_default", "--conn-json", json.dumps(self.connection())])
        (self.home / "passwords.json").write_text(json.dumps({USERNAME: PASSWORD, VIEWER: VIEWER_PASSWORD}) + "\n")
        api_server = ["api-server", "--host", "127.0.0.1", "--port"]
        for name in COMPONENTS:
            args = {
                "api-server": [*api_server, str(self.api_port), "--apps", "core"],
                "execution-api": [*api_server, str(self.execution_api_port), "--apps", "execution"],
            }.get(name, [name])
            self.components[name] = Component(name, args, self.log_dir / f"{name}.log")
        self.start_component("api-server")
        self.start_component("execution-api")
        wait_until("the api-servers", self._api_up, timeout=180)
        for name in COMPONENTS[2:]:
            self.start_component(name)
        return self

    def connection(self) -> dict[str, Any]:
        """The ``liftbridge_default`` connection (the dev server and its NATS server)."""
        return {
            "conn_type": "liftbridge",
            "host": self.devserver.address,
            "extra": {"nats_servers": self.devserver.nats_url, "timeout": 10},
        }

    def start_component(self, name: str) -> Component:
        """Start (or restart) one Airflow process; its output is appended to its log."""
        component = self.components[name]
        if component.running():
            raise DeploymentError(f"{name} is already running (pid {component.pid})")
        with component.log.open("ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} starting airflow {' '.join(component.args)}\n".encode())
            out.flush()
            # Its own session: a Ctrl-C in the demo's terminal reaches the demo only, which then
            # stops every process in order.
            component.proc = subprocess.Popen(
                airflow_command() + component.args,
                env=self.env() | component.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return component

    def stop_component(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        """Stop one Airflow process and its children (``serve-logs``, the trigger runner, task
        workers), by PID. ``SIGTERM``: a graceful stop, the children get what is left of
        ``timeout`` after the process exits. ``SIGKILL``: the process and its children at once,
        like a crash of the whole machine or container."""
        component = self.components[name]
        proc, component.proc = component.proc, None
        if proc is None:
            return
        children = _descendants(proc.pid)
        with component.log.open("ab") as out:
            out.write(f"\n=== {time.strftime('%H:%M:%S')} sending {signal.Signals(sig).name} to {proc.pid}\n".encode())
        if sig == signal.SIGKILL:
            _signal_pids([proc.pid, *children], signal.SIGKILL)
        else:
            _signal_pids([proc.pid], sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        children = list(dict.fromkeys(children + _descendants(proc.pid)))
        _signal_pids([p for p in children if _alive(p)], signal.SIGTERM)
        _signal_pids(_wait_gone(children, 10), signal.SIGKILL)

    def stop(self) -> None:
        """Stop every process (Airflow's first, then the dev server). Idempotent."""
        for name in reversed(COMPONENTS):
            if name in self.components:
                try:
                    self.stop_component(name)
                except Exception as exc:  # keep stopping the others
                    print(f"deployment: stopping {name} failed: {exc}", file=sys.stderr)
        if self.devserver is not None:
            self.devserver.stop()

    def __enter__(self) -> Deployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_running(self) -> None:
        """:raises DeploymentError: a process of the deployment has exited."""
        for component in self.components.values():
            if component.proc is not None and component.proc.poll() is not None:
                raise DeploymentError(
                    f"airflow {component.name} exited with {component.proc.returncode} (log: {component.log})"
                )

    def run_cli(self, args: list[str], timeout: float = 120) -> str:
        """Run an ``airflow`` CLI command in this deployment; return its output.

        :raises DeploymentError: it failed or ran past ``timeout``.
        """
        log = self.log_dir / "cli.log"
        try:
            result = subprocess.run(
                airflow_command() + args,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DeploymentError(f"'airflow {args[0]} ...' did not finish within {timeout:.0f}s") from None
        with log.open("a") as out:
            out.write(f"\n$ airflow {' '.join(args)}\n{result.stdout}{result.stderr}")
        if result.returncode != 0:
            raise DeploymentError(
                f"'airflow {' '.join(args)}' exited with {result.returncode}: {result.stderr[-1500:]}"
            )
        return result.stdout

    # -- REST API --------------------------------------------------------------------------------

    def _api_up(self) -> bool:
        """Both APIs answer: the REST API, and the execution API the workers call (asked here so
        its first, slow answer is not a worker's)."""
        self.check_running()
        try:
            for url in (f"{self.url}/api/v2/monitor/health", f"{self.execution_api_url}health"):
                with urllib.request.urlopen(url, timeout=30) as response:
                    if response.status != 200:
                        return False
            return True
        except (urllib.error.URLError, OSError):
            return False

    def token(self) -> str:
        """A JWT for the REST API, from the simple auth manager's login (user ``admin``)."""
        if self._token is None:
            body = self._request("POST", "/auth/token", {"username": USERNAME, "password": PASSWORD}, auth=False)
            self._token = str(body["access_token"])
        return self._token

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the REST API (``path`` under ``/api/v2``); return the decoded JSON answer.

        :raises DeploymentError: an HTTP error (its status and body are in the message).
        """
        return self._request(method, f"/api/v2{path}", body)

    def _request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token()}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise DeploymentError(
                f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}"
            ) from None
        return json.loads(text) if text else None

    def wait_for_dags(self, dag_ids: list[str], timeout: float = 180) -> None:
        """Wait until the dag-processor has parsed these DAGs (the REST API lists them)."""

        def parsed() -> bool:
            self.check_running()
            listed = {d["dag_id"] for d in self.api("GET", "/dags?limit=100")["dags"]}
            return set(dag_ids) <= listed

        wait_until(f"the DAGs {dag_ids} to be parsed", parsed, timeout)

    def trigger_dag(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        """Start a run through the REST API; return its run id."""
        body = self.api("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})
        return str(body["dag_run_id"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        """Wait until a run is finished; return its state (``success`` or ``failed``)."""

        def finished() -> str | None:
            self.check_running()
            state = str(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])
            return state if state in ("success", "failed") else None

        return wait_until(f"run {run_id} of {dag_id} to finish", finished, timeout, interval=1)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        """Task id -> state of one run."""
        body = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")
        return {ti["task_id"]: ti["state"] for ti in body["task_instances"]}

    def task_tries(self, dag_id: str, run_id: str) -> dict[str, int]:
        """Task id -> try number of one run (1 unless the task was retried)."""
        body = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")
        return {ti["task_id"]: int(ti["try_number"]) for ti in body["task_instances"]}

    # -- reading what happened -----------------------------------------------------------------

    @contextlib.contextmanager
    def db(self) -> Iterator[sqlite3.Connection]:
        """A read connection to the metadata database (for counting asset events)."""
        connection = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=30)
        try:
            yield connection
        finally:
            connection.close()

    def asset_events(self, asset_name: str) -> list[dict[str, Any]]:
        """The asset events of an asset, oldest first: ``{"id", "timestamp", "payload"}``."""
        with self.db() as db:
            rows = db.execute(
                "SELECT e.id, e.timestamp, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                "WHERE a.name = ? ORDER BY e.id",
                (asset_name,),
            ).fetchall()
        return [
            {"id": row[0], "timestamp": row[1], "payload": (json.loads(row[2] or "{}")).get("payload")} for row in rows
        ]

    def log_text(self, name: str) -> str:
        """The log of one component so far."""
        path = self.components[name].log if name in self.components else self.log_dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""
