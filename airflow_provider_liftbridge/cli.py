"""The console scripts of ``pyproject.toml``: each runs its module's ``main`` behind
:func:`~airflow_provider_liftbridge.extras.run_console_script`, so that a missing extra prints one
line naming it (``liftbridge-devserver: error: the dev server needs the 'devserver' extra ...``)
instead of a traceback. The modules are imported only when their command runs.
"""

from __future__ import annotations

from .extras import run_console_script

__all__ = ["devserver", "spark_executor_env"]


def devserver() -> int:
    """``liftbridge-devserver`` (needs the ``devserver`` extra): see docs/devserver.md."""
    return run_console_script("liftbridge-devserver", "airflow_provider_liftbridge.devserver.__main__:main")


def spark_executor_env() -> int:
    """``liftbridge-spark-executor-env``: pack the Spark executors' environment (see docs/spark.md)."""
    return run_console_script("liftbridge-spark-executor-env", "airflow_provider_liftbridge.spark.executor_env:main")
