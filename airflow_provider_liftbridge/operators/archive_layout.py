"""The archive's folder layout: a path template such as ``dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}``
that puts each message's file in a folder named by its time, the run's data interval or partition,
or a field of its JSON value (Hive-style ``name=value`` folders, which Spark, Trino and Athena read as
partition columns). The syntax is spelled in ``docs/consume.md`` ("Archive layouts"). No Airflow,
no pyarrow.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_provider_liftbridge.client import Message
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

__all__ = ["KEY_FIELD", "MISSING_VALUE", "TIME_FIELDS", "ArchiveLayout", "LayoutValueError", "RunPartition"]

#: Fields holding a time (each needs a strftime format): the message's timestamp (its reception
#: time on the partition's leader, UTC), the run's data interval (UTC) and the time its partition
#: key names (in the key's time zone, the timetable's).
TIME_FIELDS = ("timestamp", "data_interval_start", "data_interval_end", "partition_date")
#: The run's partition key as it is (no format); characters a folder name cannot hold become ``_``.
KEY_FIELD = "partition_key"
#: The folder name of a JSON field that is missing or null (what Hive and Spark read as null).
MISSING_VALUE = "__HIVE_DEFAULT_PARTITION__"
#: strftime directives allowed in a format: they give digits, names or a sign, never a ``/``.
_DIRECTIVES = frozenset("aAbBdHIjmMpSUwWyYzGuVf%")
_VALUE_FIELD = re.compile(r"value(?:\.[A-Za-z0-9_-]+)+")
_UNSAFE = re.compile(r"[/\\\x00-\x1f]")


@dataclass(frozen=True)
class RunPartition:
    """The run's partition as a layout names it: its key and the time the key names (``None``:
    the key names no time)."""

    key: str
    time: dt.datetime | None


class LayoutValueError(ValueError):
    """A message whose folder cannot be made (its value is not a JSON object)."""


@dataclass(frozen=True)
class _Piece:
    literal: str
    field: str | None
    spec: str


class ArchiveLayout:
    """A parsed path template (see the module docstring).

    :param template: the template.
    :param name: the parameter it comes from (named in errors).
    :raises LiftbridgeArgumentError: an unknown field, a bad or missing format, unbalanced
        braces, an empty or hidden folder name (naming the template and the fix).
    """

    def __init__(self, template: str, name: str = "path_layout") -> None:
        if not isinstance(template, str) or not template.strip("/ "):
            raise LiftbridgeArgumentError(f"{name} must be a folder template such as 'dt={{timestamp:%Y-%m-%d}}'")
        self.template = template
        self.name = name
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as exc:
            raise self._error(f"it is not a valid template ({exc})", "close every '{' with '}'") from None
        pieces = []
        for literal, field, spec, conversion in parsed:
            if conversion:
                raise self._error(f"'!{conversion}' is not supported", "write {field} or {field:format}")
            if field is not None:
                self._check_field(field, spec or "")
            pieces.append(_Piece(literal, field, spec or ""))
        self._pieces = tuple(pieces)
        for folder in self._skeleton().split("/"):
            if not folder or folder in (".", "..") or folder[0] in "._":
                raise self._error(
                    f"folder {folder!r} is empty, '.'/'..', or starts with '.' or '_' (readers such as Spark skip "
                    "those)",
                    "use names like dt=..., hour=...",
                )

    @property
    def uses_value(self) -> bool:
        """Whether a folder depends on the message's JSON value."""
        return any(p.field is not None and p.field.startswith("value.") for p in self._pieces)

    @property
    def uses_interval(self) -> bool:
        """Whether a folder depends on the run's data interval."""
        return any(p.field in ("data_interval_start", "data_interval_end") for p in self._pieces)

    @property
    def uses_partition(self) -> bool:
        """Whether a folder depends on the run's partition key."""
        return any(p.field in (KEY_FIELD, "partition_date") for p in self._pieces)

    def _error(self, problem: str, fix: str) -> LiftbridgeArgumentError:
        return LiftbridgeArgumentError(f"{self.name}={self.template!r}: {problem}; {fix}")

    def _check_field(self, field: str, spec: str) -> None:
        if field in TIME_FIELDS:
            if not spec:
                raise self._error(f"{{{field}}} needs a strftime format", f"e.g. {{{field}:%Y-%m-%d}}")
            directives = re.findall(r"%(.?)", spec)
            bad = [d for d in directives if d not in _DIRECTIVES]
            if bad or "/" in spec:
                raise self._error(
                    f"the format {spec!r} of {{{field}}} has {'%' + bad[0] if bad else 'a /'}, which is not allowed",
                    f"use the directives {' '.join('%' + d for d in sorted(_DIRECTIVES - {'%'}))}",
                )
            return
        if _VALUE_FIELD.fullmatch(field) or field == KEY_FIELD:
            if spec:
                raise self._error(f"{{{field}}} takes no format", f"write {{{field}}}")
            return
        raise self._error(
            f"unknown field {{{field}}}",
            f"use {', '.join('{' + f + ':FORMAT}' for f in TIME_FIELDS)}, {{{KEY_FIELD}}} or "
            "{value.<field>[.<field>...]}",
        )

    def _fields(self) -> set[str]:
        return {p.field for p in self._pieces if p.field is not None}

    def _skeleton(self) -> str:
        """The template with every field replaced by ``x`` (to check its folders' names)."""
        return "".join(p.literal + ("x" if p.field is not None else "") for p in self._pieces)

    def folder_of(
        self, interval: tuple[dt.datetime, dt.datetime] | None, partition: RunPartition | None = None
    ) -> Callable[[Message], str]:
        """A function giving a message's folder (relative, ``/``-separated).

        :param interval: the run's data interval (needed when the template names it).
        :param partition: the run's partition (needed when the template names it).
        :raises LiftbridgeArgumentError: the template names the data interval or the partition
            and the run has none, or ``{partition_date:...}`` and the key names no time.
        """
        if self.uses_interval and interval is None:
            raise self._error("this run has no data interval", "use {timestamp:...} or give the run an interval")
        if self.uses_partition and partition is None:
            raise self._error(
                "this run has no partition key (it is not a run of a partitioned schedule such as "
                "CronPartitionTimetable)",
                "run it on a partitioned schedule, or use {timestamp:...}",
            )
        if partition is not None and partition.time is None and "partition_date" in self._fields():
            raise self._error(
                f"the partition key {partition.key!r} names no time",
                "use {partition_key}, or a timetable whose keys are times",
            )
        pieces = self._pieces

        def folder(message: Message) -> str:
            value: Any = None
            if self.uses_value:
                try:
                    value = json.loads(message.value)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise LayoutValueError(
                        f"the value is not JSON ({exc}), so {self.template!r} cannot place it"
                    ) from None
                if not isinstance(value, dict):
                    raise LayoutValueError(f"the value is not a JSON object, so {self.template!r} cannot place it")
            out = []
            for piece in pieces:
                out.append(piece.literal)
                if piece.field is not None:
                    out.append(_render(piece, message, interval, partition, value))
            return "".join(out)

        return folder


def _render(
    piece: _Piece,
    message: Message,
    interval: tuple[dt.datetime, dt.datetime] | None,
    partition: RunPartition | None,
    value: Any,
) -> str:
    field = piece.field
    assert field is not None
    if field == "timestamp":
        return (
            dt.datetime.fromtimestamp(message.timestamp // 1_000_000_000, dt.UTC)
            .replace(microsecond=(message.timestamp // 1000) % 1_000_000)
            .strftime(piece.spec)
        )
    if field in ("data_interval_start", "data_interval_end"):
        assert interval is not None
        moment = interval[0] if field == "data_interval_start" else interval[1]
        return moment.astimezone(dt.UTC).strftime(piece.spec)
    if field == "partition_date":
        assert partition is not None and partition.time is not None
        return partition.time.strftime(piece.spec)  # the key's own zone: folder and key name the same day
    if field == KEY_FIELD:
        assert partition is not None
        value = partition.key
    else:
        for name in field.split(".")[1:]:
            value = value.get(name) if isinstance(value, dict) else None
    if value is None:
        return MISSING_VALUE
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = _UNSAFE.sub("_", text).strip()
    if not text or text in (".", ".."):
        return MISSING_VALUE
    return "_" + text[1:] if text[0] == "." else text
