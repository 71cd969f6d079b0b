"""Turning user values into records: encoding (bytes, text, JSON), keys, headers, partitioners."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_liftbridge.client import KeyPartitioner, Partitioner, Record, RoundRobinPartitioner
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.validation import check_header_value, check_key

__all__ = ["PARTITIONERS", "build_record", "json_default", "make_partitioner", "to_bytes"]

#: Names accepted by the ``partitioner`` argument of the publishing operators.
PARTITIONERS: dict[str, Callable[[], Partitioner]] = {"key": KeyPartitioner, "round_robin": RoundRobinPartitioner}


def make_partitioner(name: str | None) -> Partitioner | None:
    """Build the partitioner named ``"key"`` or ``"round_robin"`` (``None``: the client's default).

    :raises LiftbridgeArgumentError: unknown name.
    """
    if name is None or name == "":
        return None
    try:
        return PARTITIONERS[name]()
    except KeyError:
        raise LiftbridgeArgumentError(
            f"partitioner {name!r} is unknown; use one of {', '.join(PARTITIONERS)} (or leave it unset)"
        ) from None


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback for the values tables and Python code commonly hold: datetimes and
    dates as ISO 8601, decimals and UUIDs as strings, bytes as base64, sets as lists."""
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"a value of type {type(value).__name__} cannot be published as JSON")


def to_bytes(value: Any, *, what: str = "value") -> bytes:
    """Encode a value to publish: bytes as they are, ``str`` as UTF-8, anything else as compact JSON.

    :raises LiftbridgeArgumentError: the value cannot be encoded as JSON.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=json_default).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise LiftbridgeArgumentError(f"cannot encode {what}: {exc}") from None


def build_record(
    item: Any,
    *,
    key: Any = None,
    key_field: str | None = None,
    headers: Mapping[str, Any] | None = None,
    extra_headers: Mapping[str, Any] | None = None,
) -> Record:
    """Turn one user value into a :class:`Record`.

    A :class:`Record` is taken as it is, with ``headers``/``extra_headers`` added to its own.
    Anything else becomes the value (see :func:`to_bytes`); the key is ``key`` or, for mappings,
    the value of ``key_field``.

    :param item: the value, or a ready :class:`Record`.
    :param key: a key for every record (str, bytes or int; see
        :func:`~airflow_provider_liftbridge.validation.check_key`).
    :param key_field: the field of a mapping value to use as its key (wins over ``key``; its
        value follows the same rule, ``None`` meaning no key).
    :param headers: headers for every record (values str, bytes or int).
    :param extra_headers: per-record headers (file name, record number, ...).
    :raises LiftbridgeArgumentError: ``key_field`` is set but the value is not a mapping or lacks
        it, or a key or header value of another type.
    """
    merged: dict[str, bytes] = {}
    for source, what in ((headers, "headers"), (extra_headers, "header")):
        if source:
            merged.update({str(k): check_header_value(v, f"{what}[{k!r}]") for k, v in source.items()})
    if isinstance(item, Record):
        if not merged:
            return item
        own = dict(item.headers or {})
        return Record(
            value=item.value,
            key=item.key,
            headers=merged | own,
            partition=item.partition,
            expected_offset=item.expected_offset,
            correlation_id=item.correlation_id,
        )
    record_key = check_key(key)
    if key_field:
        if not isinstance(item, Mapping):
            raise LiftbridgeArgumentError(
                f"key_field {key_field!r} needs records that are mappings, got a {type(item).__name__}"
            )
        if key_field not in item:
            raise LiftbridgeArgumentError(
                f"key_field={key_field!r} is not a field of this record; its fields are {sorted(map(str, item))}: "
                "set key_field to one of them"
            )
        record_key = check_key(item[key_field], f"key (the record's {key_field!r} field)")
    return Record(value=to_bytes(item), key=record_key, headers=merged or None)
