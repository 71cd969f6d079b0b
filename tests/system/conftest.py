"""The system-test tier: one real Airflow deployment (api-server, execution API, scheduler with
LocalExecutor and SQLite, dag-processor, triggerer, each its own process) and a dev server
process, shared by every test of the tier (starting it takes about half a minute). Built by
``scripts/deployment.py``, the module ``scripts/demo.py --ui`` uses too.

The AIRFLOW_HOME (database, ``logs/<component>.log``, task logs, UI screenshots) is removed after
a passing session and kept, with its path printed, when a test failed or
``LIFTBRIDGE_SYSTEM_KEEP_HOME=1`` is set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.deployment import EXAMPLE_DAGS, Component, Deployment, free_port, wait_until
from tests.system.prefix_proxy import prefix_proxy

HERE = Path(__file__).resolve().parent
EXAMPLES = [
    "liftbridge_stream_lifecycle",
    "liftbridge_publish_files",
    "liftbridge_spark_pipeline",
    "liftbridge_stream_archive",
]
SYSTEM_DAGS = [
    "liftbridge_event_consumer",
    "system_burst_consumer",
    "system_wait_for_message",
    "system_private_task_dirs",
    "system_interval_wait",
    "system_interval_backfill",
    "system_partition_minutes",
    "system_partition_rollup",
    "system_ui_actions",
]


#: Airflow's default log server ports ([logging] worker_log_server_port, trigger_log_server_port).
AIRFLOW_DEFAULT_LOG_PORTS = (8793, 8794)


@contextlib.contextmanager
def holding_ports(ports: tuple[int, ...]) -> Iterator[list[int]]:
    """Listen on these ports (those that are free) until the block ends; yield the ones held.

    Stands in for another Airflow on the machine: the deployment must not need them."""
    with contextlib.ExitStack() as stack:
        held = []
        for port in ports:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("0.0.0.0", port))
                sock.listen()
            except OSError:  # already held by something else: as good
                continue
            held.append(port)
        yield held


@pytest.fixture(scope="package")  # stopped once tests/system is done, not at the end of the whole run
def deployment(request: pytest.FixtureRequest) -> Iterator[Deployment]:
    """The running deployment, its DAGs parsed (the examples and ``tests/system/dags``), while
    Airflow's default log server ports are taken (as by another Airflow on the machine)."""
    home = Path(tempfile.mkdtemp(prefix="liftbridge-system-"))
    dags = home / "dags"
    dags.mkdir()
    for source in [*EXAMPLE_DAGS.glob("*.py"), *(HERE / "dags").glob("*.py")]:
        (dags / source.name).symlink_to(source)
    failed_before = request.session.testsfailed
    # Every task in a working / temporary directory of its own (plugins/private_task_dirs.py), so
    # a DAG whose tasks share files through a worker's disk fails here as on workers on several hosts.
    task_dirs = home / "task-dirs"
    task_dirs.mkdir()
    isolation = {"AIRFLOW__CORE__PLUGINS_FOLDER": str(HERE / "plugins"), "LIFTBRIDGE_PRIVATE_TASK_DIRS": str(task_dirs)}
    # The partitioned example's daily roll-up starts after three archived hours, not 24
    # (dags_examples/liftbridge_partitioned_lake.py; tests/system/test_partitioned_lake.py archives three).
    isolation["LIFTBRIDGE_ROLLUP_MIN_HOURS"] = "3"
    deployment = Deployment(home / "airflow", dags_folder=dags, config=isolation)
    with holding_ports(AIRFLOW_DEFAULT_LOG_PORTS):
        try:
            deployment.start()
            deployment.wait_for_dags(EXAMPLES + SYSTEM_DAGS)
            yield deployment
        finally:
            deployment.stop()
            if request.session.testsfailed > failed_before or os.environ.get("LIFTBRIDGE_SYSTEM_KEEP_HOME") == "1":
                print(f"\nsystem tier: logs kept in {deployment.log_dir}")
            else:
                shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="package", autouse=True)
def _browser() -> Iterator[None]:
    """Stops the headless chromium the UI modules share (tests/system/test_ui.py) once the tier is done."""
    yield
    from tests.system.test_ui import close_browser

    close_browser()


@pytest.fixture(scope="package")
def private_task_dirs(deployment: Deployment) -> Path:
    """The folder under which each task of the deployment gets its own scratch directory."""
    return Path(deployment.config["LIFTBRIDGE_PRIVATE_TASK_DIRS"])


ARCHIVE_DAG = "liftbridge_stream_archive"
#: Orders the run after the first scheduled one publishes (the first: the DAG's default, 1,000), so
#: the view's charts show two runs that read different amounts (a third, 700, showed nothing more
#: and cost a run of the DAG, Spark job included: about a minute).
MORE_RUNS_ORDERS = (400,)


@pytest.fixture(scope="package")
def archive_runs(deployment: Deployment) -> list[str]:
    """Every finished run of the stream-archive example, oldest first: its first scheduled run
    (which crashes its archive task once, on purpose, and is retried), then a triggered one
    without the crash (:data:`MORE_RUNS_ORDERS`), and the hourly run the scheduler adds when an
    hour turns meanwhile (the example is ``@hourly``: busy run a1 of issue 45 crossed 17:00 and its
    view counted four runs where the fixture, then making three, said three). The DAG is paused
    once every run it has is finished, so no later run moves a cursor while the view's tests look."""

    def listed() -> list[str]:
        runs = deployment.api("GET", f"/dags/{ARCHIVE_DAG}/dagRuns?order_by=run_after")["dag_runs"]
        return [str(r["dag_run_id"]) for r in runs]

    first = wait_until(f"a scheduled run of {ARCHIVE_DAG}", lambda: next(iter(listed()), None), timeout=120, interval=1)
    for orders in MORE_RUNS_ORDERS:
        deployment.trigger_dag(ARCHIVE_DAG, {"sample_orders": orders, "simulate_crash": False})
    while True:
        runs = listed()
        assert runs[0] == first, runs
        for run_id in runs:  # max_active_runs=1: they run one after the other
            state = deployment.wait_for_run(ARCHIVE_DAG, run_id, timeout=600)
            assert state == "success", f"{deployment.task_states(ARCHIVE_DAG, run_id)} (logs: {deployment.log_dir})"
        deployment.api("PATCH", f"/dags/{ARCHIVE_DAG}", {"is_paused": True})
        if listed() == runs:
            return runs
        # An hour turned between the last look and the pause: let its run finish too.
        deployment.api("PATCH", f"/dags/{ARCHIVE_DAG}", {"is_paused": False})


#: The path under which the second api-server (:func:`prefixed`) serves Airflow.
PREFIX = "/airflow"
#: The second api-server's own settings: providers' plugins loaded as well as entry-point plugins,
#: so the view must be registered once (``test_ui_base_url.py``).
EAGER = {"AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": "False"}
_PREFIXED = "api-server-prefixed"


@pytest.fixture(scope="package")  # one for every module that looks behind the prefix: a start costs seconds
def prefixed(deployment: Deployment) -> Iterator[str]:
    """The proxy's address of Airflow (``http://127.0.0.1:<port>/airflow``): a second api-server of
    the deployment (same home, database and JWT secret) with that ``[api] base_url`` and
    :data:`EAGER`, behind :func:`tests.system.prefix_proxy.prefix_proxy`, which answers 404 outside
    the prefix. Stopped once ``tests/system`` is done, after checking that the proxy refused
    nothing (every page and fetch stayed under the prefix)."""
    import urllib.request

    upstream = free_port(exclude={deployment.api_port, deployment.execution_api_port})
    with prefix_proxy(PREFIX, upstream) as proxy:
        base = f"http://127.0.0.1:{proxy.server_address[1]}{PREFIX}"
        args = ["api-server", "--host", "127.0.0.1", "--port", str(upstream), "--apps", "core"]
        env = EAGER | {"AIRFLOW__API__BASE_URL": base, "AIRFLOW__API__PORT": str(upstream)}
        deployment.components[_PREFIXED] = Component(_PREFIXED, args, deployment.log_dir / f"{_PREFIXED}.log", env=env)
        deployment.start_component(_PREFIXED)

        def up() -> bool:
            deployment.check_running()
            try:
                with urllib.request.urlopen(f"{base}/api/v2/monitor/health", timeout=30) as response:
                    return response.status == 200
            except OSError:
                return False

        try:
            wait_until("the prefixed api-server", up, timeout=180)
            yield base
            assert not [p for p in proxy.refused if "favicon" not in p], f"requests left {PREFIX}: {proxy.refused}"
        finally:
            deployment.stop_component(_PREFIXED)
            del deployment.components[_PREFIXED]
