"""Re-send policies: whether a record without an ack is published again (at-least-once) or not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..errors import InvalidArgumentError

__all__ = ["DEFAULT_RESEND", "NO_RESEND", "NoResend", "ResendPolicy", "ResendUnacked"]


class ResendPolicy(Protocol):
    """Decides whether a record is published again when its ack did not come in time (NATS path)
    or its connection was lost before the ack (gRPC path). Re-sending makes publishing
    at-least-once: the first copy may have been stored too.
    """

    def should_resend(self, index: int, attempt: int) -> bool:
        """:param index: the record's position in the call's input.
        :param attempt: the send of this record this would be (2 for its first re-send).
        :returns: ``True`` to publish the record again, ``False`` to give up on it (the call then
            raises ``PublishError`` with an ``AckTimeoutError`` for it).
        """
        ...


@dataclass(frozen=True, slots=True)
class ResendUnacked:
    """Re-send every unacknowledged record, up to ``max_resends`` times (the default policy).

    :raises InvalidArgumentError: ``max_resends`` is negative.
    """

    max_resends: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.max_resends, bool) or not isinstance(self.max_resends, int) or self.max_resends < 0:
            raise InvalidArgumentError(f"max_resends must be a whole number >= 0, got {self.max_resends!r}")

    def should_resend(self, index: int, attempt: int) -> bool:
        return attempt - 1 <= self.max_resends


@dataclass(frozen=True, slots=True)
class NoResend:
    """Never re-send: a record without an ack in time fails the call. For callers that decide
    themselves what to publish again (exactly-once publishing scans the partition first)."""

    def should_resend(self, index: int, attempt: int) -> bool:
        return False


#: Never re-send (see :class:`NoResend`).
NO_RESEND = NoResend()
#: What ``publish_many`` does unless told otherwise: up to two re-sends per record.
DEFAULT_RESEND = ResendUnacked()
