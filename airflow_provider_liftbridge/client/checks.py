"""Checks of option values, each defined once for the client and the Airflow layer.

``check(value, name) -> the value as used``, raising :class:`~.errors.InvalidArgumentError` (a
``ValueError``) whose message names the option, the value given and what to give instead
(``"window=0 is not valid: a whole number, 1 or more, is required"``). :class:`PublishOptions`
runs them when it is made; :mod:`airflow_provider_liftbridge.validation` runs the same functions
on an operator's literal keywords when the DAG is parsed and on the rendered values after
templating, and only turns their error into the Airflow layer's ``LiftbridgeArgumentError`` (which
the core cannot import). Rendered templates are strings, so numbers may come as digit strings.
"""

from __future__ import annotations

import datetime as dt
import difflib
import re
from collections.abc import Callable, Iterable
from typing import Any

from .errors import InvalidArgumentError
from .types import AckPolicy

__all__ = [
    "Check",
    "argument_message",
    "check_ack_policy",
    "check_bool",
    "check_choice",
    "check_duration",
    "check_non_negative_int",
    "check_partition",
    "check_partition_count",
    "check_positive_int",
    "check_replication_factor",
    "check_text",
    "check_timedelta",
    "check_timeout",
    "invalid",
    "number",
    "optional",
    "whole_number",
]

#: ``check(value, name)``: the value as it is used, or an error naming ``name``.
Check = Callable[[Any, str], Any]

_WHOLE = re.compile(r"\s*-?\d+\s*")


def argument_message(name: str, value: Any, expected: str, fix: str = "") -> str:
    """The one wording of a bad value: ``name=value is not valid: expected; fix``."""
    return f"{name}={value!r} is not valid: {expected}" + (f"; {fix}" if fix else "")


def invalid(name: str, value: Any, expected: str, fix: str = "") -> InvalidArgumentError:
    """The client's error for ``name=value`` (see :func:`argument_message`)."""
    return InvalidArgumentError(argument_message(name, value, expected, fix))


def whole_number(value: Any) -> int | None:
    """``value`` as an int when it is one or a string of digits (rendered templates are strings);
    ``None`` otherwise (``bool`` included)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _WHOLE.fullmatch(value):
        return int(value)
    return None


def number(value: Any) -> float | None:
    """``value`` as a float when it is a number or a string of one; ``None`` otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def optional(check: Check) -> Check:
    """``check`` that lets ``None`` (and an empty rendered string) through as ``None``."""

    def checked(value: Any, name: str) -> Any:
        return None if value is None or value == "" else check(value, name)

    checked.__doc__ = f"``None`` or: {check.__doc__}"
    return checked


def check_partition(value: Any, name: str = "partition") -> int:
    """A partition number (``int`` or digit string).

    :raises InvalidArgumentError: not a whole number, 0 or more.
    """
    partition = whole_number(value)
    if partition is None or partition < 0:
        raise invalid(name, value, "a partition number (a whole number, 0 or more) is required", f"e.g. {name}=0")
    return partition


def check_positive_int(value: Any, name: str) -> int:
    """A whole number, 1 or more.

    :raises InvalidArgumentError: anything else.
    """
    return _whole_at_least(value, name, 1)


def check_non_negative_int(value: Any, name: str) -> int:
    """A whole number, 0 or more.

    :raises InvalidArgumentError: anything else.
    """
    return _whole_at_least(value, name, 0)


def _whole_at_least(value: Any, name: str, low: int) -> int:
    whole = whole_number(value)
    if whole is None or whole < low:
        raise invalid(name, value, f"a whole number, {low} or more, is required")
    return whole


def check_timeout(value: Any, name: str) -> float | None:
    """Seconds to wait: a positive number, or ``None`` (or ``""``) for the default.

    :raises InvalidArgumentError: zero, negative or not a number.
    """
    if value is None or value == "":
        return None
    seconds = number(value)
    if seconds is None or not seconds > 0:
        fix = f"e.g. {name}=30, or leave it unset for the default"
        raise invalid(name, value, "a positive number of seconds is required", fix)
    return seconds


def check_choice(choices: Iterable[str]) -> Check:
    """A check accepting one of ``choices`` (exactly as written); the error suggests the closest."""
    allowed = tuple(choices)

    def checked(value: Any, name: str) -> str:
        if value not in allowed:
            close = difflib.get_close_matches(str(value), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else ""
            raise invalid(name, value, f"use one of {', '.join(map(repr, allowed))}", hint)
        return str(value)

    checked.__doc__ = f"One of {', '.join(allowed)}."
    return checked


def check_ack_policy(value: Any, name: str = "ack_policy") -> AckPolicy:
    """An ack policy: ``"leader"``, ``"all"`` or ``"none"`` (any case), its wire number, or an
    :class:`AckPolicy`.

    :raises InvalidArgumentError: anything else.
    """
    if isinstance(value, AckPolicy):
        return value
    wire = whole_number(value)
    if wire is not None and wire in {p.value for p in AckPolicy}:
        return AckPolicy(wire)
    if isinstance(value, str) and value.strip().upper() in AckPolicy.__members__:
        return AckPolicy[value.strip().upper()]
    raise invalid(name, value, "not an ack policy: use one of 'leader', 'all', 'none'", f"e.g. {name}='all'")


def check_text(value: Any, name: str) -> str:
    """A non-empty string (a name, a group...).

    :raises InvalidArgumentError: not a string, or blank.
    """
    if not isinstance(value, str) or not value.strip():
        raise invalid(name, value, "a non-empty string is required")
    return value


def check_bool(value: Any, name: str) -> bool:
    """``True`` or ``False`` (not ``1``, ``"yes"`` or ``"false"``: a non-empty string is true to
    Python, so ``"false"`` would silently mean yes).

    :raises InvalidArgumentError: anything but a ``bool``.
    """
    if isinstance(value, bool):
        return value
    raise invalid(name, value, "True or False is required", f"e.g. {name}=True")


def check_partition_count(value: Any, name: str = "partitions") -> int:
    """How many partitions a new stream gets: a whole number; 0 means Liftbridge's default, 1.

    :raises InvalidArgumentError: not a whole number, or negative.
    """
    whole = whole_number(value)
    if whole is None or whole < 0:
        raise invalid(name, value, "the number of partitions is a whole number, 1 or more", f"e.g. {name}=3")
    return whole


def check_replication_factor(value: Any, name: str = "replication_factor") -> int:
    """Copies of each partition: 1 or more, or -1 for every broker. 0 is what Liftbridge reads as
    "not set" and turns into its default, 1 (its API has no way to say 0), so it is accepted.

    :raises InvalidArgumentError: not a whole number, or below -1.
    """
    whole = whole_number(value)
    if whole is None or whole < -1:
        raise invalid(name, value, "copies of each partition: 1 or more, or -1 for every broker", f"e.g. {name}=3")
    return whole


def check_timedelta(value: Any, name: str) -> dt.timedelta | None:
    """A ``datetime.timedelta`` (the client's durations), or ``None`` to leave it unset.

    :raises InvalidArgumentError: anything else (a number of seconds too: see :func:`check_duration`).
    """
    if value is None or isinstance(value, dt.timedelta):
        return value
    raise InvalidArgumentError(f"{name} must be a datetime.timedelta, got {value!r}")


def check_duration(value: Any, name: str) -> dt.timedelta | None:
    """A duration as an operator's keyword takes it: a ``timedelta`` or a number of seconds, not
    negative; ``None`` (or ``""``) leaves it unset.

    :raises InvalidArgumentError: anything else.
    """
    if value is None or value == "":
        return None
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else number(value)
    if seconds is None or seconds < 0:
        raise invalid(
            name, value, "a timedelta or a number of seconds, 0 or more", f"e.g. {name}=timedelta(hours=1) or 3600"
        )
    return dt.timedelta(seconds=seconds)
