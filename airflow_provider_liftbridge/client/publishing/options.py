"""``PublishOptions``: how a batch is published, as one frozen, validated value.

Defined once, like go-liftbridge's ``StreamOption``s: the operators, the hook's publishers, the
Spark helpers, exactly-once publishing, the batch publisher and both engines (gRPC PublishAsync,
NATS-direct) take this value and pass it on; none of them spells the options out keyword by
keyword. Only the value itself, the operators' public keywords and the clients' ``publish_many``
convenience methods name them one by one.

``None`` means "the default of whoever publishes": the client's ack policy and timeout (the
connection's, for the Airflow layer), the path's window (:data:`GRPC_WINDOW`, :data:`NATS_WINDOW`),
the client's re-send policy (:data:`~.resend.DEFAULT_RESEND`). :meth:`PublishOptions.resolved`
fills them in once, where the client is known.

The value is checked when it is made, so a mistake fails where it was written, with the checks of
:mod:`..checks` (they raise :class:`~..errors.InvalidArgumentError`, a ``ValueError``, naming the
option, the value and what to give instead; a number may come as a digit string, as rendered
templates do). The Airflow layer runs the same checks on its operators' literal keywords when the
DAG is parsed (:mod:`airflow_provider_liftbridge.validation` turns their error into Airflow's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..checks import (
    check_ack_policy,
    check_choice,
    check_partition,
    check_positive_int,
    check_timeout,
    invalid,
    optional,
)
from ..compression import Compression, check_compression
from ..partitioners import PartitionerFunc
from ..types import AckPolicy
from .resend import ResendPolicy

__all__ = ["DEFAULT_OPTIONS", "GRPC_WINDOW", "NATS_WINDOW", "PUBLISH_PATHS", "PublishOptions", "PublishPath"]

#: Default windows (records unacknowledged at a time). Over NATS the client, nats-server and the
#: broker each work on batches, and 256 or 1024 records in flight leave them waiting on each
#: other; 4096 keeps them busy (docs/bulk-publishing.md has the figures). Over gRPC the window
#: is bounded by the server's per-message cost, and 256 is plenty.
GRPC_WINDOW = 256
NATS_WINDOW = 4096

PublishPath = Literal["auto", "nats", "grpc"]
#: Values of ``PublishOptions.path``.
PUBLISH_PATHS: tuple[str, ...] = ("auto", "nats", "grpc")


_check_path = check_choice(PUBLISH_PATHS)
_check_partition = optional(check_partition)
_check_ack_policy = optional(check_ack_policy)
_check_window = optional(check_positive_int)


@dataclass(frozen=True, slots=True)
class PublishOptions:
    """How records are published (every field has a default; ``None`` = the publisher's default).

    :param path: ``"auto"`` (NATS-direct when the client knows NATS servers, else gRPC; gRPC
        also for paused or read-only partitions and when NATS cannot be reached), ``"nats"`` or
        ``"grpc"``.
    :param partition: partition of records that name none (a record's own wins).
    :param partitioner: chooses the partition of records naming none, when ``partition`` is unset.
    :param ack_policy: ``AckPolicy.LEADER``, ``ALL`` or ``NONE``; ``None``: the client's default.
    :param window: records unacknowledged at a time, 1 or more; ``None``: 256 over gRPC, 4096
        over NATS.
    :param timeout: seconds to wait for each ack, positive; ``None``: the client's timeout.
    :param resend: whether a record without an ack is sent again (:mod:`.resend`); ``None``: the
        client's default (up to two re-sends); ``NO_RESEND`` for exactly-once publishing.
    :param compression: ``"gzip"`` or ``"zstd"`` (the ``zstd`` extra) compresses every value;
        ``None`` sends values as they are.
    :raises InvalidArgumentError: a value of the wrong type or out of range (the message names
        the option and the fix).
    """

    path: PublishPath = "auto"
    partition: int | None = None
    partitioner: PartitionerFunc | None = None
    ack_policy: AckPolicy | None = None
    window: int | None = None
    timeout: float | None = None
    resend: ResendPolicy | None = None
    compression: Compression = None

    def __post_init__(self) -> None:
        # The checks the operators run on their keywords (client/checks.py), defined once.
        set_ = object.__setattr__
        set_(self, "path", _check_path(self.path, "path"))
        set_(self, "partition", _check_partition(self.partition, "partition"))
        if self.partitioner is not None and not callable(self.partitioner):
            raise invalid("partitioner", self.partitioner, "a partitioner (KeyPartitioner(), ...)", "or None")
        set_(self, "ack_policy", _check_ack_policy(self.ack_policy, "ack_policy"))
        set_(self, "window", _check_window(self.window, "window"))
        set_(self, "timeout", check_timeout(self.timeout, "timeout"))
        if self.resend is not None and not callable(getattr(self.resend, "should_resend", None)):
            raise invalid("resend", self.resend, "a resend policy (ResendUnacked(), NO_RESEND)", "or None")
        set_(self, "compression", check_compression(self.compression))

    def replace(self, **changes: object) -> PublishOptions:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def resolved(self, ack_policy: AckPolicy, timeout: float) -> PublishOptions:
        """These options with the publisher's defaults filled in where they are unset: its
        ``ack_policy`` and ``timeout`` (the window and the re-send policy stay per path)."""
        return dataclasses.replace(
            self,
            ack_policy=ack_policy if self.ack_policy is None else self.ack_policy,
            timeout=timeout if self.timeout is None else self.timeout,
        )

    @property
    def policy(self) -> AckPolicy:
        """The ack policy, ``LEADER`` when unset (resolved options always have one)."""
        return AckPolicy.LEADER if self.ack_policy is None else self.ack_policy

    @property
    def wait(self) -> float:
        """Seconds to wait for each ack: ``timeout``, 10 s when unset (resolved options always
        have one)."""
        return 10.0 if self.timeout is None else self.timeout

    def window_for(self, path: str) -> int:
        """The window on ``path`` (``"nats"`` or ``"grpc"``): ``window``, else the path's default."""
        if self.window is not None:
            return self.window
        return NATS_WINDOW if path == "nats" else GRPC_WINDOW


#: ``PublishOptions()``: every option at its default.
DEFAULT_OPTIONS = PublishOptions()
