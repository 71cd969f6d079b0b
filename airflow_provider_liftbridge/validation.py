"""Argument checks shared by the Airflow rooms (sensors, triggers, queues, operators): one neutral
module, so a sensor validating its arguments at DAG parse time does not import the triggers.
Each raises :class:`~airflow_provider_liftbridge.exceptions.LiftbridgeArgumentError` naming the
argument and what it accepts.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow_provider_liftbridge.client import StartPosition
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

__all__ = ["START_NAMES", "check_partition", "check_stream", "parse_start_at"]

START_NAMES = {p.value: p for p in StartPosition}


def check_stream(value: Any) -> str:
    """A stream name: a non-empty string.

    :raises LiftbridgeArgumentError: not a string, or empty.
    """
    if not isinstance(value, str) or not value:
        raise LiftbridgeArgumentError(f"stream must be a stream name, got {value!r}")
    return value


def check_partition(value: Any, what: str = "partition") -> int:
    """A partition number (``int`` or digit string).

    :raises LiftbridgeArgumentError: not a non-negative whole number.
    """
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(value)
    except (TypeError, ValueError):
        raise LiftbridgeArgumentError(f"{what} must be a partition number, got {value!r}") from None
    if number < 0:
        raise LiftbridgeArgumentError(f"{what} must not be negative, got {value!r}")
    return number


def parse_start_at(value: Any) -> StartPosition | int | dt.datetime:
    """Read a start position: an offset (``int`` or digits), ``"earliest"``, ``"latest"``,
    ``"new_only"``, a :class:`StartPosition`, or an ISO 8601 timestamp (naive means UTC).

    :raises LiftbridgeArgumentError: none of those.
    """
    if isinstance(value, StartPosition):
        return value
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise LiftbridgeArgumentError(f"start offset must not be negative, got {value}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        if text.lower() in START_NAMES:
            return START_NAMES[text.lower()]
        try:
            return parse_start_at(dt.datetime.fromisoformat(text))
        except ValueError:
            pass
    raise LiftbridgeArgumentError(
        f"start_at {value!r} is not an offset, 'earliest', 'latest', 'new_only' or an ISO 8601 timestamp"
    )
