"""``LiftbridgeOffsetTrigger``: fires when a partition's high watermark reaches an offset."""

from __future__ import annotations

from typing import Any

from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import check_offset, check_partition, check_stream

from .base import LiftbridgeBaseTrigger, wait_for_offset

__all__ = ["LiftbridgeOffsetTrigger"]


class LiftbridgeOffsetTrigger(LiftbridgeBaseTrigger):
    """Wait until ``stream``/``partition`` has committed ``target_offset`` (its high watermark is at
    or past it), by subscribing from that offset rather than polling.

    Success event: ``{"status": "success", "stream", "partition", "target_offset", "offset"}`` where
    ``offset`` is the committed offset seen (at or past the target).

    :param stream: the stream.
    :param partition: the partition.
    :param target_offset: the offset to wait for.
    :param liftbridge_conn_id: the connection to use.
    :raises LiftbridgeArgumentError: an argument is invalid (raised by the constructor).
    """

    def __init__(
        self, *, stream: str, target_offset: int, partition: int = 0, liftbridge_conn_id: str = DEFAULT_CONN_ID
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        self.stream = check_stream(stream)
        self.partition = check_partition(partition)
        self.target_offset = check_offset(target_offset, "target_offset")

    def serialize_args(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "target_offset": self.target_offset,
            "partition": self.partition,
            "liftbridge_conn_id": self.liftbridge_conn_id,
        }

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        client = await hook.get_async_client()
        offset = await wait_for_offset(client, self.stream, self.partition, self.target_offset)
        return {
            "stream": self.stream,
            "partition": self.partition,
            "target_offset": self.target_offset,
            "offset": offset,
        }
