"""``spark_session_scope`` with Spark Connect beside a running classic session (this process runs
one for the Spark tiers): the Connect session it starts is its own, and it stops it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from airflow_provider_liftbridge.spark.session import spark_session_scope

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def test_a_connect_job_beside_a_classic_session_stops_its_own_session(
    spark_session: SparkSession, spark_connect_url: str
) -> None:
    with spark_session_scope(spark_connect_url) as remote:
        assert type(remote).__module__.startswith("pyspark.sql.connect")
        assert remote.range(3).count() == 3
    # Left open, its client's exit hook retried for minutes against the stopped server at the end
    # of the test run (seen: the suite hung after its last test).
    assert remote.is_stopped
    assert spark_session.range(2).count() == 2  # the classic session still runs
