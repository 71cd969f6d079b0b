"""One SparkSession for the whole Spark suite (start-up costs ~6 s), plus stream helpers.

Airflow is configured first (temporary home, env connections) for the operator tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from airflow_provider_liftbridge.spark import ConnectionSettings
from tests.airflow_conftest import *  # noqa: F403

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def _spark_session() -> Iterator[SparkSession]:
    from airflow_provider_liftbridge.spark import build_spark_session

    session = build_spark_session(
        "local[2]",
        app_name="liftbridge-tests",
        config={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            # Small Arrow batches so a test's few thousand rows cross several publish_many calls.
            "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def spark(_spark_session: SparkSession) -> SparkSession:
    """The suite's session, re-activated for this thread (see ``register``'s docstring)."""
    from airflow_provider_liftbridge.spark import register

    register(_spark_session)
    return _spark_session


@pytest.fixture
def lb_settings(lb_address: str, nats_url: str) -> ConnectionSettings:
    """Settings for the dev server, with NATS so bulk publishing takes the NATS path."""
    return ConnectionSettings(brokers=lb_address, nats_servers=[nats_url], timeout=10.0)


@pytest.fixture
def make_stream(lb_address: str, stream_name: str) -> Callable[[int], str]:
    """Create the test's stream with N partitions and return its name."""
    from airflow_provider_liftbridge.client import LiftbridgeClient

    def create(partitions: int = 1) -> str:
        with LiftbridgeClient(lb_address) as client:
            client.create_stream(stream_name, stream_name, partitions=partitions)
        return stream_name

    return create
