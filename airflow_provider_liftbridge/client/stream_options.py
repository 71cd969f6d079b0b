"""``StreamOptions``: how a new stream is made, as one frozen, validated value.

Defined once, like go-liftbridge's ``StreamOption``s and like :class:`~.publishing.options.PublishOptions`:
``LiftbridgeClient.create_stream`` (and the asyncio client's) take this value or its field names,
the request builder (:func:`~.requests.build_create_stream`) and ``LiftbridgeCreateStreamOperator``
this value; none of them spells the options out. Adding a server option is one field here, with
its check.

``None`` means "the server's default". Each field carries the check of its value (:func:`option`;
durations are ``timedelta``).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .checks import (
    Check,
    check_bool,
    check_non_negative_int,
    check_partition_count,
    check_positive_int,
    check_replication_factor,
    check_text,
    check_timedelta,
    optional,
)

__all__ = ["BOOKKEEPING_SEGMENT_BYTES", "STREAM_OPTION_NAMES", "StreamOptions", "option"]

#: Segment size of the provider's bookkeeping streams (the pipeline registry, the run history, the
#: view's lag samples, the group roster). Liftbridge's retention and compaction remove whole
#: segments, never the newest one: with its default segments (256 MB) such a stream would keep
#: everything until then, whatever its limits say.
BOOKKEEPING_SEGMENT_BYTES = 1 << 20


def option(check: Check, default: Any = None) -> Any:
    """A field of :class:`StreamOptions`: its ``default`` and the ``check`` of its value."""
    return field(default=default, metadata={"check": check})


_count = optional(check_non_negative_int)
_positive = optional(check_positive_int)
_flag = optional(check_bool)


def _duration() -> Any:
    return option(check_timedelta)


@dataclass(frozen=True, slots=True)
class StreamOptions:
    """How a stream is created (``None``: the server's default).

    :param partitions: number of partitions (partition N listens on ``subject.N``); 0 means 1.
    :param replication_factor: copies of each partition; ``-1`` means every broker (0 is
        Liftbridge's "not set", its default 1).
    :param group: NATS queue group name.
    :param retention_max_bytes: / :param retention_max_messages: / :param retention_max_age:
        retention limits.
    :param cleaner_interval: how often retention is enforced.
    :param segment_max_bytes: / :param segment_max_age: when to roll log segments.
    :param compact_enabled: / :param compact_max_goroutines: log compaction.
    :param auto_pause_time: pause partitions idle for this long.
    :param auto_pause_disable_if_subscribers: do not auto-pause partitions with subscribers.
    :param min_isr: minimum in-sync replicas for ack policy ALL.
    :param optimistic_concurrency_control: refuse publishes whose expected offset is wrong.
    :param encryption: encrypt data at rest.

    Durations are ``timedelta`` (sent in milliseconds, truncated as Go's ``Duration.Milliseconds()``).

    :raises InvalidArgumentError: a value of the wrong type or out of range (the message names
        the option and the fix).
    """

    partitions: int = option(check_partition_count, 1)
    replication_factor: int = option(check_replication_factor, 1)
    group: str | None = option(optional(check_text))
    retention_max_bytes: int | None = option(_count)
    retention_max_messages: int | None = option(_count)
    retention_max_age: timedelta | None = _duration()
    cleaner_interval: timedelta | None = _duration()
    segment_max_bytes: int | None = option(_count)
    segment_max_age: timedelta | None = _duration()
    compact_enabled: bool | None = option(_flag)
    compact_max_goroutines: int | None = option(_positive)
    auto_pause_time: timedelta | None = _duration()
    auto_pause_disable_if_subscribers: bool | None = option(_flag)
    min_isr: int | None = option(_positive)
    optimistic_concurrency_control: bool | None = option(_flag)
    encryption: bool | None = option(_flag)

    def __post_init__(self) -> None:
        for each in dataclasses.fields(self):
            object.__setattr__(self, each.name, each.metadata["check"](getattr(self, each.name), each.name))

    @classmethod
    def of(cls, options: StreamOptions | None = None, keywords: Mapping[str, Any] | None = None) -> StreamOptions:
        """``options`` (default: every option at its default) with ``keywords`` (option names)
        replacing its fields: the one place where the clients' keyword arguments become the value.

        :raises TypeError: a keyword that is no stream option (naming the closest one).
        :raises InvalidArgumentError: a bad value.
        """
        base = options if options is not None else cls()
        if not keywords:
            return base
        unknown = [name for name in keywords if name not in STREAM_OPTION_NAMES]
        if unknown:
            hints = [f"{name!r}{_did_you_mean(name)}" for name in unknown]
            raise TypeError(f"no stream option {', '.join(hints)}; the options are {', '.join(STREAM_OPTION_NAMES)}")
        return dataclasses.replace(base, **keywords)

    def replace(self, **changes: Any) -> StreamOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults, by name."""
        return {
            each.name: getattr(self, each.name)
            for each in dataclasses.fields(self)
            if getattr(self, each.name) != each.default
        }


#: The options' names, in the order of the fields.
STREAM_OPTION_NAMES: tuple[str, ...] = tuple(each.name for each in dataclasses.fields(StreamOptions))


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, STREAM_OPTION_NAMES, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
