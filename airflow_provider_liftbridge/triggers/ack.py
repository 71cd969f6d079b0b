"""``LiftbridgeAckTrigger``: fires when published messages are acknowledged.

Two ways to know what to wait for:

- ``partition_offsets`` (from a publish task's summary): every partition's high watermark must
  reach its last published offset. Committed is committed: an ack that happened before the
  trigger started is never missed, because the high watermark says so.
- ``ack_inbox`` + ``correlation_ids`` (publishers that write enveloped messages to NATS
  themselves): the trigger subscribes to the ack inbox on NATS and collects the acks. NATS keeps
  no history, so an ack sent before the subscription started is NOT seen: start waiting before
  publishing (or use the summary form). This is a limit of NATS, written down in docs/airflow.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_liftbridge.client import Ack, AckError, ConnectionSettings
from airflow_provider_liftbridge.client.publishing.nats_publisher import NatsPublisher
from airflow_provider_liftbridge.connection_fields import DEFAULT_CONN_ID
from airflow_provider_liftbridge.exceptions import LiftbridgeAirflowError, LiftbridgeArgumentError
from airflow_provider_liftbridge.hooks.async_hook import LiftbridgeAsyncHook
from airflow_provider_liftbridge.validation import check_partition

from .base import LiftbridgeBaseTrigger, closing_subscription, wait_for_offset

__all__ = ["LiftbridgeAckTrigger", "ack_to_json", "collect_inbox_acks"]

log = logging.getLogger(__name__)


def ack_to_json(ack: Ack) -> dict[str, Any]:
    """An ack as a small JSON-safe dict."""
    return {
        "correlation_id": ack.correlation_id,
        "stream": ack.stream,
        "partition": ack.partition,
        "offset": ack.offset,
        "ack_error": AckError(ack.ack_error).name,
    }


class LiftbridgeAckTrigger(LiftbridgeBaseTrigger):
    """Wait until published messages are acknowledged (see the module docstring for the two forms).

    Success events:
    ``{"status": "success", "mode": "offsets", "stream", "partitions": {"<n>": {"target_offset", "offset"}}}``
    or ``{"status": "success", "mode": "ack_inbox", "acks": [{"correlation_id", "stream", "partition",
    "offset", "ack_error"}, ...]}`` (in arrival order).
    An ack with an error (``INCORRECT_OFFSET``, ...) ends the wait with an error event naming it.

    :param stream: the stream (offsets form).
    :param partition_offsets: ``{partition: last offset}`` to wait for (offsets form).
    :param ack_inbox: the NATS subject acks are sent to (ack-inbox form).
    :param correlation_ids: the correlation ids to collect (ack-inbox form).
    :param liftbridge_conn_id: the connection (its NATS servers are used for the ack-inbox form).
    :raises LiftbridgeArgumentError: neither or both forms, or an invalid value (constructor).
    """

    def __init__(
        self,
        *,
        stream: str | None = None,
        partition_offsets: Mapping[str, int] | Mapping[int, int] | None = None,
        ack_inbox: str | None = None,
        correlation_ids: Sequence[str] | None = None,
        liftbridge_conn_id: str = DEFAULT_CONN_ID,
    ) -> None:
        super().__init__(liftbridge_conn_id=liftbridge_conn_id)
        offsets_form = partition_offsets is not None
        inbox_form = ack_inbox is not None or correlation_ids is not None
        if offsets_form == inbox_form:
            raise LiftbridgeArgumentError(
                "give either stream + partition_offsets (a publish summary) or ack_inbox + correlation_ids"
            )
        self.stream = stream
        self.partition_offsets: dict[str, int] | None = None
        self.ack_inbox = ack_inbox
        self.correlation_ids: list[str] | None = None
        if offsets_form:
            if not stream:
                raise LiftbridgeArgumentError("stream is required with partition_offsets")
            if not partition_offsets:
                raise LiftbridgeArgumentError("partition_offsets is empty: there is nothing to wait for")
            self.partition_offsets = {
                str(check_partition(p)): check_partition(o, f"offset of partition {p}")
                for p, o in partition_offsets.items()
            }
        else:
            if not ack_inbox or not isinstance(ack_inbox, str) or any(c.isspace() for c in ack_inbox):
                raise LiftbridgeArgumentError(f"ack_inbox must be a NATS subject, got {ack_inbox!r}")
            ids = [correlation_ids] if isinstance(correlation_ids, str) else list(correlation_ids or ())
            if not ids or not all(isinstance(i, str) and i for i in ids):
                raise LiftbridgeArgumentError(f"correlation_ids must be a non-empty list of strings, got {ids!r}")
            self.correlation_ids = ids

    def serialize_args(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "partition_offsets": self.partition_offsets,
            "ack_inbox": self.ack_inbox,
            "correlation_ids": self.correlation_ids,
            "liftbridge_conn_id": self.liftbridge_conn_id,
        }

    async def wait(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        if self.partition_offsets is not None:
            return await self._wait_offsets(hook)
        return await self._wait_inbox(hook)

    async def _wait_offsets(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        assert self.stream is not None and self.partition_offsets is not None
        client = await hook.get_async_client()
        items = sorted(self.partition_offsets.items(), key=lambda kv: int(kv[0]))
        reached = await asyncio.gather(*(wait_for_offset(client, self.stream, int(p), target) for p, target in items))
        return {
            "mode": "offsets",
            "stream": self.stream,
            "partitions": {
                p: {"target_offset": target, "offset": offset}
                for (p, target), offset in zip(items, reached, strict=True)
            },
        }

    async def _wait_inbox(self, hook: LiftbridgeAsyncHook) -> dict[str, Any]:
        assert self.ack_inbox is not None and self.correlation_ids is not None
        return await collect_inbox_acks(await hook.get_settings(), self.ack_inbox, self.correlation_ids)


async def collect_inbox_acks(
    settings: ConnectionSettings, ack_inbox: str, correlation_ids: Sequence[str]
) -> dict[str, Any]:
    """Listen on ``ack_inbox`` until an ack has arrived for every correlation id; return the ack-inbox
    success payload. Shared by the trigger and by the sensor waiting in a worker (which passes the
    settings its sync hook already read, so no async connection lookup happens there).

    :raises LiftbridgeAirflowError: the connection has no NATS servers, or an ack reports an error.
    :raises UnavailableError: NATS cannot be reached.
    """
    if not settings.nats_servers:
        raise LiftbridgeAirflowError(
            f"connection {settings.conn_id!r} has no 'NATS servers'; the ack-inbox form needs them: fill in that field"
        )
    pending = set(correlation_ids)
    acks: list[dict[str, Any]] = []
    async with await NatsPublisher.connect(
        settings.nats_servers, connect_timeout=settings.timeout, security=settings.nats_security
    ) as nats:
        log.info("Waiting on ack inbox %r for %d ack(s)", ack_inbox, len(pending))
        async with closing_subscription(nats.acks(ack_inbox)) as inbox:
            async for ack in inbox:
                if ack.correlation_id not in pending:
                    continue  # another publisher's ack on a shared inbox
                if ack.ack_error != AckError.OK:
                    raise LiftbridgeAirflowError(
                        f"message {ack.correlation_id!r} was refused by stream {ack.stream!r} "
                        f"partition {ack.partition}: {AckError(ack.ack_error).name}"
                    )
                pending.discard(ack.correlation_id)
                acks.append(ack_to_json(ack))
                if not pending:
                    break
    return {"mode": "ack_inbox", "acks": acks}
