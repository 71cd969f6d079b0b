"""Resilient Liftbridge client, sync and asyncio. Imports neither Airflow nor PySpark.

See ``docs/client.md`` for usage and guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow_provider_liftbridge.lazy_imports import lazy_attributes

from .errors import (
    AckedThenLostError,
    AckTimeoutError,
    ClientClosedError,
    CursorsDisabledError,
    EncryptionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftbridgeError,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    NotSentError,
    PartitionPausedError,
    PermissionDeniedError,
    PublishError,
    ReadonlyPartitionError,
    RequestTimeoutError,
    ServerError,
    StreamExistsError,
    UnaccountedRecordError,
    UnavailableError,
    UnsettledCursorError,
)
from .partitioners import KeyPartitioner, Partitioner, PartitionerFunc, RoundRobinPartitioner, partition_for_key
from .publishing.options import PublishOptions
from .publishing.resend import NO_RESEND, NoResend, ResendPolicy, ResendUnacked
from .publishing.summary import PublishSummary
from .settings import ConnectionSettings
from .stream_options import StreamOptions
from .types import (
    Ack,
    AckError,
    AckPolicy,
    BrokerInfo,
    Message,
    Metadata,
    PartitionInfo,
    Record,
    StartPosition,
    StopPosition,
    StreamInfo,
    TlsConfig,
)

if TYPE_CHECKING:
    from .async_client import AsyncLiftbridgeClient
    from .column_subscription import MessageColumns
    from .consumer import ConsumerGroupError, MaxPollIntervalExceededError
    from .group_consumer import AsyncGroupConsumer, GroupConsumer
    from .publishing.publisher import BatchPublisher
    from .sync_client import LiftbridgeClient

__all__ = [
    "NO_RESEND",
    "NoResend",
    "ResendPolicy",
    "ResendUnacked",
    "Ack",
    "AckError",
    "AsyncGroupConsumer",
    "AsyncLiftbridgeClient",
    "BatchPublisher",
    "PublishOptions",
    "StreamOptions",
    "ConsumerGroupError",
    "MaxPollIntervalExceededError",
    "GroupConsumer",
    "LiftbridgeClient",
    "AckPolicy",
    "AckTimeoutError",
    "AckedThenLostError",
    "BrokerInfo",
    "ClientClosedError",
    "ConnectionSettings",
    "CursorsDisabledError",
    "EncryptionError",
    "IncorrectOffsetError",
    "InvalidArgumentError",
    "KeyPartitioner",
    "LiftbridgeError",
    "Message",
    "MessageColumns",
    "MessageTooLargeError",
    "Metadata",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "NotLeaderError",
    "NotSentError",
    "PartitionInfo",
    "PartitionPausedError",
    "Partitioner",
    "PartitionerFunc",
    "PermissionDeniedError",
    "PublishError",
    "PublishSummary",
    "ReadonlyPartitionError",
    "Record",
    "RequestTimeoutError",
    "RoundRobinPartitioner",
    "ServerError",
    "StartPosition",
    "StopPosition",
    "StreamExistsError",
    "StreamInfo",
    "TlsConfig",
    "UnaccountedRecordError",
    "UnavailableError",
    "UnsettledCursorError",
    "partition_for_key",
]

# Where each of the heavier names lives, imported on first use: the asyncio client, consumer
# groups and the batch publishing engines (with nats-py) are not needed by a process that only
# reads over gRPC, such as Spark's read planner and readers (issue 57). The names above are values
# and errors, cheap to import.
_LAZY = {
    "AsyncLiftbridgeClient": f"{__name__}.async_client",
    "MessageColumns": f"{__name__}.column_subscription",
    "ConsumerGroupError": f"{__name__}.consumer",
    "MaxPollIntervalExceededError": f"{__name__}.consumer",
    "AsyncGroupConsumer": f"{__name__}.group_consumer",
    "GroupConsumer": f"{__name__}.group_consumer",
    "BatchPublisher": f"{__name__}.publishing.publisher",
    "LiftbridgeClient": f"{__name__}.sync_client",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY, __all__)
