"""``LiftbridgeIntervalTrigger``: fires once, when every partition is complete for an interval
(an interval read waiting in the triggerer; see ``docs/consume.md``, "Read by interval").

Completeness is the interval planner's rule, shared
(:func:`~airflow_provider_liftbridge.client.reading.partition_complete`): a committed message at or
after the end, or the end plus the allowed lateness passed with everything written committed.

How a partition is watched, cheaply on a live stream: nothing happens before the interval's end
(the trigger sleeps). At the end it subscribes from the first committed message stamped at or
after the end, or from the offset after the high watermark when there is none yet (found by
:func:`~airflow_provider_liftbridge.client.reading.seek.first_offset_at_async`: Liftbridge's time
lookup, checked against the newest committed timestamp and searched by offset where the lookup
lands past such messages, as it does after a segment rolled by age). Subscribers see committed
messages only, so the first delivered message stamped at or after the end completes the
partition. Messages stamped before the end (the triggerer's clock ahead of the leader's) are
skipped. At end + lateness, and every
:data:`LOOK_SECONDS` after, the partition's metadata is read: newest offset <= high watermark
completes it. A paused partition is not resumed (nothing is written to it; a publish resumes it):
its metadata is read every :data:`~.base.PAUSED_POLL_SECONDS` until it runs again or the lateness
has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow_provider_liftbridge.client import AsyncLiftbridgeClient, Message, PartitionPausedError
from airflow_provider_liftbridge.client.reading import partition_complete
from airflow_provider_liftbridge.client.reading.seek import first_offset_at_async
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import check_partition, check_stream

from .base import PAUSED_POLL_SECONDS, LiftbridgeBaseTrigger, closing_subscription, paused_high_watermark

__all__ = ["LOOK_SECONDS", "LiftbridgeIntervalTrigger"]

#: Seconds between two reads of a partition's metadata once the lateness has passed and something
#: written is still not committed (a replica is behind): a slow look, the subscription stays open.
LOOK_SECONDS = 5.0


def _check_ns(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise LiftbridgeArgumentError(f"{name} must be nanoseconds (an int, 0 or more), got {value!r}")
    return value


async def _sleep_until(moment_ns: int) -> None:
    """Sleep until the wall clock reads ``moment_ns`` (asyncio's clock is monotonic: look again)."""
    while (left := moment_ns - time.time_ns()) > 0:
        await asyncio.sleep(left / 1e9)


class LiftbridgeIntervalTrigger(LiftbridgeBaseTrigger):
    """Wait until every one of ``partitions`` of ``stream`` is complete for the interval ending at
    ``end_ns`` (nanoseconds since the epoch) with ``lateness_ns`` of allowed lateness, then fire
    once. One subscription per partition, opened at the end; the clock is the triggerer's.

    Success event: ``{"status": "success", "stream", "partitions", "end_ns", "complete",
    "checked_at_ns"}``: ``complete`` says per partition (text keys) why it is complete, and
    ``checked_at_ns`` is the triggerer's clock when it fired (the resumed task does not judge the
    lateness by a clock behind it).

    :param stream: the stream.
    :param partitions: the partitions to wait for (one or more).
    :param end_ns: the interval's end.
    :param lateness_ns: the allowed lateness.
    :param liftbridge_conn_id: the connection to use.
    :raises LiftbridgeArgumentError: an argument is invalid (raised by the constructor).
    """

    def __init__(
        self,
        *,
        stream: str,
        partitions: list[int],
        end_ns: int,
        lateness_ns: int,
        liftbridge_conn_id: str = DEFAULT_CONN_ID,
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        self.stream = check_stream(stream)
        if not isinstance(partitions, (list, tuple)) or not partitions:
            raise LiftbridgeArgumentError(f"partitions must be a non-empty list of partitions, got {partitions!r}")
        self.partitions = sorted({check_partition(p) for p in partitions})
        self.end_ns = _check_ns(end_ns, "end_ns")
        self.lateness_ns = _check_ns(lateness_ns, "lateness_ns")

    def serialize_args(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "partitions": list(self.partitions),
            "end_ns": self.end_ns,
            "lateness_ns": self.lateness_ns,
            "liftbridge_conn_id": self.liftbridge_conn_id,
        }

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        client = await hook.get_async_client()
        self.log.info(
            "waiting until stream %r partitions %s are complete for the interval ending %s (allowed lateness %g s)",
            self.stream,
            self.partitions,
            dt.datetime.fromtimestamp(self.end_ns / 1e9, dt.UTC).isoformat(),
            self.lateness_ns / 1e9,
        )
        await _sleep_until(self.end_ns)
        async with asyncio.TaskGroup() as group:  # a failed partition cancels the others
            waits = {p: group.create_task(self._partition(client, p)) for p in self.partitions}
        return {
            "stream": self.stream,
            "partitions": list(self.partitions),
            "end_ns": self.end_ns,
            "complete": {str(p): task.result() for p, task in waits.items()},
            "checked_at_ns": time.time_ns(),
        }

    def _complete(self, committed_timestamp: int | None, high_watermark: int, newest_offset: int | None) -> str | None:
        return partition_complete(
            committed_timestamp=committed_timestamp,
            high_watermark=high_watermark,
            newest_offset=newest_offset,
            end_ns=self.end_ns,
            lateness_ns=self.lateness_ns,
            now_ns=time.time_ns(),
        )

    async def _completing_message(self, messages: AsyncIterator[Message]) -> str | None:
        """Why the first delivered message that completes the partition does (subscribers see
        committed messages only; what is written after it is unknown here); ``None`` when the
        subscription ends first (a read-only partition)."""
        async for message in messages:
            why = self._complete(message.timestamp, message.offset, None)
            if why is not None:
                return why
        return None

    async def _partition(self, client: AsyncLiftbridgeClient, partition: int) -> str:
        """Why ``partition`` is complete, once it is."""
        end = dt.datetime.fromtimestamp(0, dt.UTC) + dt.timedelta(microseconds=self.end_ns // 1000)
        while True:
            start = await self._start(client, partition, end)
            subscription = client.subscribe(self.stream, partition=partition, start_at=start)
            async with closing_subscription(subscription) as messages:
                reader = asyncio.ensure_future(self._completing_message(messages))
                try:
                    why = await self._watch(client, partition, reader)
                finally:
                    reader.cancel()  # before the subscription closes: its generator must not be running
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await reader
            if why is not None:
                return why

    async def _start(self, client: AsyncLiftbridgeClient, partition: int, end: dt.datetime) -> int | dt.datetime:
        """Where ``partition``'s subscription starts: the first committed offset stamped at or after
        ``end``, else the high watermark + 1 (later messages are judged as they come). The time
        itself (the server's lookup) while the partition is paused (the subscription then raises
        and the metadata decides) or restarting (its high watermark unknown: an offset would replay
        the whole partition)."""
        try:
            info = await client.fetch_partition_metadata(self.stream, partition)
            if info.high_watermark < 0 <= info.newest_offset:
                return end
            return await first_offset_at_async(client, self.stream, partition, end, info.high_watermark)
        except PartitionPausedError:
            return end

    async def _watch(
        self, client: AsyncLiftbridgeClient, partition: int, reader: asyncio.Future[str | None]
    ) -> str | None:
        """Wait on the subscription (``reader``) and, from end + lateness, on the metadata; return
        why the partition is complete, or ``None`` to subscribe again (it runs again after a pause)."""
        look_at, listening, paused = self.end_ns + self.lateness_ns, True, False
        while True:
            if listening:
                await asyncio.wait({reader}, timeout=max(0.0, (look_at - time.time_ns()) / 1e9))
            else:
                await _sleep_until(look_at)
            if listening and reader.done():
                listening = False
                try:
                    why = reader.result()
                except PartitionPausedError:  # nothing is committed while paused: the metadata decides
                    paused, look_at = True, time.time_ns()
                    continue
                if why is not None:
                    return why
                continue  # the subscription ended (read-only): the metadata decides at end + lateness
            try:
                info = await client.fetch_partition_metadata(self.stream, partition)
            except PartitionPausedError:
                high_watermark = await paused_high_watermark(client, self.stream, partition)
                newest = high_watermark  # nothing is written to a paused partition
            else:
                if paused:
                    return None  # running again (a publish resumed it): subscribe again from the end
                high_watermark, newest = info.high_watermark, info.newest_offset
            why = self._complete(None, high_watermark, newest)
            if why is not None:
                return why
            if newest > high_watermark and time.time_ns() >= self.end_ns + self.lateness_ns:
                self.log.warning(
                    "stream %r partition %d: the allowed lateness has passed, but offsets %d..%d are written and not "
                    "committed yet (a replica behind?): looking again in %g s",
                    self.stream,
                    partition,
                    high_watermark + 1,
                    newest,
                    LOOK_SECONDS,
                )
            look_at = time.time_ns() + int((PAUSED_POLL_SECONDS if paused else LOOK_SECONDS) * 1e9)
