"""Start a SparkSession that works for Liftbridge publishing, on a laptop or a cluster.

Two things go wrong by default on a single machine: executors start whatever ``python3`` is
first on PATH (not the environment that has this package), and Spark binds to a non-loopback
address. Both are fixed here unless the caller already chose otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs executors on this machine (``local``, ``local[N]``, ``local[*]``...)."""
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def prepare_environment(master: str | None) -> None:
    """Point executors at this interpreter and, for local masters, bind Spark to loopback.

    Only fills in variables that are not set: an explicit ``PYSPARK_PYTHON`` or
    ``SPARK_LOCAL_IP`` always wins.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is None or is_local_master(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


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
    """
    from pyspark.sql import SparkSession

    from .datasource import register

    prepare_environment(master)
    builder = SparkSession.builder.appName(app_name)
    if master and master.startswith("sc://"):
        builder = builder.remote(master)
    elif master:
        builder = builder.master(master)
        if is_local_master(master):
            builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
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

    When a session is already active in this process (a notebook, ``@task.pyspark``, a test
    suite), it is reused as is and left running; ``master`` and ``config`` then do not apply.
    """
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = build_spark_session(master, app_name=app_name, config=config)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
