"""Resilient Liftbridge client, sync and asyncio. Imports neither Airflow nor PySpark.

See ``docs/client.md`` for usage and guarantees.
"""

from __future__ import annotations

from .async_client import AsyncLiftbridgeClient
from .column_subscription import MessageColumns
from .consumer import ConsumerGroupError, MaxPollIntervalExceededError
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
from .group_consumer import AsyncGroupConsumer, GroupConsumer
from .partitioners import KeyPartitioner, Partitioner, PartitionerFunc, RoundRobinPartitioner, partition_for_key
from .publishing.options import PublishOptions
from .publishing.publisher import BatchPublisher
from .publishing.resend import NO_RESEND, NoResend, ResendPolicy, ResendUnacked
from .publishing.summary import PublishSummary
from .settings import ConnectionSettings
from .stream_options import StreamOptions
from .sync_client import LiftbridgeClient
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
