"""Ready-made apply functions for ``LiftbridgeMessageSensor`` / ``LiftbridgeMessageTrigger``.

Pass them by dotted path, e.g. ``apply_function="airflow_provider_liftbridge.sensors.matchers.value_contains"``
with ``apply_function_args=["ready"]``. Each takes the delivered
:class:`~airflow_provider_liftbridge.client.Message` first and returns whether it matches.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_provider_liftbridge.client import Message

__all__ = ["any_message", "header_equals", "json_field_equals", "key_equals", "value_contains"]


def _as_bytes(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode("utf-8")


def any_message(message: Message) -> bool:
    """Match the first message delivered."""
    return True


def value_contains(message: Message, needle: str | bytes) -> bool:
    """Match when the value contains ``needle`` (UTF-8 for a ``str``)."""
    return _as_bytes(needle) in message.value


def key_equals(message: Message, key: str | bytes) -> bool:
    """Match when the key equals ``key``."""
    return message.key == _as_bytes(key)


def header_equals(message: Message, name: str, value: str | bytes) -> bool:
    """Match when header ``name`` equals ``value``."""
    return message.headers.get(name) == _as_bytes(value)


def json_field_equals(message: Message, field: str, expected: Any) -> Any:
    """Match when the value is a JSON object whose ``field`` equals ``expected``; returns the
    decoded object (so the sensor's XCom carries it as ``match``). Non-JSON values never match."""
    try:
        document = json.loads(message.value)
    except (ValueError, UnicodeDecodeError):
        return False
    if isinstance(document, dict) and document.get(field) == expected:
        return document
    return False
