"""Publishing Spark DataFrames from the executors, and the ``liftbridge`` PySpark data source.

- :func:`publish_dataframe`: publish every row of a DataFrame from the executors (each Spark
  partition with its own client, pipelined) and get driver-side totals back.
- ``format("liftbridge")``: the same publish as a DataFrame writer, and batch reads of a stream
  (register with :func:`register`).
- ``python -m airflow_provider_liftbridge.spark.submit``: the publish as a ``spark-submit`` job.

This package imports PySpark lazily where it can, but never imports Airflow: executors and
``spark-submit`` jobs run it without Airflow installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_provider_liftbridge.client import AckPolicy, PublishOptions, PublishSummary
from airflow_provider_liftbridge.client.publishing.summary import PartitionRange

from .errors import (
    LiftbridgeSparkError,
    SparkDataLossError,
    SparkOptionError,
    SparkPublishError,
    SparkReadError,
    SparkStreamError,
)
from .plan import PublishPlan
from .publish import publish_dataframe
from .session import build_spark_session
from .settings import ConnectionSettings, from_options, to_options
from .sources import DataFrameSource

if TYPE_CHECKING:
    from .datasource import LiftbridgeDataSource, register

__all__ = [
    "AckPolicy",
    "ConnectionSettings",
    "DataFrameSource",
    "from_options",
    "to_options",
    "LiftbridgeDataSource",
    "LiftbridgeSparkError",
    "PartitionRange",
    "PublishOptions",
    "PublishPlan",
    "PublishSummary",
    "SparkDataLossError",
    "SparkOptionError",
    "SparkPublishError",
    "SparkReadError",
    "SparkStreamError",
    "build_spark_session",
    "publish_dataframe",
    "register",
]


def __getattr__(name: str) -> Any:
    # The data source subclasses pyspark classes: import it only when asked for.
    if name in ("LiftbridgeDataSource", "register"):
        from . import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
