"""Where the DataFrame to publish comes from: a path + format, a table, a SQL query, or a callable.

Shared by ``LiftbridgeSparkPublishOperator`` and the ``spark-submit`` job, so both accept the
same sources with the same errors. Imports no Airflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from airflow_provider_liftbridge.callables import SPARK_DRIVER, FunctionPathError, import_function

from .errors import SparkOptionError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def import_callable(dotted_path: str, where: str = SPARK_DRIVER) -> Callable[..., Any]:
    """Import the ``dataframe_callable`` named by ``"package.module.function"`` (or
    ``"package.module:function"``) in this process (``where``: the Spark driver by default).

    :raises SparkOptionError: not a dotted path, the module or attribute cannot be imported, or it is
        not callable (the message names the path, the cause and where it must be importable).
    """
    try:
        return import_function(dotted_path, "dataframe_callable", where)
    except FunctionPathError as exc:
        raise SparkOptionError(str(exc)) from exc.__cause__


@dataclass
class DataFrameSource:
    """Exactly one way to obtain the DataFrame: the ``source`` of ``LiftbridgeSparkPublishOperator``
    (its fields are templated there) and of the ``spark-submit`` job.

    :param input_path: file or folder to read (any Spark path: local, ``s3a://``, ``hdfs://``...).
    :param input_format: Spark format of ``input_path`` (``parquet``, ``json``, ``csv``, ``orc``...).
    :param read_options: options of the reader (``{"header": "true"}`` for CSV...).
    :param table: a table or view name.
    :param sql: a Spark SQL query.
    :param dataframe_callable: dotted path of ``f(spark, **callable_kwargs) -> DataFrame``, imported
        by :meth:`load` (on the Spark driver), not here.
    :param callable_kwargs: keyword arguments of ``dataframe_callable``.
    :raises SparkOptionError: none or several sources given.
    """

    input_path: str | None = None
    input_format: str = "parquet"
    read_options: Mapping[str, str] = field(default_factory=dict)
    table: str | None = None
    sql: str | None = None
    dataframe_callable: str | None = None
    callable_kwargs: Mapping[str, Any] = field(default_factory=dict)
    #: Rendered by Airflow when it is an operator's ``source`` (a nested templated value).
    template_fields: ClassVar[tuple[str, ...]] = (
        "input_path",
        "input_format",
        "read_options",
        "table",
        "sql",
        "dataframe_callable",
        "callable_kwargs",
    )

    def __post_init__(self) -> None:
        given = [name for name in ("input_path", "table", "sql", "dataframe_callable") if getattr(self, name)]
        if len(given) != 1:
            raise SparkOptionError(
                "give exactly one DataFrame source: input_path (+ input_format), table, sql or dataframe_callable; "
                f"got {given or 'none'}"
            )

    def load(self, spark: SparkSession) -> DataFrame:
        """Build the DataFrame on ``spark``.

        :raises SparkOptionError: the callable cannot be imported or does not return a DataFrame.
        """
        if self.input_path:
            return spark.read.format(self.input_format).options(**dict(self.read_options)).load(self.input_path)
        if self.table:
            return spark.table(self.table)
        if self.sql:
            return spark.sql(self.sql)
        assert self.dataframe_callable is not None
        result = import_callable(self.dataframe_callable)(spark, **dict(self.callable_kwargs))
        if not (hasattr(result, "mapInArrow") and hasattr(result, "schema")):
            raise SparkOptionError(
                f"dataframe_callable {self.dataframe_callable!r} returned {type(result).__name__}, not a DataFrame"
            )
        return result  # type: ignore[no-any-return]
