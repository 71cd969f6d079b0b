"""``LiftbridgeOffsetTrigger``: fires when a partition's high watermark reaches an offset.
``LiftbridgeCountTrigger``: fires when several partitions together have committed enough messages
after given offsets (the ``min_messages`` wait of a reading task over several partitions)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import check_offset, check_partition, check_positive_int, check_stream

from .base import LiftbridgeBaseTrigger, wait_for_offset

__all__ = ["LiftbridgeCountTrigger", "LiftbridgeOffsetTrigger"]


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


class LiftbridgeCountTrigger(LiftbridgeBaseTrigger):
    """Wait until ``stream``'s partitions together have committed ``count`` messages from the
    offsets in ``starts`` on (per partition: high watermark + 1 - start, at least 0, summed).

    Each partition is watched as :class:`LiftbridgeOffsetTrigger` watches one (metadata first, then
    a subscription from its next offset; a paused partition is waited out, not resumed), one
    offset further each time its high watermark moves, so a busy partition is looked at once per
    burst, not once per message. A partition that is (or becomes) read-only stops adding to the
    count; the wait fails only when every partition has and the count is still short.

    Success event: ``{"status": "success", "stream", "starts", "count", "committed"}``:
    ``committed`` is, per partition (text keys), the highest committed offset seen (``start - 1``
    when none after the start was).

    :param stream: the stream.
    :param starts: per partition (``int`` or text keys, as JSON gives them back), the first offset
        that counts.
    :param count: how many messages to wait for (1 or more).
    :param liftbridge_conn_id: the connection to use.
    :raises LiftbridgeArgumentError: an argument is invalid (raised by the constructor).
    """

    def __init__(
        self, *, stream: str, starts: Mapping[Any, int], count: int, liftbridge_conn_id: str = DEFAULT_CONN_ID
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        self.stream = check_stream(stream)
        if not isinstance(starts, Mapping) or not starts:
            raise LiftbridgeArgumentError(
                f"starts must map each partition to its first counted offset, e.g. {{0: 41}}, got {starts!r}"
            )
        self.starts = {check_partition(p): check_offset(o, f"starts[{p!r}]") for p, o in sorted(starts.items())}
        self.count = check_positive_int(count, "count")

    def serialize_args(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "starts": {str(p): o for p, o in self.starts.items()},
            "count": self.count,
            "liftbridge_conn_id": self.liftbridge_conn_id,
        }

    def _counted(self, seen: Mapping[int, int]) -> int:
        return sum(max(0, seen[p] + 1 - start) for p, start in self.starts.items())

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        client = await hook.get_async_client()
        seen = {p: start - 1 for p, start in self.starts.items()}  # the highest committed offset known
        finished: dict[int, str] = {}  # partitions that can add nothing more, and why
        watchers = [asyncio.ensure_future(self._watch(client, p, seen, finished)) for p in self.starts]
        try:
            waiting = set(watchers)
            while waiting and self._counted(seen) < self.count:
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for watcher in done:
                    watcher.result()  # the first failure (no such stream, ...) ends the wait
        finally:
            for watcher in watchers:
                watcher.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        have = self._counted(seen)
        if have < self.count:
            raise LiftbridgeAirflowError(
                f"stream {self.stream!r}: only {have} of {self.count} message(s) can arrive: "
                + "; ".join(f"partition {p}: {why}" for p, why in sorted(finished.items()))
            )
        return {
            "stream": self.stream,
            "starts": {str(p): o for p, o in self.starts.items()},
            "count": self.count,
            "committed": {str(p): o for p, o in seen.items()},
        }

    async def _watch(
        self, client: AsyncLiftbridgeClient, partition: int, seen: dict[int, int], finished: dict[int, str]
    ) -> None:
        """Move ``seen[partition]`` up with the partition's high watermark until the count is reached
        (then return), or until the partition turns read-only (noted in ``finished``)."""
        while self._counted(seen) < self.count:
            try:
                committed = await wait_for_offset(client, self.stream, partition, seen[partition] + 1)
            except LiftbridgeAirflowError as exc:  # read-only: the other partitions may still make up the count
                finished[partition] = str(exc)
                self.log.info("stream %r partition %d adds nothing more: %s", self.stream, partition, exc)
                return
            seen[partition] = max(seen[partition], committed)
