"""Start a SparkSession that works for Liftbridge publishing, on a laptop or a cluster.

Two things go wrong by default on a single machine: executors start whatever ``python3`` is
first on PATH (not the environment that has this package), and Spark binds to a non-loopback
address. Both are fixed here unless the caller already chose otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_provider_liftbridge.extras import needs_extra

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
#: What needs the ``spark`` extra, in its missing-extra message.
SESSION_FEATURE = "a SparkSession (build_spark_session, the Spark operators)"
log = logging.getLogger(__name__)
#: What pyspark sets in ``os.environ`` once a Spark Connect session was built in the process.
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"
# Where this process's driver JVM was started by _jvm_working_directory (a JVM keeps its directory).
_jvm_started_in: Path | None = None


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs executors on this machine (``local``, ``local[N]``, ``local[*]``...)."""
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def prepare_environment(master: str | None, config: Mapping[str, str] | None = None) -> None:
    """Point executors at the right interpreter and, for local masters, bind Spark to loopback.

    ``spark.pyspark.python`` in ``config`` wins (PySpark reads only the ``PYSPARK_PYTHON``
    variable when it starts the JVM itself, so it is copied there); otherwise only unset
    variables are filled in: an explicit ``PYSPARK_PYTHON`` or ``SPARK_LOCAL_IP`` always wins.
    """
    python = (config or {}).get("spark.pyspark.python")
    if python:
        os.environ["PYSPARK_PYTHON"] = python
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is None or is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@contextmanager
def _jvm_working_directory(config: Mapping[str, str]) -> Iterator[None]:
    """Start the driver JVM where a relative ``spark.pyspark.python`` from ``spark.archives`` resolves.

    In client mode the driver JVM starts Python data source planning workers with the same
    interpreter path as the executors (``./<alias>/bin/python``), relative to its own working
    directory, where Spark does not unpack archives. The archive is unpacked once for the driver
    (:func:`executor_env.driver_directory`) and the JVM is started there; this process's working
    directory is restored right after. Nothing changes when the interpreter path is absolute, or
    when the JVM already runs (it keeps its directory: a warning says so if that is not this one).
    """
    global _jvm_started_in
    from pyspark import SparkContext

    from .executor_env import archive_for_python, driver_directory

    found = archive_for_python(config.get("spark.pyspark.python", ""), config.get("spark.archives", ""))
    if found is None:
        yield
        return
    directory = driver_directory(*found)
    if SparkContext._gateway is not None:
        if _jvm_started_in == directory:
            yield  # started there by an earlier session of this process
            return
        log.warning(
            "the driver JVM already runs (a SparkSession was started in this process before): Python data "
            "source planning looks for ./%s in the directory that JVM was started in, not in %s; start the "
            "executor-archive session first, or in a fresh process",
            found[1],
            directory,
        )
        yield
        return
    previous = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(previous)
    _jvm_started_in = directory


def build_spark_session(
    master: str | None = None,
    *,
    app_name: str = "liftbridge",
    config: Mapping[str, str] | None = None,
) -> SparkSession:
    """Get or create a SparkSession and register the ``liftbridge`` data source on it.

    :param master: ``local[N]``, a cluster master URL, or ``sc://host:port`` for Spark Connect.
        ``None`` keeps what ``spark-submit`` set, else uses ``local[*]``.
    :param app_name: the application name shown in the Spark UI.
    :param config: extra Spark settings (``spark.*``), applied last.
    :returns: the session (the caller stops it).
    :raises MissingExtraError: PySpark is not installed (the ``spark`` extra).
    """
    with needs_extra("spark", SESSION_FEATURE):
        from pyspark import SparkContext  # classic PySpark: pyspark-client alone lacks it
        from pyspark.sql import SparkSession

    from .datasource import register

    remote = bool(master and master.startswith("sc://"))
    if remote:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        # The generic builder also switches pyspark.sql.functions to Spark Connect for the
        # process, but refuses when a classic SparkContext runs here (SESSION_ALREADY_EXIST);
        # then the Connect client's own builder works (use pyspark.sql.connect.functions).
        generic = SparkContext._active_spark_context is None
        builder = (SparkSession.builder if generic else RemoteSparkSession.builder).remote(master).appName(app_name)
    else:
        prepare_environment(master, config)
        builder = SparkSession.builder.appName(app_name)
        if master:
            builder = builder.master(master)
            if is_local_master(master):
                builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
                    "spark.driver.host", "127.0.0.1"
                )
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    if remote:
        spark = builder.getOrCreate()
    else:
        with _jvm_working_directory(config or {}):
            spark = builder.getOrCreate()
    register(spark)
    return spark


@contextmanager
def spark_session_scope(
    master: str | None = None,
    *,
    app_name: str = "liftbridge",
    config: Mapping[str, str] | None = None,
) -> Iterator[SparkSession]:
    """A session for one job: stopped at the end only if this call started it.

    When a session is already running in this process (a notebook, ``@task.pyspark``, a test
    suite), in whichever thread it was started, it is reused and left running: ``master`` and the
    static settings of ``config`` do not apply to it. Its runtime settings (``spark.sql.*``) do,
    as PySpark's ``getOrCreate`` applies them to a running session, and are set back to what they
    were when the scope ends, so one job's settings do not stay for the next.
    """
    running = _session_running(bool(master and master.startswith("sc://")))
    connect_mode = os.environ.get(_CONNECT_MODE)
    before = _runtime_settings(build_spark_session(master, app_name=app_name), config) if running and config else {}
    spark = build_spark_session(master, app_name=app_name, config=config)
    try:
        yield spark
    finally:
        if running:
            _set_back(spark, before)
        else:
            spark.stop()
            # pyspark marks the whole process as Spark Connect when it builds a Connect session
            # (and its children inherit it); stopping a remote one leaves the mark, and a classic
            # session started later in the process then fails with CONNECT_URL_NOT_SET.
            if connect_mode is None:
                os.environ.pop(_CONNECT_MODE, None)


def _runtime_settings(spark: SparkSession, config: Mapping[str, str]) -> dict[str, str | None]:
    """The running session's values of the runtime settings among ``config`` (``None``: unset)."""
    return {key: spark.conf.get(key, None) for key in config if spark.conf.isModifiable(key)}


def _set_back(spark: SparkSession, before: Mapping[str, str | None]) -> None:
    """Set each runtime setting back to its value in ``before``; unset the ones that were unset."""
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def _session_running(remote: bool) -> bool:
    """Whether :func:`build_spark_session` would hand back a session that is running already.

    Classic: a SparkContext runs in the process (``getOrCreate`` returns its session). Not the
    JVM's *active* session: that is per JVM thread, and a Python thread other than the one that
    started the session (or whose JVM thread changed) has none, yet gets the running session.
    Spark Connect: a Connect session active in this thread, or the process's default one (what
    the Connect builder's ``getOrCreate`` returns). Not ``pyspark.sql.SparkSession``'s active
    session: beside a running classic session that names the classic one, and the Connect session
    this call then starts would never be stopped (its exit hook then retries for minutes against
    a server that may be gone).
    """
    with needs_extra("spark", SESSION_FEATURE):
        from pyspark import SparkContext

    if remote:
        from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

        running = RemoteSparkSession.getActiveSession() or RemoteSparkSession._get_default_session()
        return running is not None
    return SparkContext._active_spark_context is not None
