"""DataFrame builders importable by dotted path (``dataframe_callable``) in the operator tests."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def orders(spark: SparkSession, rows: int = 100) -> DataFrame:
    """``rows`` orders keyed by customer (10 customers)."""
    return spark.range(rows, numPartitions=2).select(
        F.concat(F.lit("c"), (F.col("id") % 10).cast("string")).alias("customer"),
        F.col("id").alias("order_id"),
    )


NOT_A_DATAFRAME = 42


def not_a_dataframe(spark: SparkSession) -> list[int]:
    """Returns the wrong thing, to test the error."""
    return [1, 2]
