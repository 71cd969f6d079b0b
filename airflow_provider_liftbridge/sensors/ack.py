"""``LiftbridgeAckSensor``: wait until messages published earlier are acknowledged."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout

from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.ack import LiftbridgeAckTrigger, collect_inbox_acks

from .base import LiftbridgeBaseSensor
from .offset import summary_offsets

__all__ = ["LiftbridgeAckSensor"]


class LiftbridgeAckSensor(LiftbridgeBaseSensor):
    """Wait until messages published earlier are acknowledged (committed), in one of two forms:

    - ``publish_summary``: the XCom value of a publish task (``publish.output``). Done when every
      partition's high watermark reaches the last offset the task wrote there. This never misses
      an acknowledgement that happened before the sensor started: it reads committed state.
    - ``ack_inbox`` + ``correlation_ids``: for publishers that write enveloped messages straight
      to NATS with an ack inbox. The sensor listens on the inbox and collects the acks. NATS has no
      history, so **acks sent before the sensor subscribed are not seen**: start the sensor before
      the publisher, or prefer the summary form. Without ``deferrable`` this form listens in the
      worker for up to ``timeout`` seconds (one subscription for the whole wait, no pokes).

    :param publish_summary: a publish summary. (templated)
    :param ack_inbox: the NATS ack inbox subject. (templated)
    :param correlation_ids: the correlation ids to wait for. (templated)
    :param liftbridge_conn_id: the connection to use (its NATS servers for the inbox form). (templated)
    :param deferrable: wait in the triggerer.
    :return: the trigger's payload: ``{"mode": "offsets", "stream", "partitions": {"<n>":
        {"target_offset", "offset"}}}`` or ``{"mode": "ack_inbox", "acks": [...]}``.
    :raises LiftbridgeArgumentError: neither or both forms given, or an invalid summary.
    """

    template_fields: Sequence[str] = ("publish_summary", "ack_inbox", "correlation_ids", "liftbridge_conn_id")

    def __init__(
        self,
        *,
        publish_summary: Mapping[str, Any] | None = None,
        ack_inbox: str | None = None,
        correlation_ids: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (publish_summary is None) == (ack_inbox is None and correlation_ids is None):
            raise LiftbridgeArgumentError("give either publish_summary or ack_inbox + correlation_ids")
        self.publish_summary = publish_summary
        self.ack_inbox = ack_inbox
        self.correlation_ids = correlation_ids
        self._trigger: LiftbridgeAckTrigger | None = None

    def prepare(self, context: Context) -> None:
        if self.publish_summary is not None:
            stream, offsets = summary_offsets(self.publish_summary)
            if not offsets:
                raise LiftbridgeArgumentError("the publish summary has no partitions: nothing was published")
            self._trigger = LiftbridgeAckTrigger(
                stream=stream, partition_offsets=offsets, liftbridge_conn_id=self.liftbridge_conn_id
            )
        else:
            self._trigger = LiftbridgeAckTrigger(
                ack_inbox=self.ack_inbox,
                correlation_ids=self.correlation_ids,
                liftbridge_conn_id=self.liftbridge_conn_id,
            )

    def make_trigger(self, context: Context) -> LiftbridgeAckTrigger:
        assert self._trigger is not None
        return self._trigger

    def execute(self, context: Context) -> Any:
        if self.deferrable or self.publish_summary is not None:
            return super().execute(context)
        # Ack-inbox form in the worker: one live NATS subscription for the whole wait (pokes would
        # drop acks between them), with the waiter the trigger uses and the sync hook's settings.
        assert self.ack_inbox is not None and self.correlation_ids is not None
        self.prepare(context)  # validates the arguments like the deferrable path
        waiter = collect_inbox_acks(self.hook.settings, self.ack_inbox, list(self.correlation_ids))
        try:
            payload = asyncio.run(asyncio.wait_for(waiter, timeout=self.timeout))
        except TimeoutError:
            raise AirflowSensorTimeout(
                f"{self.task_id}: acks for {self.correlation_ids!r} did not all arrive within {self.timeout}s"
            ) from None
        finally:
            self.hook.close()
        return self.complete(context, payload)

    def check_before_deferring(self, context: Context) -> PokeReturnValue | bool:
        """The summary form reads committed offsets once; the inbox form has nothing to look at
        (NATS keeps no history of acks), so it defers at once."""
        return self.poke(context) if self.publish_summary is not None else False

    def poke(self, context: Context) -> PokeReturnValue:
        trigger = self._trigger
        assert trigger is not None and trigger.partition_offsets is not None and trigger.stream is not None
        client = self.hook.client
        partitions: dict[str, dict[str, int]] = {}
        done = True
        for partition, target in sorted(trigger.partition_offsets.items(), key=lambda kv: int(kv[0])):
            high_watermark = client.fetch_partition_metadata(trigger.stream, int(partition)).high_watermark
            partitions[partition] = {"target_offset": target, "offset": high_watermark}
            done = done and high_watermark >= target
        self.log.info("Stream %r: %s", trigger.stream, partitions)
        result = {"mode": "offsets", "stream": trigger.stream, "partitions": partitions}
        return PokeReturnValue(is_done=done, xcom_value=result)
