"""``LiftbridgeIntervalTrigger``: fires when a partition commits an offset, or at a time, whichever
comes first (an interval read waiting for its interval to be complete)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook

from .offset import LiftbridgeOffsetTrigger

__all__ = ["LiftbridgeIntervalTrigger"]


class LiftbridgeIntervalTrigger(LiftbridgeOffsetTrigger):
    """Wait until ``stream``/``partition`` has committed ``target_offset`` (as
    :class:`~.offset.LiftbridgeOffsetTrigger`), or until ``until_ns`` (nanoseconds since the epoch,
    the triggerer's clock), whichever comes first. The task looks at the interval again either way.

    Success event: ``{"status": "success", "stream", "partition", "target_offset", "offset",
    "reason"}``; ``reason`` is ``"offset"`` (``offset``: the committed offset seen) or ``"time"``
    (``offset``: ``None``).

    :param stream: the stream.
    :param partition: the partition.
    :param target_offset: the offset to wait for.
    :param until_ns: when to stop waiting for it.
    :param liftbridge_conn_id: the connection to use.
    :raises LiftbridgeArgumentError: an argument is invalid (raised by the constructor).
    """

    def __init__(
        self,
        *,
        stream: str,
        target_offset: int,
        until_ns: int,
        partition: int = 0,
        liftbridge_conn_id: str = DEFAULT_CONN_ID,
    ) -> None:
        super().__init__(
            stream=stream, target_offset=target_offset, partition=partition, liftbridge_conn_id=liftbridge_conn_id
        )
        if isinstance(until_ns, bool) or not isinstance(until_ns, int):
            raise LiftbridgeArgumentError(f"until_ns must be nanoseconds since the epoch (an int), got {until_ns!r}")
        self.until_ns = until_ns

    def serialize_args(self) -> dict[str, Any]:
        return super().serialize_args() | {"until_ns": self.until_ns}

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        left = max(0.0, (self.until_ns - time.time_ns()) / 1e9)
        try:
            event = await asyncio.wait_for(super().wait(hook), timeout=left)
        except TimeoutError:
            return {
                "stream": self.stream,
                "partition": self.partition,
                "target_offset": self.target_offset,
                "offset": None,
                "reason": "time",
            }
        return event | {"reason": "offset"}
