"""Shared fixtures (docs/contracts.md): a real dev server with a real nats-server child.

- ``devserver`` (session): one single-broker in-process :class:`DevServer` for the whole run.
- ``lb_address`` / ``nats_url``: its gRPC address (``host:port``) and NATS URL.
- ``stream_name``: a fresh, unique stream name per test (use it as the subject too).
- ``cluster``: a 3-broker :class:`DevServer` per test, torn down afterwards.
- ``fast_cluster``: the same with test time-outs (``ClusterTimings.fast()``: a follower leaves the
  ISR and a dead leader is replaced after 0.5 s, the restart window is a tenth of the real one),
  for the fault hooks (``stall_broker``, ``kill_broker``, ``restart_cluster``, ...).

**An external cluster.** With ``LIFTBRIDGE_TEST_BROKERS=host:port[,host:port...]`` (and
``LIFTBRIDGE_TEST_NATS=nats://host:port`` for the NATS paths) ``lb_address`` and ``nats_url``
point at that cluster and no dev server is started. Tests that need to start, stop, kill or
configure a server of their own are skipped with a reason: those asking for ``devserver`` or
``cluster``, those marked ``own_server``, the dev server's own tests and the fault-injection tier
(``tests/devserver``, ``tests/reliability``), and modules that start a ``DevServer`` or
``DevServerProcess`` themselves. Fault scenarios marked ``external_cluster`` run there too: their
``fault_cluster`` fixture (``tests/reliability/conftest.py``) is then that cluster.

Teardown is robust: servers stop in ``finally`` blocks, ``DevServer`` also registers an
``atexit`` stop, and the nats-server child is started with a parent-death signal
(``setpriv --pdeathsig``), so it goes away even when the test process is killed.
"""

from __future__ import annotations

import contextlib

from tests.airflow_support import configure_airflow

# Airflow reads AIRFLOW_HOME once, at first import: point every test folder (Spark included)
# at a throw-away home before anything imports Airflow.
configure_airflow()

import os  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from airflow_provider_liftbridge.devserver import ClusterTimings, DevServer  # noqa: E402

# The Spark cluster, Spark Connect server and SparkSession: session fixtures shared by tests/spark
# and tests/dags (one SparkContext per process), defined once.
pytest_plugins = [
    "tests.spark_fixtures",
    "tests.stall_watch",
    "tests.gc_between_tests",
    "tests.margins",
    "tests.unit_times",
]


#: An external cluster to test against instead of the dev server (see the module docstring).
EXTERNAL_BROKERS = os.environ.get("LIFTBRIDGE_TEST_BROKERS", "").strip()
EXTERNAL_NATS = os.environ.get("LIFTBRIDGE_TEST_NATS", "").strip()
_OWN_SERVER = (
    "starts, stops, kills or configures a server of its own: skipped while LIFTBRIDGE_TEST_BROKERS points the"
    " tests at an external cluster"
)
_OWN_SERVER_FOLDERS = ("devserver", "reliability")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("liftbridge", "an external Liftbridge cluster (LIFTBRIDGE_TEST_BROKERS)")
    group.addoption(
        "--freeze-cmd",
        default=os.environ.get("LIFTBRIDGE_TEST_FREEZE_CMD", ""),
        help="shell command template that freezes one broker of the external cluster (SIGSTOP-like), with "
        "{index} {id} {address} {host} {port}; env LIFTBRIDGE_TEST_FREEZE_CMD (tests/reliability/freezing.py)",
    )
    group.addoption(
        "--thaw-cmd",
        default=os.environ.get("LIFTBRIDGE_TEST_THAW_CMD", ""),
        help="shell command template that lets a frozen broker run again; env LIFTBRIDGE_TEST_THAW_CMD",
    )
    group.addoption(
        "--metadata-leader",
        default=os.environ.get("LIFTBRIDGE_TEST_METADATA_LEADER", ""),
        help="the external cluster's metadata (Raft) leader: index in LIFTBRIDGE_TEST_BROKERS, id or address; "
        "env LIFTBRIDGE_TEST_METADATA_LEADER",
    )
    group.addoption(
        "--metadata-leader-cmd",
        default=os.environ.get("LIFTBRIDGE_TEST_METADATA_LEADER_CMD", ""),
        help="shell command printing the external cluster's metadata leader (as --metadata-leader), run before "
        "each frozen-broker scenario; env LIFTBRIDGE_TEST_METADATA_LEADER_CMD",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"own_server: the test {_OWN_SERVER}")
    config.addinivalue_line(
        "markers",
        "external_cluster: a fault scenario that also runs against LIFTBRIDGE_TEST_BROKERS (its fault_cluster "
        "fixture is then that cluster instead of a dev cluster)",
    )


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How ``scripts/test.sh`` shares the suite between its pytest-xdist workers: a unit at a
    time (``tests/unit_times.py``: a test file, so a file's module fixtures start once and its
    tests keep their order, as in a run of one process; ``tests/system`` as one, because its
    Airflow deployment is a package fixture), in the order the workers collected them (longest
    first, below) rather than xdist's order by number of tests. pytest-xdist's own ``loadgroup``
    cannot do it on pytest 9.2: its group suffix is written to an attribute pytest no longer reads."""
    from xdist.scheduler import LoadScopeScheduling

    from tests.unit_times import unit_of  # here: pytest_plugins imports it first, for assertion rewriting

    config.option.loadscopereorder = False

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a pytest-xdist worker, collect the units longest first (``tests/unit_durations.tsv``,
    a run's figures): a long file that starts last runs on beside an idle worker. Against an
    external cluster, skip what needs a server of its own (the reason says so)."""
    if hasattr(config, "workerinput"):
        from tests.unit_times import expected_seconds, unit_of

        seconds = expected_seconds(item.nodeid for item in items)
        items.sort(key=lambda item: -seconds[unit_of(item.nodeid)])  # stable: a file keeps its order
    if not EXTERNAL_BROKERS:
        return
    skip = pytest.mark.skip(reason=f"this test {_OWN_SERVER}")
    starts_own: dict[Path, bool] = {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in starts_own:
            text = path.read_text(errors="replace") if path.suffix == ".py" else ""
            # set_reception_clock stamps messages of the in-process dev server only: an external
            # cluster stamps them with its own clock, and those tests' expectations fail.
            starts_own[path] = any(name in text for name in ("DevServer(", "DevServerProcess(", "set_reception_clock("))
        fixtures = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("external_cluster"):
            continue
        if (
            item.get_closest_marker("own_server")
            or starts_own[path]
            or {"devserver", "cluster", "fast_cluster", "groups_server"} & fixtures
            or any(part in _OWN_SERVER_FOLDERS for part in path.parent.relative_to(Path(__file__).parent).parts)
        ):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def devserver() -> Iterator[DevServer]:
    """A single-broker dev server shared by the whole test session."""
    if EXTERNAL_BROKERS:
        pytest.skip(f"needs the in-process dev server; this test {_OWN_SERVER}")
    with DevServer(brokers=1) as server:
        yield server


@pytest.fixture(scope="session")
def lb_address(request: pytest.FixtureRequest) -> str:
    """``host:port`` of the broker the tests talk to: the session dev server's, or the first of
    ``LIFTBRIDGE_TEST_BROKERS`` (the client learns the others from metadata)."""
    if EXTERNAL_BROKERS:
        return EXTERNAL_BROKERS.split(",")[0].strip()
    return str(request.getfixturevalue("devserver").address)


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> str:
    """NATS URL of the session dev server, or ``LIFTBRIDGE_TEST_NATS`` against an external cluster."""
    if EXTERNAL_BROKERS:
        if not EXTERNAL_NATS:
            pytest.skip("uses NATS: set LIFTBRIDGE_TEST_NATS=nats://host:port beside LIFTBRIDGE_TEST_BROKERS")
        return EXTERNAL_NATS
    return str(request.getfixturevalue("devserver").nats_url)


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A stream name no other test uses (valid as a NATS subject too). Streams of that name and of
    names made from it (``{name}-dlq``) on the session dev server are deleted after the test: the
    server keeps a file open per segment of every stream it holds, and a worker that kept the
    streams of hundreds of tests went over 1,024 open descriptors, past what ``select()`` (py4j's
    callback server) can watch."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    if EXTERNAL_BROKERS or "lb_address" not in request.fixturenames:
        return
    from airflow_provider_liftbridge.client import LiftbridgeClient, LiftbridgeError

    with contextlib.suppress(LiftbridgeError), LiftbridgeClient(request.getfixturevalue("lb_address")) as client:
        for stream in client.fetch_metadata().streams:
            if stream == name or stream.startswith(f"{name}-"):
                client.delete_stream(stream)


@pytest.fixture
def cluster() -> Iterator[DevServer]:
    """A fresh 3-broker dev server for one test."""
    if EXTERNAL_BROKERS:
        pytest.skip(f"needs a 3-broker dev server of its own; this test {_OWN_SERVER}")
    with DevServer(brokers=3) as server:
        yield server


@pytest.fixture
def fast_cluster() -> Iterator[DevServer]:
    """A fresh 3-broker dev server with test time-outs (``ClusterTimings.fast()``) for one test."""
    if EXTERNAL_BROKERS:
        pytest.skip(f"needs a 3-broker dev server of its own; this test {_OWN_SERVER}")
    with DevServer(brokers=3, timings=ClusterTimings.fast()) as server:
        yield server


@pytest.fixture(scope="module")
def groups_server() -> Iterator[DevServer]:
    """A one-broker dev server with short consumer-group timeouts (member timeout 1 s, so members
    heartbeat every third of a second; coordinator report window 1 s): rebalances show within a test."""
    if EXTERNAL_BROKERS:
        pytest.skip(f"needs a dev server with short group timeouts; this test {_OWN_SERVER}")
    with DevServer(brokers=1, groups_consumer_timeout=1.0, groups_coordinator_timeout=1.0) as server:
        yield server
