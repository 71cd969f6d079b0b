"""The message browser's input (docs/ui.md, "The message browser"): each field as typed (text)
checked and parsed, with an error naming the field and what to type; and the JSON path subset.
No Airflow, no FastAPI here."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from typing import Any

__all__ = [
    "JsonPath",
    "SearchInputError",
    "blank",
    "header_filter",
    "parse_count",
    "parse_json_path",
    "parse_key",
    "parse_offset",
    "parse_positions",
    "parse_time",
    "positions_text",
]

#: Message timestamps are int64 nanoseconds: they end in 2262.
_MAX_TIMESTAMP_S = (1 << 63) / 1e9


class SearchInputError(ValueError):
    """A search field is wrong: ``field`` names it, the text says what to type."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def blank(text: str | None) -> str | None:
    return None if text is None or not text.strip() else text.strip()


def parse_offset(text: str | None, field: str = "offset", *, low: int = 0) -> int | None:
    """A whole number ``>= low`` (``None`` when blank).

    :raises SearchInputError: anything else.
    """
    text = blank(text)
    if text is None:
        return None
    if not re.fullmatch(r"-?\d+", text) or int(text) < low:
        raise SearchInputError(field, f"{field} must be a whole number, {low} or more (e.g. 1200); got {text!r}")
    return int(text)


def parse_count(text: str | None, field: str, default: int | None, high: int) -> int | None:
    """A whole number from 1 to ``high`` (``default`` when blank).

    :raises SearchInputError: anything else.
    """
    text = blank(text)
    if text is None:
        return default
    if not re.fullmatch(r"\d+", text) or not 1 <= int(text) <= high:
        raise SearchInputError(field, f"{field} must be a whole number from 1 to {high:,}; got {text!r}")
    return int(text)


def parse_time(text: str | None, field: str = "time") -> dt.datetime | None:
    """An ISO 8601 date-time (UTC when it names no zone; ``Z`` or ``+02:00`` name one), or ``None``.

    :raises SearchInputError: not such a time, or outside what message timestamps hold.
    """
    text = blank(text)
    if text is None:
        return None
    try:
        at = dt.datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise SearchInputError(
            field,
            f"{field} must be a date and time like 2026-12-06T09:30 or 2026-12-06T09:30:00Z"
            f" (UTC unless it names a zone, e.g. +01:00); got {text!r}",
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    if not 0 <= at.timestamp() < _MAX_TIMESTAMP_S:
        raise SearchInputError(field, f"{field} must be between 1970 and 2262 (message timestamps); got {text!r}")
    return at


def parse_positions(text: str | None) -> dict[int, int] | None:
    """A page position, ``0:15,1:22`` (partition:offset, the next offset to read in each)."""
    text = blank(text)
    if text is None:
        return None
    found: dict[int, int] = {}
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(-?\d+)\s*", part)
        if match is None or int(match[2]) < -1:
            raise SearchInputError(
                "at", f"at must be partition:offset pairs like 0:15,1:22 (from the Older/Newer buttons); got {text!r}"
            )
        found[int(match[1])] = int(match[2])
    return found


def positions_text(positions: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(positions.items()))


# -- JSON path ---------------------------------------------------------------------------------
_STEP = re.compile(r"\.([A-Za-z_][\w-]*)|\[\s*(-?\d+)\s*\]|\[\s*(\"(?:[^\"\\]|\\.)*\")\s*\]")
_MISSING = object()


@dataclasses.dataclass(frozen=True)
class JsonPath:
    """``$.a.b[0]`` alone (the path exists), or with ``== literal`` / ``!= literal``."""

    steps: tuple[str | int, ...]
    op: str | None = None
    literal: Any = None

    def matches(self, document: Any) -> bool:
        """Whether the parsed JSON ``document`` passes."""
        found = document
        for step in self.steps:
            if isinstance(step, int) and isinstance(found, list) and -len(found) <= step < len(found):
                found = found[step]
            elif isinstance(step, str) and isinstance(found, dict) and step in found:
                found = found[step]
            else:
                return False  # a missing path matches neither == nor !=
        if self.op is None:
            return True
        return _same(found, self.literal) == (self.op == "==")


def _same(a: Any, b: Any) -> bool:
    # Python says True == 1: JSON does not.
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


_PATH_HELP = 'type a path like $.order.id, $.items[0].sku or $["odd key"], optionally followed by == or != and a value'


def parse_json_path(text: str | None) -> JsonPath | None:
    """The browser's JSON path subset (docs/ui.md): ``$`` then ``.name``, ``[index]`` (negative from
    the end) or ``["name"]`` steps; then nothing (the path exists), or ``==`` / ``!=`` and a JSON
    literal (``7``, ``"text"``, ``true``, ``null``) or a bare word (a string: ``== shipped``).

    :raises SearchInputError: anything else, with what to type.
    """
    text = blank(text)
    if text is None:
        return None
    if not text.startswith("$"):
        raise SearchInputError("path", f"a JSON path starts with $: {_PATH_HELP}; got {text!r}")
    at, steps = 1, []
    while at < len(text) and text[at] not in " =!":
        match = _STEP.match(text, at)
        if match is None:
            raise SearchInputError("path", f"cannot read the path at {text[at:]!r}: {_PATH_HELP}")
        name, index, quoted = match.groups()
        steps.append(int(index) if index is not None else json.loads(quoted) if quoted is not None else name)
        at = match.end()
    rest = text[at:].strip()
    if not rest:
        return JsonPath(tuple(steps))
    op_match = re.match(r"(==|!=)\s*(.*)$", rest, re.S)
    if op_match is None or not op_match[2].strip():
        raise SearchInputError("path", f"after the path comes == or != and a value: {_PATH_HELP}; got {text!r}")
    op, word = op_match[1], op_match[2].strip()
    try:
        literal = json.loads(word)
    except ValueError:
        if word.startswith(('"', "[", "{")):
            raise SearchInputError("path", f"the value {word!r} is not valid JSON: {_PATH_HELP}") from None
        literal = word  # a bare word: the string
    return JsonPath(tuple(steps), op, literal)


def parse_key(text: str | None) -> bytes | None:
    """A key to match exactly: text (UTF-8), or ``hex:`` and its bytes in hex (``hex:00ff``).

    :raises SearchInputError: ``hex:`` followed by something not hex.
    """
    text = blank(text)
    if text is None:
        return None
    if text.lower().startswith("hex:"):
        digits = text[4:].replace(" ", "")
        try:
            return bytes.fromhex(digits)
        except ValueError:
            raise SearchInputError(
                "key", f"after hex: come pairs of hex digits (e.g. hex:00ff1a), or type the key as text; got {text!r}"
            ) from None
    return text.encode()


def header_filter(text: str | None) -> tuple[str, bytes | None] | None:
    text = blank(text)
    if text is None:
        return None
    name, eq, value = text.partition("=")
    if not name.strip():
        raise SearchInputError("header", f"header must be a name, or name=value (e.g. trace-id=abc); got {text!r}")
    return name.strip(), value.encode() if eq else None
