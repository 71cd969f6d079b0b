"""``SendWindow``: the bounded window of one batch, as states and the steps between them.

A record of the batch waits (``pending``), is in flight (handed to the connection, no answer yet)
or is settled (an ack, or a typed error). The steps:

- **send**: :meth:`SendWindow.sendable` takes waiting records, in input order, while the window
  has room and nothing has failed, and marks each in flight and written at least once;
- **settle**: :meth:`SendWindow.settle` records the ack or the error of a record in flight (an
  answer for a record not in flight, a repeat after a re-send, is ignored);
- **expire**: :meth:`SendWindow.expire` gives the oldest record in flight its time-out error;
- **re-send**: :meth:`SendWindow.requeue` puts every record in flight back in the queue after a
  lost connection, counting the send each would be, unless the re-send policy refuses it (it then
  settles with an error); :meth:`SendWindow.retry` puts refused records back (a "no such stream"
  that proved passing);
- **account**: at the end ``acks``, ``errors`` and ``written_once`` say where every record stands,
  for :func:`~.contract.name_unacknowledged` and the publish contract.

No I/O: the gRPC engine (:mod:`.grpc_batch`) drives it with the effects it yields.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator

from ..errors import LiftbridgeError
from ..types import Ack
from .resend import ResendPolicy

__all__ = ["SendWindow"]


class SendWindow:
    """The states of the ``n`` records of one batch, at most ``size`` in flight.

    :ivar acks: each record's ack, ``None`` until it has one.
    :ivar errors: the typed error of each record that failed, by index.
    :ivar written_once: per record, 1 once it was handed to a connection (it may be stored).
    """

    def __init__(self, n: int, size: int) -> None:
        self.size = size
        self.acks: list[Ack | None] = [None] * n
        self.errors: dict[int, LiftbridgeError] = {}
        self.written_once = bytearray(n)
        self._pending: deque[int] = deque(range(n))
        self._in_flight: set[int] = set()
        self._sends: dict[int, int] = {}  # how often each re-sent record was sent

    @property
    def unfinished(self) -> bool:
        """Records wait or are in flight."""
        return bool(self._pending or self._in_flight)

    @property
    def running(self) -> bool:
        """There is something to send (and nothing failed) or to wait for."""
        return bool((self._pending and not self.errors) or self._in_flight)

    @property
    def in_flight(self) -> int:
        """How many records are in flight."""
        return len(self._in_flight)

    def is_in_flight(self, i: int) -> bool:
        """Whether record ``i`` is in flight (an answer for it is awaited)."""
        return i in self._in_flight

    def sendable(self) -> Iterator[int]:
        """The next records to send, in input order, while the window has room and nothing failed;
        each is in flight (and written once) when it is yielded."""
        while self._pending and not self.errors and len(self._in_flight) < self.size:
            i = self._pending.popleft()
            self._in_flight.add(i)
            self.written_once[i] = 1
            yield i

    def settle(self, i: int, ack: Ack | None = None, error: LiftbridgeError | None = None) -> bool:
        """Record in flight ``i`` is answered: its ``ack`` or its ``error``. ``False`` (and nothing
        changes) when ``i`` is not in flight: not ours, or a repeat after a re-send."""
        if i not in self._in_flight:
            return False
        self._in_flight.discard(i)
        if error is not None:
            self.errors[i] = error
        else:
            self.acks[i] = ack
        return True

    def expire(self, error: Callable[[int], LiftbridgeError]) -> int:
        """The oldest record in flight timed out: it gets ``error(i)``; returns ``i``."""
        first = min(self._in_flight)
        self.errors[first] = error(first)
        return first

    def requeue(self, resend: ResendPolicy | None, refusal: Callable[[int], LiftbridgeError]) -> tuple[list[int], int]:
        """The connection was lost: every record in flight waits again, in input order with the
        others, as one more send of it, unless ``resend`` refuses that send (the record then
        settles with ``refusal(i)``). Returns ``(refused, requeued)``: the refused records, in
        input order, and how many records were put back (0 when any was refused: the caller
        stops)."""
        again = {i: self._sends.get(i, 1) + 1 for i in self._in_flight}
        refused = sorted(i for i, n in again.items() if resend is not None and not resend.should_resend(i, n))
        for i in refused:
            self.errors[i] = refusal(i)
        if refused:
            return refused, 0
        requeued = len(self._in_flight)
        self._sends.update(again)
        self._pending = deque(sorted(self._in_flight | set(self._pending)))
        self._in_flight.clear()
        return [], requeued

    def retry(self, indices: Iterable[int]) -> None:
        """Records that failed wait again (their errors are dropped), in input order with the others."""
        back = set(indices)
        for i in back:
            del self.errors[i]
        self._pending = deque(sorted(back | set(self._pending)))
