"""Argument checks shared by the Airflow rooms (operators, sensors, triggers, queues): one neutral
module, so a sensor validating its arguments at DAG parse time does not import the triggers.

Every option has one validator, ``check_x(value, name) -> value as used``. It runs twice: in the
operator's constructor for a literal value, so a bad DAG fails when it is parsed, and again once
templates are rendered (a value holding ``{{`` waits for that; see :func:`waits_for_rendering`).
Each raises :class:`~airflow_provider_liftbridge.exceptions.LiftbridgeArgumentError` whose message
names the parameter, the value given and what to give instead.

:class:`~airflow_provider_liftbridge.argument_checks.ArgumentChecks` is how an operator or sensor
declares these validators and runs them at both moments. See ``docs/validation.md`` for the rules
(coercions, ``None``, what is checked when).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_provider_liftbridge import callables
from airflow_provider_liftbridge.callables import WORKER, FunctionPathError
from airflow_provider_liftbridge.client import InvalidArgumentError, StartPosition, checks
from airflow_provider_liftbridge.client.checks import Check, argument_message, optional, whole_number
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

__all__ = [
    "START_NAMES",
    "Check",
    "bad_argument",
    "check_ack_policy",
    "check_bool",
    "check_choice",
    "check_duration",
    "check_function",
    "check_function_path",
    "check_header_value",
    "check_headers",
    "check_key",
    "check_name",
    "check_non_negative_int",
    "check_offset",
    "check_optional_name",
    "check_optional_partition",
    "check_partition",
    "check_partition_count",
    "check_partition_list",
    "check_positive_int",
    "check_replication_factor",
    "check_start_at",
    "check_stream",
    "check_subject",
    "check_timeout",
    "import_function",
    "optional",
    "parse_start_at",
    "waits_for_rendering",
]

START_NAMES = {p.value: p for p in StartPosition}

_TEMPLATE_MARKS = ("{{", "{%")


def waits_for_rendering(value: Any) -> bool:
    """Whether ``value`` is not known before the task runs: a string holding a Jinja expression
    (``{{``/``{%``), also inside a list, tuple, set or dict, or an Airflow object resolved at run
    time (an ``XComArg`` such as ``task.output``)."""
    if isinstance(value, str):
        return any(mark in value for mark in _TEMPLATE_MARKS)
    if isinstance(value, Mapping):
        return any(waits_for_rendering(k) or waits_for_rendering(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(waits_for_rendering(v) for v in value)
    # XComArg, MappedArgument, ...: resolved by Airflow when the task runs (no import of Airflow here).
    return type(value).__module__.split(".")[0] == "airflow"


def bad_argument(name: str, value: Any, expected: str, fix: str = "") -> LiftbridgeArgumentError:
    """The error for ``name=value``: what was expected and, when given, what to do (the wording of
    :func:`~airflow_provider_liftbridge.client.checks.argument_message`)."""
    return LiftbridgeArgumentError(argument_message(name, value, expected, fix))


def airflow_check(check: Check) -> Check:
    """``check`` (one of the client's, :mod:`airflow_provider_liftbridge.client.checks`, which
    raise ``InvalidArgumentError``, or of :mod:`airflow_provider_liftbridge.callables`) raising
    :class:`LiftbridgeArgumentError` instead, with the same message: the one definition of a check
    serves the client's values, the Spark room's and the operators' keywords."""

    def checked(value: Any, *name: str) -> Any:  # ``name`` keeps the check's own default, if any
        try:
            return check(value, *name)
        except (InvalidArgumentError, FunctionPathError) as exc:
            raise LiftbridgeArgumentError(str(exc)) from None

    checked.__doc__ = check.__doc__
    checked.__name__ = getattr(check, "__name__", "checked")
    return checked


# -- functions ------------------------------------------------------------------------------------

#: A callable, or a dotted path of a function checked for its shape only (nothing is imported at
#: parse time: see :mod:`airflow_provider_liftbridge.callables`).
check_function: Check = airflow_check(callables.check_function)
#: A dotted path of a function (no callable: the value is serialized, e.g. into a trigger), shape only.
check_function_path: Check = airflow_check(callables.check_function_path)


def import_function(value: Any, name: str, where: str = WORKER) -> Callable[..., Any]:
    """The function ``value`` names, imported in this process (``where`` it runs: the worker by default).

    :raises LiftbridgeArgumentError: the error of :func:`airflow_provider_liftbridge.callables.import_function`
        (it names the parameter, the path, the cause and where the module must be importable).
    """
    try:
        return callables.import_function(value, name, where)
    except FunctionPathError as exc:
        raise LiftbridgeArgumentError(str(exc)) from exc.__cause__  # keeps what the module raised


# -- names ----------------------------------------------------------------------------------------


def check_stream(value: Any, name: str = "stream") -> str:
    """A stream name: a non-empty string.

    :raises LiftbridgeArgumentError: not a string, or empty.
    """
    if not isinstance(value, str) or not value.strip():
        raise bad_argument(name, value, "a stream name is required", f"give the stream's name, e.g. {name}='orders'")
    return value


def check_name(value: Any, name: str) -> str:
    """A non-empty string (a connection id, a cursor id, a producer id, a field name...).

    :raises LiftbridgeArgumentError: not a string, or blank.
    """
    if not isinstance(value, str) or not value.strip():
        raise bad_argument(name, value, "a non-empty string is required")
    return value


check_optional_name = optional(check_name)


def check_subject(value: Any, name: str = "subject") -> str | None:
    """A NATS subject (no whitespace, no empty token), or ``None`` for the stream's name.

    :raises LiftbridgeArgumentError: anything else.
    """
    if value is None:
        return None
    if not isinstance(value, str) or not value or re.search(r"\s", value) or not all(value.split(".")):
        raise bad_argument(
            name,
            value,
            "a NATS subject has no spaces and no empty '.'-separated token",
            f"e.g. {name}='orders.eu', or leave it unset to use the stream's name",
        )
    return value


# -- numbers --------------------------------------------------------------------------------------


#: A partition number (``int`` or digit string), 0 or more (the client's check).
check_partition: Check = airflow_check(checks.check_partition)
check_optional_partition = optional(check_partition)


def check_offset(value: Any, name: str = "target_offset") -> int:
    """An offset: a whole number, 0 or more (``int`` or digit string).

    :raises LiftbridgeArgumentError: anything else.
    """
    whole = whole_number(value)
    if whole is None or whole < 0:
        raise bad_argument(name, value, "an offset (a whole number, 0 or more) is required", f"e.g. {name}=41")
    return whole


#: A whole number, 1 or more (the client's check).
check_positive_int: Check = airflow_check(checks.check_positive_int)
#: A whole number, 0 or more (the client's check).
check_non_negative_int: Check = airflow_check(checks.check_non_negative_int)
#: How many partitions a new stream gets (0 means Liftbridge's 1; the client's check).
check_partition_count: Check = airflow_check(checks.check_partition_count)
#: Copies of each partition, 1 or more or -1 for every broker (0 is Liftbridge's 1; the client's check).
check_replication_factor: Check = airflow_check(checks.check_replication_factor)


#: Seconds to wait: a positive number, or ``None`` for the default (the client's check).
check_timeout: Check = airflow_check(checks.check_timeout)


#: A duration: a ``timedelta`` or a number of seconds, 0 or more (the client's check).
check_duration: Check = airflow_check(checks.check_duration)


# -- choices --------------------------------------------------------------------------------------

#: ``True`` or ``False``, nothing else (the client's check).
check_bool: Check = airflow_check(checks.check_bool)


def check_choice(choices: Iterable[str]) -> Check:
    """A validator accepting one of ``choices`` (exactly as written; the client's check)."""
    return airflow_check(checks.check_choice(choices))


#: An ack policy: ``"leader"``, ``"all"`` or ``"none"`` (any case), its wire number, or an
#: :class:`AckPolicy` (the client's check).
check_ack_policy: Check = airflow_check(checks.check_ack_policy)


def parse_start_at(value: Any, name: str = "start_at") -> StartPosition | int | dt.datetime:
    """Read a start position: an offset (``int`` or digits), ``"earliest"``, ``"latest"``,
    ``"new_only"``, a :class:`StartPosition`, or an ISO 8601 timestamp (naive means UTC).

    :raises LiftbridgeArgumentError: none of those.
    """
    if isinstance(value, StartPosition):
        return value
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    offset = whole_number(value)
    if offset is not None and offset >= 0:
        return offset
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in START_NAMES:
            return START_NAMES[text.lower()]
        try:
            return parse_start_at(dt.datetime.fromisoformat(text), name)
        except ValueError:
            pass
    raise bad_argument(
        name,
        value,
        "a start position is an offset (0 or more), 'earliest', 'latest', 'new_only' or an ISO 8601 timestamp",
        f"e.g. {name}='earliest' or {name}='2024-05-01T00:00:00Z'",
    )


check_start_at = parse_start_at


# -- keys and headers -----------------------------------------------------------------------------


def check_key(value: Any, name: str = "key") -> bytes | None:
    """A record key: ``bytes``, ``str`` (UTF-8) or an ``int`` (its decimal digits, ``123`` ->
    ``b"123"``, so whole-number ids partition as their text does); ``None`` for no key.

    :raises LiftbridgeArgumentError: anything else (``bool``, ``float``, a container...), which has
        no single obvious text.
    """
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value).encode("ascii")
    raise bad_argument(
        name,
        value,
        f"a key is bytes, str or int, not {type(value).__name__}",
        "convert it yourself, e.g. str(value) or json.dumps(value)",
    )


def check_header_value(value: Any, name: str) -> bytes:
    """A header value: ``bytes``, ``str`` (UTF-8) or ``int`` (decimal digits), as :func:`check_key`.

    :raises LiftbridgeArgumentError: ``None`` or another type.
    """
    if value is None:
        raise bad_argument(name, value, "a header value is bytes, str or int", "give b'' for an empty value")
    key = check_key(value, name)
    assert key is not None
    return key


def check_headers(value: Any, name: str = "headers") -> dict[str, bytes] | None:
    """Headers: a mapping of non-empty ``str`` names to values :func:`check_header_value` accepts;
    ``None`` for none.

    :raises LiftbridgeArgumentError: not a mapping, a name that is not a string, or a bad value.
    """
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad_argument(name, value, "headers are a dict of name -> value", f"e.g. {name}={{'source': 'billing'}}")
    headers: dict[str, bytes] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise bad_argument(name, value, f"header names are non-empty strings, got {key!r}")
        headers[key] = check_header_value(item, f"{name}[{key!r}]")
    return headers


# -- partitions -----------------------------------------------------------------------------------


def check_partition_list(value: Any, name: str = "partitions") -> list[int] | None:
    """Partition numbers: one, or a list of them (digit strings too); ``None`` for all.

    :raises LiftbridgeArgumentError: anything else, or a negative number.
    """
    if value is None or value == "":
        return None
    items = [value] if isinstance(value, int | str) else value
    if not isinstance(items, Iterable) or isinstance(items, Mapping):
        raise bad_argument(name, value, "partition numbers: one, or a list of them", f"e.g. {name}=[0, 2]")
    numbers = [whole_number(p) for p in items]
    if any(n is None or n < 0 for n in numbers):
        raise bad_argument(
            name, value, "partition numbers are whole numbers, 0 or more", f"e.g. {name}=[0, 2], or None for all"
        )
    return [n for n in numbers if n is not None]
