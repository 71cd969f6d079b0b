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

The value is checked when it is made, so a mistake fails where it was written. The checks are
the client's (it raises :class:`~..errors.InvalidArgumentError`, a ``ValueError``, naming the
option, the value and what to give instead); the Airflow layer checks its operators' literal
keywords earlier, when the DAG is parsed, with the validators of
:mod:`airflow_provider_liftbridge.validation`, which the core may not import (they raise Airflow's
exceptions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from ..compression import Compression, check_compression
from ..errors import InvalidArgumentError
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


def _bad(name: str, value: object, expected: str, fix: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name}={value!r} is not valid: {expected}; {fix}")


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
        if self.path not in PUBLISH_PATHS:
            raise _bad("path", self.path, f"use one of {', '.join(map(repr, PUBLISH_PATHS))}", "e.g. path='auto'")
        if self.partition is not None and (
            isinstance(self.partition, bool) or not isinstance(self.partition, int) or self.partition < 0
        ):
            raise _bad("partition", self.partition, "a partition number, 0 or more", "or None to let it be chosen")
        if self.partitioner is not None and not callable(self.partitioner):
            raise _bad("partitioner", self.partitioner, "a partitioner (KeyPartitioner(), ...)", "or None")
        if self.ack_policy is not None:
            try:
                object.__setattr__(self, "ack_policy", AckPolicy(self.ack_policy))
            except ValueError:
                raise _bad("ack_policy", self.ack_policy, "an AckPolicy", "e.g. AckPolicy.ALL") from None
        if self.window is not None and (
            isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1
        ):
            raise _bad("window", self.window, "a whole number, 1 or more", "or None for the path's default")
        if self.timeout is not None and (
            isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0
        ):
            raise _bad("timeout", self.timeout, "a positive number of seconds", "or None for the client's timeout")
        if self.timeout is not None:
            object.__setattr__(self, "timeout", float(self.timeout))
        if self.resend is not None and not callable(getattr(self.resend, "should_resend", None)):
            raise _bad("resend", self.resend, "a resend policy (ResendUnacked(), NO_RESEND)", "or None")
        object.__setattr__(self, "compression", check_compression(self.compression))

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
