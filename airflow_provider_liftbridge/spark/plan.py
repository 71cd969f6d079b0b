"""What to publish and how: the plan shared by ``publish_dataframe`` and the data source writer.

A :class:`PublishPlan` is validated on the driver against the DataFrame schema, then shipped to
executors, where :class:`RecordBuilder` turns Arrow record batches into records held as columns.
Every record gets an explicit partition computed here, so the per-partition summary is exact and
the placement does not depend on which executor published the row.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from airflow_provider_liftbridge.client import checks
from airflow_provider_liftbridge.client.errors import InvalidArgumentError
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND
from airflow_provider_liftbridge.client.types import AckPolicy

from .errors import SparkOptionError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

    from airflow_provider_liftbridge.client.publishing.columns import RecordColumns

ValueFormat = Literal["bytes", "text", "json"]
PARTITION_BY_KEY = "key"
PARTITION_ROUND_ROBIN = "round_robin"
#: The value formats of every operator of this provider, the same set for reading and publishing.
VALUE_FORMATS = ("bytes", "text", "json")


#: In-flight messages per executor when the options set no window (each Spark partition pipelines
#: on its own, so the cluster has this many times the partitions publishing at once).
SPARK_WINDOW = 256
#: The options of a plan that names none: the connection's ack policy and timeout, no compression.
SPARK_OPTIONS = PublishOptions(window=SPARK_WINDOW)
#: The columns ``publish_dataframe``'s projection computes in the JVM (:mod:`.projection`).
JVM_VALUE = "__liftbridge_value"
JVM_KEY = "__liftbridge_key"
JVM_PARTITION = "__liftbridge_partition"


@dataclass(frozen=True)
class PublishPlan:
    """How rows become Liftbridge messages.

    :param stream: the stream to publish to.
    :param value_format: ``"json"`` (each row, or ``value_col`` if given, as a JSON object),
        ``"bytes"`` (``value_col`` as is: a binary column, or a string column encoded as UTF-8) or
        ``"text"`` (``value_col``'s string form, any atomic type, UTF-8). Defaults to ``"bytes"``
        when ``value_col`` is given, else ``"json"``.
    :param value_col: the column holding the message value; required for ``"bytes"`` and ``"text"``.
    :param key_field: the column holding the message key (binary, string, or any atomic type
        published as its string form); nulls publish without a key.
    :param header_cols: columns published as headers named after the column.
    :param partitioner: ``"key"`` (CRC-32 of the key modulo the partition count, as the Go
        client), ``"round_robin"``, or the name of an integer column holding the partition.
        Defaults to ``"key"`` when ``key_field`` is given, else ``"round_robin"``.
    :param options: how each executor publishes (:class:`PublishOptions`): its ``ack_policy``
        (unset: the connection's; ``NONE``: nothing is confirmed, the summary carries no offsets
        and lost rows go unnoticed), ``window`` (in-flight messages per executor; unset: 256),
        ``timeout`` (seconds to wait for each batch's acks; unset: the connection's) and
        ``compression`` (values compressed on the executors, marked by a ``content-encoding``
        header). Partitions are the plan's; nothing is re-sent blindly.
    :param partitions: the stream's partition count, filled in by the driver.
    :param subject: the stream's NATS subject, filled in by the driver (for the NATS publish path).
    :param jvm: what the projection computed in the JVM (``"value"``, ``"key"``, ``"partition"``,
        see :mod:`.projection`), set by ``publish_dataframe``: its batches carry those columns.
    :raises SparkOptionError: on an unknown format, bad options or a bad combination.
    """

    stream: str
    value_format: ValueFormat | None = None
    value_col: str | None = None
    key_field: str | None = None
    header_cols: tuple[str, ...] = field(default=())
    partitioner: str | None = None
    options: PublishOptions = SPARK_OPTIONS
    partitions: int = 0
    subject: str = ""
    jvm: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.stream:
            raise SparkOptionError("stream must be a non-empty stream name")
        value_format = self.value_format or ("bytes" if self.value_col else "json")
        if value_format == "raw":
            raise SparkOptionError("value_format='raw' is now value_format='bytes' (the same set on every operator)")
        if value_format not in VALUE_FORMATS:
            raise SparkOptionError(f"value_format must be one of {VALUE_FORMATS}, got {self.value_format!r}")
        if value_format != "json" and not self.value_col:
            raise SparkOptionError(f"value_format={value_format!r} needs value_col: the column to publish")
        object.__setattr__(self, "value_format", value_format)
        partitioner = self.partitioner or (PARTITION_BY_KEY if self.key_field else PARTITION_ROUND_ROBIN)
        if partitioner == PARTITION_BY_KEY and not self.key_field:
            raise SparkOptionError("partitioner='key' needs key_field: the column whose value is hashed")
        object.__setattr__(self, "partitioner", partitioner)
        object.__setattr__(self, "header_cols", tuple(self.header_cols))
        if not isinstance(self.options, PublishOptions):
            raise SparkOptionError(
                f"options must be a PublishOptions, got {type(self.options).__name__}; "
                "e.g. options=PublishOptions(ack_policy=AckPolicy.ALL, window=128)"
            )

    @property
    def ack_policy(self) -> AckPolicy:
        """The ack policy the executors publish with (``LEADER`` while the options leave it unset;
        :meth:`resolved` fills in the connection's)."""
        return self.options.policy

    def resolved(self, ack_policy: AckPolicy, timeout: float) -> PublishPlan:
        """This plan with the connection's ``ack_policy`` and ``timeout`` where the options set none."""
        return replace(self, options=self.options.resolved(ack_policy, timeout))

    def publish_options(self) -> PublishOptions:
        """How each executor's batch publisher sends: the plan's options, the window 256 unless
        they set one, never re-sent blindly (a lost ack is reported rather than risking a
        duplicate). Partitions are the plan's, set on every record."""
        window = SPARK_WINDOW if self.options.window is None else self.options.window
        return self.options.replace(window=window, resend=NO_RESEND)

    @property
    def partition_col(self) -> str | None:
        """The explicit partition column, or ``None`` for key / round-robin partitioning."""
        if self.partitioner in (PARTITION_BY_KEY, PARTITION_ROUND_ROBIN):
            return None
        return self.partitioner

    def validate_schema(self, schema: StructType) -> None:
        """Check the columns this plan uses exist and have usable types.

        :raises SparkOptionError: naming the column and the types it accepts.
        """
        from pyspark.sql.types import BinaryType, IntegralType, StringType

        types = {f.name: f.dataType for f in schema.fields}

        def need(column: str, role: str) -> Any:
            if column not in types:
                raise SparkOptionError(f"{role} column {column!r} is not in the DataFrame (columns: {sorted(types)})")
            return types[column]

        if self.value_format == "bytes":
            assert self.value_col is not None
            kind = need(self.value_col, "value")
            if not isinstance(kind, BinaryType | StringType):
                raise SparkOptionError(
                    f"value column {self.value_col!r} is {kind.simpleString()}; value_format='bytes' takes a binary "
                    "or string column (use value_format='text' or 'json' to publish other types)"
                )
        elif self.value_col:
            need(self.value_col, "value")
        if self.key_field:
            need(self.key_field, "key")
        for column in self.header_cols:
            need(column, "header")
        if self.partition_col:
            kind = need(self.partition_col, "partition")
            if not isinstance(kind, IntegralType):
                raise SparkOptionError(
                    f"partition column {self.partition_col!r} is {kind.simpleString()}; it must hold integers "
                    "(or use partitioner='key' / 'round_robin')"
                )

    def used_columns(self, all_columns: Sequence[str]) -> list[str]:
        """The columns executors need (all of them for whole-row JSON), less those the JVM encoded."""
        jvm = self.jvm
        if self.value_format == "json" and not self.value_col and "value" not in jvm:
            return list(all_columns)
        value = None if "value" in jvm else self.value_col
        key = None if "key" in jvm else self.key_field
        wanted = [value, key, *self.header_cols, self.partition_col]
        return list(dict.fromkeys(c for c in wanted if c))


def to_bytes(value: Any) -> bytes:
    """A key, a ``bytes``/``text`` value or a header value as bytes: bytes as is, text as UTF-8,
    anything else as ``str()``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat().encode()
    return str(value).encode()


def _json_default(value: Any) -> Any:
    # Spark types Python's json module does not know; chosen to round-trip through from_json.
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def _map_fixer(arrow_type: pa.DataType) -> Callable[[Any], Any] | None:
    """A converter turning Arrow maps (lists of pairs in ``to_pylist``) into dicts, or None if not needed."""
    import pyarrow as pa

    if pa.types.is_map(arrow_type):
        fix_value = _map_fixer(arrow_type.item_type) or (lambda v: v)
        return lambda pairs: None if pairs is None else {str(k): fix_value(v) for k, v in pairs}
    if pa.types.is_struct(arrow_type):
        fixers = {f.name: _map_fixer(f.type) for f in arrow_type}
        fixers = {name: fix for name, fix in fixers.items() if fix}
        if not fixers:
            return None
        return lambda row: None if row is None else {k: (fixers[k](v) if k in fixers else v) for k, v in row.items()}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        fix_item = _map_fixer(arrow_type.value_type)
        if fix_item is None:
            return None
        return lambda items: None if items is None else [fix_item(i) for i in items]
    return None


def json_values(batch: pa.RecordBatch | pa.Table) -> list[bytes]:
    """Each row of ``batch`` as one compact JSON object (UTF-8)."""
    schema = batch.schema
    fixers = {f.name: _map_fixer(f.type) for f in schema}
    fixers = {name: fix for name, fix in fixers.items() if fix}
    rows = batch.to_pylist()
    dumps = json.JSONEncoder(default=_json_default, separators=(",", ":"), ensure_ascii=False).encode
    out = []
    for row in rows:
        for name, fix in fixers.items():
            row[name] = fix(row[name])
        out.append(dumps(row).encode())
    return out


def json_column(column: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """Each value of one column as JSON (``null`` for nulls)."""
    fix = _map_fixer(column.type)
    dumps = json.JSONEncoder(default=_json_default, separators=(",", ":"), ensure_ascii=False).encode
    return [dumps(fix(v) if fix else v).encode() for v in column.to_pylist()]


def _bytes_column(column: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    return [None if v is None else to_bytes(v) for v in column.to_pylist()]


class RecordBuilder:
    """Turns Arrow batches into client records held as columns
    (:class:`~airflow_provider_liftbridge.client.publishing.columns.RecordColumns`), each with an
    explicit partition; values, keys and partitions the JVM computed (``plan.jvm``) are taken as
    they are.

    :param plan: the validated plan, with ``partitions`` set.
    :param seed: first partition for round-robin (the Spark partition id, so executors spread).
    :raises SparkOptionError: when the plan has no partition count.
    """

    def __init__(self, plan: PublishPlan, seed: int = 0) -> None:
        if plan.partitions < 1:
            raise SparkOptionError("the plan has no partition count: resolve the stream on the driver first")
        self.plan = plan
        self._next = seed % plan.partitions

    def build(self, batch: pa.RecordBatch | pa.Table) -> tuple[RecordColumns, int]:
        """Records for one batch and their payload size (key + value + header bytes).

        :raises SparkOptionError: when a row's explicit partition is null or out of range.
        """
        from airflow_provider_liftbridge.client.publishing.columns import RecordColumns
        from airflow_provider_liftbridge.codec import header_field

        plan, jvm = self.plan, self.plan.jvm
        n = batch.num_rows
        names = batch.schema.names
        size = 0
        if "value" in jvm:
            column = batch.column(names.index(JVM_VALUE))
            size += _byte_length(column)
            values: list[bytes] = [v or b"" for v in column.to_pylist()]
        else:
            found: Sequence[bytes | None]
            if plan.value_format in ("bytes", "text"):
                # Both are the column as bytes: binary as is, text UTF-8, other atomic types their string form.
                found = _bytes_column(batch.column(names.index(plan.value_col)))
            elif plan.value_col:
                found = json_column(batch.column(names.index(plan.value_col)))
            else:
                found = json_values(batch)
            values = [v or b"" for v in found]
            size += sum(map(len, values))
        keys: list[bytes | None] | None = None
        if "key" in jvm:
            column = batch.column(names.index(JVM_KEY))
            size += _byte_length(column)
            keys = column.to_pylist()
        elif plan.key_field:
            keys = _bytes_column(batch.column(names.index(plan.key_field)))
            size += sum(len(k) for k in keys if k)
        wires = [b""] * n
        for name in plan.header_cols:
            for i, value in enumerate(_bytes_column(batch.column(names.index(name)))):
                if value is not None:
                    wires[i] += header_field(name, value)
                    size += len(value)
        if "partition" in jvm:
            partitions: list[int] = batch.column(names.index(JVM_PARTITION)).to_pylist()
        else:
            partitions = self._partitions(batch, keys or [None] * n)
        return RecordColumns(values, partitions, wires, keys=keys), size

    def _partitions(self, batch: pa.RecordBatch | pa.Table, keys: list[bytes | None]) -> list[int]:
        from airflow_provider_liftbridge.client import partition_for_key

        plan = self.plan
        count = plan.partitions
        if plan.partitioner == PARTITION_BY_KEY:
            return [partition_for_key(key or b"", count) for key in keys]
        if plan.partitioner == PARTITION_ROUND_ROBIN:
            start = self._next
            self._next = (start + len(keys)) % count
            return [(start + i) % count for i in range(len(keys))]
        assert plan.partition_col is not None
        chosen = batch.column(batch.schema.names.index(plan.partition_col)).to_pylist()
        for value in chosen:
            if value is None or not 0 <= value < count:
                raise SparkOptionError(
                    f"partition column {plan.partition_col!r} holds {value!r}, but stream {plan.stream!r} has "
                    f"partitions 0..{count - 1}"
                )
        return chosen


def _byte_length(column: pa.Array | pa.ChunkedArray) -> int:
    """The bytes of a binary column (nulls count 0), summed in Arrow."""
    import pyarrow.compute as pc

    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


def plan_from_options(options: Mapping[str, str], partitions: int = 0) -> PublishPlan:
    """Build a plan from ``liftbridge`` data source write options (case-insensitive keys).

    :raises SparkOptionError: when ``stream`` is missing or a value does not parse.
    """
    lowered = {key.lower(): value for key, value in options.items()}

    def get(name: str) -> str | None:
        value = lowered.get(name.lower())
        return value if value not in (None, "") else None

    if get("partitioning") is not None:
        raise SparkOptionError("the liftbridge data source's option 'partitioning' is now 'partitioner'")
    stream = get("stream")
    if stream is None:
        raise SparkOptionError("the liftbridge data source needs option 'stream'")
    headers = get("headerColumns")
    return PublishPlan(
        stream=stream,
        value_format=get("valueFormat"),  # type: ignore[arg-type]
        value_col=get("valueColumn"),
        key_field=get("keyColumn"),
        header_cols=tuple(h.strip() for h in headers.split(",") if h.strip()) if headers else (),
        partitioner=get("partitioner"),
        options=_options_of(get),
        partitions=partitions,
    )


def _options_of(get: Callable[[str], str | None]) -> PublishOptions:
    """The publishing options among the data source's string options, checked by the client's
    checks under the data source's option names."""
    policy, window, timeout = get("ackPolicy"), get("window"), get("publishTimeout")
    try:
        return PublishOptions(
            ack_policy=checks.check_ack_policy(policy, "ackPolicy") if policy else AckPolicy.LEADER,
            window=checks.check_positive_int(window, "window") if window else SPARK_WINDOW,
            timeout=checks.check_timeout(timeout, "publishTimeout"),
            compression=get("compression"),  # type: ignore[arg-type]  # checked by PublishOptions
        )
    except InvalidArgumentError as exc:
        raise SparkOptionError(f"liftbridge data source: {exc}") from None
