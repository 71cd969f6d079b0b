"""Session fixtures of the Spark tiers (registered by the root conftest as a plugin, so the Spark
tests and the example-DAG tests share one cluster and one SparkContext per process):

- ``executor_archive``: the executors' environment, built once per session with this project's
  own command (``spark.executor_env``): a venv with grpcio, protobuf, nats-py, google-crc32c,
  pyarrow and the package's Airflow-free code; no Airflow.
- ``spark_cluster``: a standalone master and two workers (separate JVMs, 127.0.0.1).
- ``spark_session``: the classic driver on that cluster; executors' Python comes from the archive.
- ``spark_connect``: a Spark Connect server (``local[2]``) whose Python is the same archive.

JVM start-ups dominate the Spark tiers' time, hence one of each per session.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.spark_cluster import StandaloneCluster

ALIAS = "lbenv"


@pytest.fixture(scope="session")
def executor_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The executor environment archive (about 5 s from a warm pip cache); its driver-side copy
    (``driver_directory``, ~200 MB under the system temporary directory) goes with the session."""
    import shutil

    from airflow_provider_liftbridge.spark.executor_env import build_executor_env, driver_directory_path

    archive = build_executor_env(
        tmp_path_factory.mktemp("executor-env") / "liftbridge-executor.tar.gz", compresslevel=1
    )
    try:
        yield archive
    finally:
        shutil.rmtree(driver_directory_path(archive, ALIAS), ignore_errors=True)


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A standalone Spark cluster: one master, two one-core workers."""
    from tests.spark_cluster import StandaloneCluster

    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g").start()
    try:
        yield cluster
    finally:
        cluster.stop()


def cluster_config(executor_archive: Path) -> dict[str, str]:
    """Settings of a driver on the test cluster whose executors run the archive's Python."""
    from airflow_provider_liftbridge.spark.executor_env import spark_config

    return {
        **spark_config(executor_archive, ALIAS),
        "spark.executor.memory": "768m",
        "spark.executor.cores": "1",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        # Small Arrow batches so a test's few thousand rows cross several publish calls.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
    }


def _healthy(session: SparkSession) -> bool:
    """Whether ``session`` is the process's running session and its JVM answers a call, and
    answers it right (a gateway left in a bad state was seen answering with wrong objects)."""
    from pyspark import SparkContext

    sc = session.sparkContext
    if SparkContext._active_spark_context is not sc or sc._jsc is None:
        return False
    try:
        return sc._jsc.sc().isStopped() is False and sc._jvm.java.lang.Math.abs(-7) == 7
    except Exception:
        return False


def discard_driver() -> None:
    """Forget the process's classic SparkSession and SparkContext and end their JVM gateway,
    without a py4j call that could read a stale answer or wait on a busy JVM: the next
    ``build_spark_session`` starts a new JVM (the standalone master drops the old application
    when its driver goes)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    with SparkContext._lock:
        sc = SparkContext._active_spark_context
        gateway = SparkContext._gateway
        SparkContext._active_spark_context = None
        SparkContext._gateway = None
        SparkContext._jvm = None
    SparkSession._instantiatedSession = None
    SparkSession._activeSession = None
    server = getattr(sc, "_accumulatorServer", None)
    if server is not None:
        server.shutdown()
    if gateway is None:
        return
    gateway.shutdown()  # sends the shutdown command, waits for no answer, closes the sockets
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        proc.stdin.close()  # the gateway JVM exits when its stdin closes
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def _spark_driver(spark_cluster: StandaloneCluster, executor_archive: Path) -> Iterator[Callable[[], SparkSession]]:
    """Gets the process's classic SparkSession on ``spark_cluster``, starting it again when a test
    stopped it or it does not answer right (its JVM gateway is then ended first); a build that does
    not complete (an exception, pytest-timeout firing inside a py4j call) is discarded with its
    JVM, never cached or handed out. Stops the session and restores ``PYSPARK_PYTHON`` at the end
    of the session."""
    from pyspark import SparkContext

    from airflow_provider_liftbridge.spark import build_spark_session

    saved = os.environ.get("PYSPARK_PYTHON")
    sessions: list[SparkSession] = []

    def live() -> SparkSession:
        if sessions and _healthy(sessions[-1]):
            return sessions[-1]
        if sessions and SparkContext._active_spark_context is not None:
            discard_driver()  # running but not answering right: a new JVM
        sessions.clear()
        try:
            session = build_spark_session(
                spark_cluster.master_url, app_name="liftbridge-tests", config=cluster_config(executor_archive)
            )
            session.sparkContext.setLogLevel("ERROR")
        except BaseException:
            discard_driver()
            raise
        sessions.append(session)
        return session

    try:
        yield live
    finally:
        if sessions and SparkContext._active_spark_context is not None:
            sessions[-1].stop()
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved


@pytest.fixture
def spark_session(_spark_driver: Callable[[], SparkSession]) -> SparkSession:
    """The classic SparkSession of the test process, a driver on ``spark_cluster``.

    One session serves every test; it is started again only after a test stopped it, as Airflow's
    ``@task.pyspark`` does with the session it ran in (the Spark example DAG has such a task).
    """
    return _spark_driver()


@pytest.fixture(scope="session")
def spark_connect_url(tmp_path_factory: pytest.TempPathFactory, executor_archive: Path) -> Iterator[str]:
    """A Spark Connect server (``local[2]``) whose Python workers run the executor archive; its URL."""
    from airflow_provider_liftbridge.spark.executor_env import driver_directory
    from tests.spark_cluster import ConnectServer

    # The server is the driver and, on local[2], its own executor. Spark Connect runs each
    # session's Python workers in that session's artifact directory, so the interpreter path is
    # absolute: the archive unpacked once next to the server.
    python = str(driver_directory(executor_archive, ALIAS) / ALIAS / "bin" / "python")
    server = ConnectServer(
        Path(tmp_path_factory.mktemp("spark-connect")),
        "local[2]",
        conf={"spark.pyspark.python": python, "spark.sql.shuffle.partitions": "4"},
        env={"PYSPARK_PYTHON": python},
    ).start()
    try:
        yield server.url
    finally:
        server.stop()
