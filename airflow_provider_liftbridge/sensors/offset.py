"""``LiftbridgeOffsetSensor``: wait until a partition's high watermark reaches an offset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Context, PokeReturnValue

from airflow_provider_liftbridge.client import PartitionPausedError
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.lineage import Datasets, LiftbridgeLineageMixin
from airflow_provider_liftbridge.triggers.offset import LiftbridgeOffsetTrigger
from airflow_provider_liftbridge.validation import (
    bad_argument,
    check_offset,
    check_partition,
    check_stream,
    optional,
    waits_for_rendering,
)

from .base import LiftbridgeBaseSensor

__all__ = ["LiftbridgeOffsetSensor", "summary_offsets"]


def summary_offsets(summary: Any) -> tuple[str, dict[str, int]]:
    """Read ``(stream, {partition: last_offset})`` from a publish summary (the XCom value of the
    publishing operators).

    :raises LiftbridgeArgumentError: not a summary, or one without offsets (ack policy ``NONE``).
    """
    if not isinstance(summary, Mapping) or "stream" not in summary or "partitions" not in summary:
        raise LiftbridgeArgumentError(
            f"expected a publish summary with 'stream' and 'partitions' (the XCom of a publish task), got {summary!r}"
        )
    if summary.get("ack_policy") == "NONE":
        raise LiftbridgeArgumentError(
            "the publish used ack policy NONE, so its summary has no offsets to wait for; "
            "publish with 'leader' or 'all'"
        )
    offsets = {str(p): int(span["last_offset"]) for p, span in summary["partitions"].items()}
    return str(summary["stream"]), offsets


def check_target(value: Any, name: str = "target_offset") -> Any:
    """An offset (0 or more), or a publish summary (a mapping, checked when the sensor runs).

    :raises LiftbridgeArgumentError: anything else (``"latest-ish"``, ``-1``, ``None``...).
    """
    return value if isinstance(value, Mapping) else check_offset(value, name)


class LiftbridgeOffsetSensor(LiftbridgeLineageMixin, LiftbridgeBaseSensor):
    """Wait until ``stream``/``partition`` has committed ``target_offset`` (high watermark ≥ target).

    ``target_offset`` is an offset, or the summary a publish task returned (``publish.output``): the
    last offset that task wrote to ``partition`` is the target, and the stream is taken from the
    summary when ``stream`` is not given.

    Poking reads the partition's metadata; the deferrable path subscribes from the target offset in
    the triggerer (:class:`~airflow_provider_liftbridge.triggers.offset.LiftbridgeOffsetTrigger`).
    A paused partition is waited out without resuming it (nothing is committed to it until a
    publish resumes it); meanwhile the high watermark is read from the stream metadata.

    :param stream: the stream. (templated)
    :param target_offset: the offset, or a publish summary. (templated)
    :param partition: the partition. (templated)
    :param liftbridge_conn_id: the connection to use. (templated)
    :param deferrable: wait in the triggerer.
    :return: ``{"stream", "partition", "target_offset", "offset"}`` (``offset``: committed offset seen).
    :raises LiftbridgeArgumentError: no stream, a bad offset, or a summary without that partition.
    """

    template_fields: Sequence[str] = ("stream", "target_offset", "partition", "liftbridge_conn_id")
    argument_checks = {"stream": optional(check_stream), "target_offset": check_target, "partition": check_partition}

    def __init__(
        self,
        *,
        target_offset: int | str | Mapping[str, Any],
        stream: str | None = None,
        partition: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.target_offset = target_offset
        self.partition = partition
        self._target: tuple[str, int, int] | None = None

    def check_combination(self, *, rendered: bool) -> None:
        """Without a publish summary to take it from, ``stream`` is needed."""
        super().check_combination(rendered=rendered)
        if not self.stream and not isinstance(self.target_offset, Mapping):
            if rendered or not waits_for_rendering(self.target_offset):
                raise bad_argument(
                    "stream", self.stream, "a stream is required", "name it, or give a publish summary as target_offset"
                )

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the stream (named, or the one of the publish summary)."""
        stream = self._target[0] if self._target else self.stream
        if not stream and isinstance(self.target_offset, Mapping):
            stream = self.target_offset.get("stream")
        return ([self.lineage_stream(stream)] if stream else []), []

    def prepare(self, context: Context) -> None:
        partition = check_partition(self.partition)
        target: Any = self.target_offset
        stream = self.stream
        if isinstance(target, Mapping):
            summary_stream, offsets = summary_offsets(target)
            stream = stream or summary_stream
            if str(partition) not in offsets:
                raise LiftbridgeArgumentError(
                    f"the publish summary has no offsets for partition {partition} (it has {sorted(offsets)})"
                )
            target = offsets[str(partition)]
        if not stream:
            raise LiftbridgeArgumentError("stream is required (or give a publish summary as target_offset)")
        self._target = (stream, partition, check_partition(target, "target_offset"))

    def make_trigger(self, context: Context) -> LiftbridgeOffsetTrigger:
        assert self._target is not None
        stream, partition, target = self._target
        return LiftbridgeOffsetTrigger(
            stream=stream, partition=partition, target_offset=target, liftbridge_conn_id=self.liftbridge_conn_id
        )

    def poke(self, context: Context) -> PokeReturnValue:
        assert self._target is not None
        stream, partition, target = self._target
        client = self.hook.client
        try:
            high_watermark = client.fetch_partition_metadata(stream, partition).high_watermark
        except PartitionPausedError:
            info = client.fetch_metadata([stream]).streams.get(stream)
            part = info.partitions.get(partition) if info is not None else None
            high_watermark = part.high_watermark if part is not None else -1
            self.log.info(
                "Stream %r partition %d is paused: waiting without resuming it (a publish resumes it)",
                stream,
                partition,
            )
        self.log.info(
            "Stream %r partition %d: high watermark %d, waiting for %d", stream, partition, high_watermark, target
        )
        result = {"stream": stream, "partition": partition, "target_offset": target, "offset": high_watermark}
        return PokeReturnValue(is_done=high_watermark >= target, xcom_value=result)
