"""How calls are retried: the backoff policy and which failures are worth another attempt."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from .diagnostics import is_cursors_disabled
from .effects import RpcFailure

#: Calls whose repetition cannot change the outcome: retried on UNAVAILABLE without a second thought.
IDEMPOTENT = frozenset(
    {"FetchMetadata", "FetchPartitionMetadata", "FetchCursor", "SetCursor", "PauseStream", "SetStreamReadonly"}
)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently UNAVAILABLE calls are retried.

    :param max_retries: retries after the first attempt (0: no retry).
    :param backoff_base: the first wait, in seconds; doubled per retry.
    :param backoff_max: the longest wait, in seconds.
    """

    max_retries: int = 5
    backoff_base: float = 0.05
    backoff_max: float = 2.0

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """The wait before retry number ``attempt`` (1-based): exponential, with jitter in [50%, 100%]."""
        # The exponent stops growing long after the cap is reached (2.0 ** 1024 overflows).
        cap = min(self.backoff_max, self.backoff_base * 2.0 ** min(max(0, attempt - 1), 64))
        return cap * (0.5 + rng.random() / 2)


def is_end_of_stream(failure: RpcFailure) -> bool:
    """RESOURCE_EXHAUSTED on Subscribe: the stop position or the end of a read-only partition."""
    return bool(failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED)


def is_transient(failure: RpcFailure) -> bool:
    """A lost connection or a broker going away: worth retrying on another broker.

    A broker stopped mid-call shows up as UNAVAILABLE, CANCELLED, INTERNAL ("Internal error from
    Core", RST_STREAM) or UNKNOWN ("Stream removed"), depending on the moment and the transport.
    """
    C = grpc.StatusCode
    if failure.code == C.INTERNAL and is_cursors_disabled(failure.details):
        return False  # a setting of the cluster, not a broker going away
    if failure.code in (C.UNAVAILABLE, C.CANCELLED, C.INTERNAL):
        return True
    low = failure.details.lower()
    return bool(failure.code == C.UNKNOWN and ("rst_stream" in low or "stream removed" in low or "eof" in low))
