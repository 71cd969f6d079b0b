"""Publishing Spark DataFrames from the executors, and the ``liftbridge`` PySpark data source.

- :func:`publish_dataframe`: publish every row of a DataFrame from the executors (each Spark
  partition with its own client, pipelined) and get driver-side totals back.
- ``format("liftbridge")``: the same publish as a DataFrame writer, and batch reads of a stream
  (register with :func:`register`).
- ``python -m airflow_provider_liftbridge.spark.submit``: the publish as a ``spark-submit`` job.

This package imports PySpark lazily where it can, but never imports Airflow: executors and
``spark-submit`` jobs run it without Airflow installed. Its names are imported on first use, so
importing the package (or :mod:`.datasource`) costs little.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_liftbridge.lazy_imports import lazy_attributes

from .errors import (
    LiftbridgeSparkError,
    SparkDataLossError,
    SparkOptionError,
    SparkPublishError,
    SparkReadError,
    SparkStreamError,
)

if TYPE_CHECKING:
    from airflow_provider_liftbridge.client import AckPolicy, PublishOptions, PublishSummary
    from airflow_provider_liftbridge.client.publishing.summary import PartitionRange

    from .datasource import LiftbridgeDataSource, register
    from .plan import PublishPlan
    from .publish import publish_dataframe
    from .session import build_spark_session
    from .settings import ConnectionSettings, from_options, to_options
    from .sources import DataFrameSource

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

# Where each name lives, imported on first use: Spark's planner processes import this package
# (to unpickle the data source), and most of them need none of the client. PySpark 4.2 starts them
# on a session's first query and reuses them after, so this is the cold query's cost (issue 57).
_LAZY = {
    "AckPolicy": "airflow_provider_liftbridge.client",
    "PublishOptions": "airflow_provider_liftbridge.client",
    "PublishSummary": "airflow_provider_liftbridge.client",
    "PartitionRange": "airflow_provider_liftbridge.client.publishing.summary",
    "LiftbridgeDataSource": f"{__name__}.datasource",
    "register": f"{__name__}.datasource",
    "PublishPlan": f"{__name__}.plan",
    "publish_dataframe": f"{__name__}.publish",
    "build_spark_session": f"{__name__}.session",
    "ConnectionSettings": f"{__name__}.settings",
    "from_options": f"{__name__}.settings",
    "to_options": f"{__name__}.settings",
    "DataFrameSource": f"{__name__}.sources",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
