"""``DeadLetterStream``: where the reading operators set aside what they cannot process, as one value.

``dead_letters=DeadLetterStream("orders-dlq", create=True)`` on
:class:`~airflow_provider_liftbridge.operators.consume.LiftbridgeConsumeOperator` and
:class:`~airflow_provider_liftbridge.operators.stream_to_file.LiftbridgeStreamToFileOperator`
says it all: a message that cannot be processed goes to that stream (with why, in its headers)
and the read goes on; without it, such a message fails the task. It replaces three keywords for
the one idea (``on_error="dead_letter"``, ``dead_letter_stream``, ``create_dead_letter_stream``),
which still work and warn (:func:`dead_letters_from_keywords`).

A ``NamedTuple``, so it is immutable and Airflow renders it when it is a templated field: its
``stream`` may be a Jinja template (each element is rendered, the value rebuilt).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.validation import bad_argument, check_bool, check_choice, check_stream

__all__ = ["ON_ERROR", "DeadLetterStream", "check_dead_letters", "dead_letters_from_keywords"]

#: Values of the deprecated ``on_error`` keyword.
ON_ERROR = ("fail", "dead_letter")


class DeadLetterStream(NamedTuple):
    """The dead-letter stream of a reading operator.

    :param stream: the stream dead letters are published to (each acknowledged before the
        position moves past its message). (templated, as part of ``dead_letters``)
    :param create: create it (one partition) when it is missing; default: a missing one is an
        error before anything is read.
    """

    stream: str
    create: bool = False


def check_dead_letters(value: Any, name: str = "dead_letters") -> DeadLetterStream | None:
    """``None`` (no dead letters: a failure fails the task) or a :class:`DeadLetterStream` with a
    valid stream name and a boolean ``create``.

    :raises LiftbridgeArgumentError: anything else, naming the fix.
    """
    if value is None:
        return None
    if not isinstance(value, DeadLetterStream):
        raise bad_argument(
            name, value, "a DeadLetterStream value or None", f"e.g. {name}=DeadLetterStream('orders-dlq', create=True)"
        )
    return DeadLetterStream(check_stream(value.stream, f"{name}.stream"), check_bool(value.create, f"{name}.create"))


def dead_letters_from_keywords(
    dead_letters: Any, on_error: Any, dead_letter_stream: Any, create_dead_letter_stream: Any
) -> Any:
    """The ``dead_letters`` value, from itself or from the three deprecated keywords it replaces
    (each given one warns, naming the replacement). The value itself is checked later, with the
    other arguments (by :func:`check_dead_letters`).

    :raises LiftbridgeArgumentError: both ways are given, ``on_error`` is unknown, or
        ``on_error="dead_letter"`` has no stream.
    """
    old = {
        name: value
        for name, value in (
            ("on_error", on_error),
            ("dead_letter_stream", dead_letter_stream),
            ("create_dead_letter_stream", create_dead_letter_stream),
        )
        if value is not None
    }
    if not old:
        return dead_letters
    if dead_letters is not None:
        raise LiftbridgeArgumentError(
            f"give dead_letters only: {', '.join(old)} {'is' if len(old) == 1 else 'are'} its deprecated form"
        )
    old_create = "create_dead_letter_stream"
    mode = check_choice(ON_ERROR)(on_error if on_error is not None else "fail", "on_error")
    create = False if create_dead_letter_stream is None else check_bool(create_dead_letter_stream, old_create)
    instead = (
        f"dead_letters=DeadLetterStream({dead_letter_stream!r}{', create=True' if create else ''})"
        if mode == "dead_letter"
        else "no dead_letters (a failure fails the task)"
    )
    warnings.warn(
        f"{', '.join(old)} {'is' if len(old) == 1 else 'are'} deprecated on the reading operators; use {instead}",
        AirflowProviderDeprecationWarning,
        stacklevel=4,
    )
    if mode == "fail":
        return None  # a stream given with on_error="fail" was never used
    if not dead_letter_stream:
        raise LiftbridgeArgumentError(
            "on_error='dead_letter' needs dead_letter_stream: the stream to send to "
            "(better: dead_letters=DeadLetterStream('orders-dlq'))"
        )
    return DeadLetterStream(dead_letter_stream, create)
