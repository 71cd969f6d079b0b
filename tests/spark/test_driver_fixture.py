"""The suite's driver session (``_spark_driver`` in tests/spark_fixtures.py) after a build or a
py4j call that did not complete: the next request gets a working session, not the broken one.

Seen under load 15-25: pytest-timeout fired inside the first test's session build (a py4j call
of ``register``); the cached half-built session then failed the next 26 Spark tests at set-up
(``SparkSession$ does not exist in the JVM``, ``'JavaObject' object is not callable``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


class Interrupted(BaseException):
    """What pytest-timeout raises in the test's thread: a BaseException (``Failed``)."""


def test_a_build_that_failed_at_register_is_not_handed_out(
    _spark_driver: Callable[[], SparkSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_provider_liftbridge.spark import datasource

    first = _spark_driver()
    first.stop()  # as a test running Airflow's @task.pyspark does: the next request builds one

    def interrupted(spark: SparkSession) -> None:
        raise Interrupted

    monkeypatch.setattr(datasource, "register", interrupted)
    with pytest.raises(Interrupted):
        _spark_driver()
    monkeypatch.undo()

    again = _spark_driver()
    assert again is not first
    assert again.range(5).count() == 5


def test_a_cached_session_whose_jvm_died_is_replaced(_spark_driver: Callable[[], SparkSession]) -> None:
    from pyspark import SparkContext

    first = _spark_driver()
    proc = SparkContext._gateway.proc
    proc.kill()  # the driver JVM, behind the fixture's back
    proc.wait()

    again = _spark_driver()
    assert again is not first
    assert again.range(5).count() == 5
    assert _spark_driver() is again  # a healthy session is kept
