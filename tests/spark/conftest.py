"""The Spark suite runs on one standalone cluster and one SparkSession (tests/spark_fixtures.py),
plus stream helpers.

Airflow is configured first (temporary home, env connections) for the operator tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from airflow_provider_liftbridge.spark import ConnectionSettings
from tests.airflow_conftest import *  # noqa: F403

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture
def spark(spark_session: SparkSession) -> SparkSession:
    """The suite's session (a driver on the standalone test cluster, ``tests/spark_fixtures.py``),
    re-activated for this thread (see ``register``'s docstring)."""
    from airflow_provider_liftbridge.spark import register

    register(spark_session)
    return spark_session


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
