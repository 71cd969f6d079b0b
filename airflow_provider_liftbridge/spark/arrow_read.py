"""Arrow record batches of the ``liftbridge`` read schema, built from a subscription's columns
(:class:`~airflow_provider_liftbridge.client.MessageColumns`) in one go per column: no Python
object per message, no per-row loop.

Pure pyarrow (the executors' environment has no numpy): no PySpark, so it is tested without a session.
Arrays and scalars come from :mod:`.arrow_arrays`, never from ``pa.array`` / ``pa.scalar`` of Python
values, which import pandas (issue 57).

``headers`` is null for a message without headers, and otherwise its headers as delivered
(including the ``subject`` / ``reply`` headers Liftbridge adds to every message it stores).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .arrow_arrays import bytes_array, int_array

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_provider_liftbridge.client import MessageColumns


def read_schema() -> pa.Schema:
    """The Arrow schema of what the ``liftbridge`` source reads."""
    import pyarrow as pa

    return pa.schema(
        [
            ("stream", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("headers", pa.map_(pa.string(), pa.binary())),
        ]
    )


def columns_batch(
    columns: MessageColumns,
    *,
    first_offset: int | None = None,
    last_offset: int | None = None,
    start_time_ns: int | None = None,
    stop_time_ns: int | None = None,
) -> pa.RecordBatch:
    """``columns`` as a record batch of :func:`read_schema`, keeping only the rows with offsets in
    ``first_offset .. last_offset`` and times in ``start_time_ns .. stop_time_ns`` (all inclusive,
    ``None``: unbounded). Timestamps are truncated to microseconds (Spark's precision)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    rows = len(columns.offsets)
    schema = read_schema()
    times_ns = int_array(columns.timestamps)
    keys = bytes_array(columns.keys)
    if b"" in columns.keys:  # no key: null, as a Message's key is None
        empty = pc.equal(pc.binary_length(keys), int_array([0], pa.int32())[0])
        keys = pc.if_else(empty, pa.nulls(1, pa.binary())[0], keys)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.repeat(bytes_array([columns.stream.encode()], pa.string())[0], rows),
            pa.repeat(int_array([columns.partition], pa.int32())[0], rows),
            int_array(columns.offsets),
            keys,
            bytes_array(columns.values),
            pc.divide(times_ns, int_array([1000])[0]).cast(pa.timestamp("us", tz="UTC")),
            _headers(columns),
        ],
        schema=schema,
    )
    keep = _kept(columns, times_ns, first_offset, last_offset, start_time_ns, stop_time_ns)
    return batch if keep is None else batch.filter(keep)


def _kept(
    columns: MessageColumns,
    times_ns: pa.Array,
    first_offset: int | None,
    last_offset: int | None,
    start_time_ns: int | None,
    stop_time_ns: int | None,
) -> pa.Array | None:
    """The mask of the rows within the bounds; ``None`` when every row is (the usual case: the
    subscription starts and stops at the bounds, so only the offsets at the ends are looked at)."""
    import pyarrow.compute as pc

    offsets = columns.offsets

    def bound(value: int) -> pa.Scalar:
        return int_array([value])[0]

    conditions = []
    if first_offset is not None and offsets[0] < first_offset:
        conditions.append(pc.greater_equal(int_array(offsets), bound(first_offset)))
    if last_offset is not None and offsets[-1] > last_offset:
        conditions.append(pc.less_equal(int_array(offsets), bound(last_offset)))
    if start_time_ns is not None:
        conditions.append(pc.greater_equal(times_ns, bound(start_time_ns)))
    if stop_time_ns is not None:
        conditions.append(pc.less_equal(times_ns, bound(stop_time_ns)))
    if not conditions:
        return None
    keep = conditions[0]
    for condition in conditions[1:]:
        keep = pc.and_(keep, condition)
    return keep


def _headers(columns: MessageColumns) -> pa.Array:
    """The ``headers`` column: a map per distinct header set of the batch, converted once, taken
    for each row (a null index, for a row without headers, takes a null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    map_type = pa.map_(pa.string(), pa.binary())
    index = columns.header_index
    sets = columns.header_sets
    if not sets:
        return pa.nulls(len(index), map_type)
    offsets = [0]
    names: list[str] = []
    items: list[bytes] = []
    for headers in sets:
        names.extend(headers.keys())
        items.extend(headers.values())
        offsets.append(len(names))
    per_set = pa.MapArray.from_arrays(
        int_array(offsets, pa.int32()),
        bytes_array([name.encode() for name in names], pa.string()),
        bytes_array(items),
        type=map_type,
    )
    zero = int_array([0])[0]
    if len(sets) == 1 and index[0] == 0 and index.count(0) == len(index):
        # The usual batch: the server's two headers on every row. One index array of zeros
        # without a Python int per row.
        return per_set.take(pa.repeat(zero, len(index)))
    which = int_array(index)
    if min(index) < 0:
        which = pc.if_else(pc.less(which, zero), pa.nulls(1, pa.int64())[0], which)
    return per_set.take(which)
