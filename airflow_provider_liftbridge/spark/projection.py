"""The per-row work of publishing done in the JVM: ``publish_dataframe`` projects the DataFrame to
the message value (``to_json(struct(...))`` for whole-row JSON), the key as binary and each row's
partition (``pmod(crc32(key), n)``, CRC-32 IEEE as the Go client's key partitioner), so the Python
worker receives Arrow columns of bytes and integers instead of encoding row by row.

What Spark cannot do exactly as the Python encoder does (the string form of floats or timestamps
as a key, ``text`` values other than strings and integers, JSON of a single atomic column or of
interval types) stays in Python (:class:`~.plan.RecordBuilder`). The JSON Spark writes differs from
the Python encoder's in a few types; docs/spark.md lists them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .plan import JVM_KEY, JVM_PARTITION, JVM_VALUE, PARTITION_BY_KEY, PublishPlan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = ["JVM_KEY", "JVM_PARTITION", "JVM_VALUE", "JSON_OPTIONS", "project"]

#: How ``to_json`` writes rows: null fields kept (as the Python encoder does), timestamps with
#: microseconds and the zone offset (``Z`` for UTC).
JSON_OPTIONS = {
    "ignoreNullFields": "false",
    "timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
    "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS",
}


def _json_ready(kind: DataType) -> bool:
    """Whether ``to_json`` writes ``kind`` as documented (interval and variant types are not)."""
    from pyspark.sql import types as T

    if isinstance(kind, T.StructType):
        return all(_json_ready(f.dataType) for f in kind.fields)
    if isinstance(kind, T.ArrayType):
        return _json_ready(kind.elementType)
    if isinstance(kind, T.MapType):
        return isinstance(kind.keyType, T.StringType | T.IntegralType) and _json_ready(kind.valueType)
    return isinstance(
        kind,
        T.StringType
        | T.BinaryType
        | T.BooleanType
        | T.IntegralType
        | T.FractionalType
        | T.DateType
        | T.TimestampType
        | T.TimestampNTZType
        | T.NullType,
    )


def _as_bytes(kind: DataType) -> bool:
    """Whether Spark's cast to binary (via string for integers) gives the bytes ``to_bytes`` does."""
    from pyspark.sql import types as T

    return isinstance(kind, T.StringType | T.BinaryType | T.IntegralType)


def _binary(column: Column, kind: DataType) -> Column:
    from pyspark.sql import types as T

    return (
        column.cast("binary") if isinstance(kind, T.StringType | T.BinaryType) else column.cast("string").cast("binary")
    )


def _functions(df: DataFrame) -> Any:
    """The functions module that makes columns for ``df``: Spark Connect's for a Connect
    DataFrame (``pyspark.sql.functions`` picks by the process's mode, and a process may hold a
    classic session and a Connect one), else the classic one."""
    connect: tuple[type, ...] = ()
    try:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

        connect = (ConnectDataFrame,)
    except ImportError:  # the Connect client's dependencies are not installed
        pass
    if isinstance(df, connect):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions as classic_functions

    return classic_functions


def project(df: DataFrame, plan: PublishPlan) -> tuple[DataFrame, PublishPlan]:
    """``df`` reduced to what the executors need, with the value, key and partition computed in the
    JVM where Spark does it as the Python encoder would, and the plan saying which (``plan.jvm``).

    :param df: the DataFrame, already checked by ``plan.validate_schema``.
    :param plan: a resolved plan (``partitions`` set).
    """
    F = _functions(df)

    def _column(name: str) -> Column:  # the column named ``name`` exactly (dots, backticks)
        return F.col("`" + name.replace("`", "``") + "`")

    types = {f.name: f.dataType for f in df.schema.fields}
    columns: list[Any] = []
    done: list[str] = []
    if plan.value_format == "json" and not plan.value_col and all(_json_ready(t) for t in types.values()):
        row = F.struct(*[_column(name) for name in df.columns])
        columns.append(F.to_json(row, JSON_OPTIONS).cast("binary").alias(JVM_VALUE))
        done.append("value")
    elif plan.value_col and plan.value_format in ("bytes", "text") and _as_bytes(types[plan.value_col]):
        columns.append(_binary(_column(plan.value_col), types[plan.value_col]).alias(JVM_VALUE))
        done.append("value")
    if plan.key_field and _as_bytes(types[plan.key_field]):
        key = _binary(_column(plan.key_field), types[plan.key_field])
        columns.append(key.alias(JVM_KEY))
        done.append("key")
        if plan.partitioner == PARTITION_BY_KEY:
            # A null key hashes as no bytes (CRC 0), as partition_for_key does.
            part = F.pmod(F.coalesce(F.crc32(key), F.lit(0)), F.lit(plan.partitions)).cast("int")
            columns.append(part.alias(JVM_PARTITION))
            done.append("partition")
    jvm_plan = replace(plan, jvm=tuple(done))
    # The columns Python still reads itself (headers, an explicit partition column, what Spark
    # cannot encode as Python does).
    rest = jvm_plan.used_columns(df.columns)
    return df.select(*[_column(c) for c in rest], *columns), jvm_plan
