"""``BatchPublisher``: the client's batch publisher for one stream (blocking client).

Everything that publishes batches goes through it — ``LiftbridgeClient.publish_many`` (one
batch), the publishing operators, Spark executors and exactly-once publishing: it chooses the
path once (:func:`.batch.open_route`, with its first batch), assigns partitions, uses the
client's NATS connection and event loop, windows, re-sends or not (``resend``), and reports the
acks. Callers pass options; none of them holds a sender of its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from ..effects import Op
from ..errors import InvalidArgumentError, PublishError
from ..routing import ClientCore
from ..types import Ack, Record, StreamInfo
from ..write_stats import WriteStats
from .batch import Route, discard_nats, open_route, send_batch
from .options import PublishOptions
from .summary import PublishSummary

__all__ = ["DEFAULT_BATCH", "BatchPublisher"]

#: Records per batch of :meth:`BatchPublisher.send_all` when the caller does not say: held in
#: memory at once, and the pipeline drains at each batch's end.
DEFAULT_BATCH = 16_384


class BatchPublisher:
    """Publishes batches of records to one stream with fixed options; made by
    ``LiftbridgeClient.batch_publisher`` (whose docstring describes the options). The NATS
    connection and its event loop are the client's: closing the publisher releases nothing, and
    closing the client ends it. Not thread-safe: one publisher per thread.

    :param run: executes an operation on the client's transport.
    :param core: the client's shared state.
    :param stream: the stream published to.
    :param options: the options, with the client's defaults filled in (see :func:`.batch.resolve_options`).
    :param info: the stream's metadata if the caller has just read it (saves reading it again).
    :param write_stats: measure every acknowledged record's latency (publish -> leader reception,
        publish -> commit) and the throughput in :attr:`stats`.
    """

    def __init__(
        self,
        run: Callable[[Op[Any]], Any],
        core: ClientCore,
        stream: str,
        options: PublishOptions,
        info: StreamInfo | None = None,
        *,
        write_stats: bool = False,
    ) -> None:
        self._run = run
        self._core = core
        #: The stream published to.
        self.stream = stream
        #: The options every batch is sent with (the client's defaults filled in).
        self.options = options
        # Where batches go: opened by the first batch (or by asking for ``path``).
        self._route = Route(info=info)
        #: Latency and throughput of what this publisher sent (``None`` unless ``write_stats``).
        self.stats: WriteStats | None = WriteStats() if write_stats else None

    def _open(self) -> Route:
        if not self._route.opened:
            self._run(open_route(self._core, self.stream, self.options, self._route))
        return self._route

    @property
    def path(self) -> str:
        """``"nats"`` or ``"grpc"``: the path the next batch takes (opens the publisher).

        :raises NoSuchStreamError: the NATS path was chosen and the stream does not exist.
        """
        return self._open().path

    @property
    def fallback_reason(self) -> str:
        """Why gRPC is used although the client knows NATS servers ("" when it is not)."""
        return self._open().why

    def send(self, records: Iterable[Record | bytes]) -> list[Ack]:
        """Publish one batch (held in memory) and return its acks in input order (``[]`` with
        ack policy ``NONE``).

        :raises PublishError: / :raises InvalidArgumentError: / :raises NoSuchStreamError: as
            ``LiftbridgeClient.publish_many``.
        """
        acks: list[Ack] = self._run(send_batch(self._core, self.stream, self.options, self._route, records, self.stats))
        return acks

    def send_all(
        self,
        records: Iterable[Record | bytes],
        *,
        batch: int = DEFAULT_BATCH,
        summary: PublishSummary | None = None,
        on_progress: Callable[[PublishSummary], None] | None = None,
    ) -> PublishSummary:
        """Publish an iterable of any length ``batch`` records at a time (read lazily: at most
        ``batch`` records are held, plus nothing of earlier batches but the summary); every ack
        of a batch is in before the next batch is read.

        :param batch: records per batch.
        :param summary: the running summary to add to (a new one by default).
        :param on_progress: called with the running summary after each batch (progress logging).
        :returns: the summary.
        :raises PublishError: a record of some batch failed; the summary already counts what was
            acknowledged, including the failed batch's acknowledged records; ``.start`` is the
            position of the failed batch in the input.
        :raises InvalidArgumentError: ``batch`` below 1, or a bad record.
        """
        if batch < 1:
            raise InvalidArgumentError(f"batch must be at least 1, got {batch}")
        summary = summary if summary is not None else PublishSummary(self.stream, self.options.policy)
        iterator = iter(records)
        start = 0
        while chunk := list(itertools.islice(iterator, batch)):
            try:
                acks = self.send(chunk)
            except PublishError as exc:
                received = [a for a in exc.acks if a is not None]
                summary.add_acks(received, len(received))
                where = f"record #{start + exc.index}" if exc.index is not None else f"batch from record #{start}"
                raise PublishError(
                    f"{where} of the input: {exc}", acks=exc.acks, index=exc.index, errors=exc.errors, start=start
                ) from exc.__cause__
            summary.add_acks(acks, len(chunk))
            start += len(chunk)
            if on_progress is not None:
                on_progress(summary)
        return summary

    def reset(self, flush_within: float = 0.0) -> bool:
        """After a failed batch: drop the client's NATS connection so that nothing it still
        buffers reaches the server later (exactly-once publishing re-reads the partitions next):
        a flush of up to ``flush_within`` seconds, else a reset (TCP RST). The gRPC path holds
        nothing between batches: a call given up on is cancelled, and its frames already
        written are ahead of every later request on the same connection.

        :returns: whether everything sent is known to have reached the server (``False``: over
            NATS, segments already on the way when the connection was reset may still arrive).
        """
        if self._route.opened and self._route.path == "nats":
            delivered: bool = self._run(discard_nats(flush_within))
            return delivered
        return True

    def close(self) -> None:
        """Nothing to release (the connection is the client's); for use as a context manager."""

    def __enter__(self) -> BatchPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
