"""``SendWindow``: the bounded window of one batch, as states and the steps between them.

A record of the batch waits (to be sent, or sent again), is in flight (handed to the connection,
no answer yet), is late (its time ran out with no re-send left; an answer may still come) or is
settled (an ack, or a typed error). The steps:

- **send**: :meth:`SendWindow.sendable` takes waiting records one by one, in input order, while
  the window has room and nothing has failed; :meth:`SendWindow.next_span` names the next run of
  them at once and :meth:`SendWindow.sent` marks the part of it that went (the NATS engine's
  bursts). A record handed over is in flight and written at least once;
- **settle**: :meth:`SendWindow.settle` records the ack or the error of a record in flight or
  late (an answer for any other record, a repeat after a re-send, is ignored);
  :meth:`SendWindow.refuse` settles a record that cannot be sent at all;
- **expire**: :meth:`SendWindow.expire` gives the oldest record in flight its time-out error (the
  gRPC engine: no answer within the wait); :meth:`SendWindow.overdue` takes the records whose
  deadline passed (the NATS engine: a deadline per burst) and re-sends or gives up on each, as
  the re-send policy says;
- **re-send**: :meth:`SendWindow.requeue` puts every record in flight back in the queue after a
  lost connection, counting the send each would be, unless the re-send policy refuses it (it then
  settles with an error); :meth:`SendWindow.retry` puts refused records back (a "no such stream"
  that proved passing);
- **account**: at the end ``acks``, ``errors``, ``timed_out`` and ``written_once`` say where every
  record stands, for :func:`~.contract.name_unacknowledged` and the publish contract.

No I/O: the gRPC engine (:mod:`.grpc_engine`) drives it with the effects it yields, the NATS engine
(:mod:`.nats_engine`) with bursts on its connection. The states are one byte per record, changed
a burst at a time by slice assignment: the NATS engine moves tens of thousands of records a second
through them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..errors import LiftbridgeError
from ..types import Ack
from .resend import ResendPolicy

__all__ = ["SendWindow"]

# A record's state, one byte per record.
_WAITING, _FLYING, _LATE, _SETTLED = 0, 1, 2, 3
_FLYING_BYTE, _SETTLED_BYTE, _ONCE = bytes([_FLYING]), bytes([_SETTLED]), b"\x01"


class SendWindow:
    """The states of the ``n`` records of one batch, at most ``size`` in flight.

    :param answers: ``False`` when no answer comes by design (ack policy ``NONE``): a record is
        settled (without an ack) once it is handed over.
    :ivar acks: each record's ack, ``None`` until it has one.
    :ivar errors: the typed error of each record that failed, by index.
    :ivar timed_out: the late records, in the order their time ran out: no answer in time and no
        re-send left (:meth:`overdue`); an answer that still comes settles them.
    :ivar written_once: per record, 1 once it was handed to a connection (it may be stored).
    :ivar in_flight: how many records are in flight.
    """

    def __init__(self, n: int, size: int, *, answers: bool = True) -> None:
        self.size = size
        self.acks: list[Ack | None] = [None] * n
        self.errors: dict[int, LiftbridgeError] = {}
        self.timed_out: list[int] = []
        self.written_once = bytearray(n)
        self.in_flight = 0
        self._n = n
        self._answers = answers
        self._state = bytearray(n)
        self._next = 0  # records from here on were never taken
        self._again: deque[int] = deque()  # records taken before that wait again, in input order
        self._sends: dict[int, int] = {}  # how often each re-sent record was sent
        self._deadlines: deque[tuple[float, Sequence[int]]] = deque()  # (deadline, records), by deadline

    @property
    def more_to_send(self) -> bool:
        """Records wait, and nothing failed or timed out."""
        return bool((self._again or self._next < self._n) and not (self.errors or self.timed_out))

    @property
    def unfinished(self) -> bool:
        """Records wait or are in flight."""
        return bool(self._again or self._next < self._n or self.in_flight)

    @property
    def running(self) -> bool:
        """There is something to send (and nothing failed) or to wait for."""
        return bool(self.in_flight or self.more_to_send)

    @property
    def next_deadline(self) -> float:
        """The earliest deadline given to :meth:`sent` that has not been dealt with by
        :meth:`overdue` (infinity when there is none)."""
        return self._deadlines[0][0] if self._deadlines else float("inf")

    def is_in_flight(self, i: int) -> bool:
        """Whether ``i`` is a record of the batch in flight (an answer for it is awaited)."""
        return 0 <= i < self._n and self._state[i] == _FLYING

    # --- send ----------------------------------------------------------------------------------

    def sendable(self) -> Iterator[int]:
        """The next records to send, in input order, while the window has room and nothing failed;
        each is in flight (and written once) when it is yielded."""
        while self.in_flight < self.size and self.more_to_send:
            if self._again:
                i = self._again.popleft()
            else:
                i = self._next
                self._next += 1
            self._fly(range(i, i + 1), None)
            yield i

    def next_span(self) -> range:
        """The next consecutive waiting records, in input order, as many as the window has room
        for (none while something failed or timed out). Nothing changes until :meth:`sent`."""
        room = self.size - self.in_flight
        if room <= 0 or not self.more_to_send:
            return range(0)
        if not self._again:
            return range(self._next, min(self._n, self._next + room))
        start = end = self._again[0]
        for i in self._again:
            if i != end or end - start == room:
                break
            end += 1
        return range(start, end)

    def sent(self, span: range, deadline: float | None = None) -> None:
        """The records of ``span`` (the start of :meth:`next_span`) were handed to the connection:
        in flight (written once) until their answer, or until ``deadline`` (:meth:`overdue`)."""
        if not span:
            return
        if span.start == self._next:
            self._next = span.stop
        else:
            for _ in span:
                self._again.popleft()
        self._fly(span, deadline)

    def _fly(self, span: range, deadline: float | None) -> None:
        k = len(span)
        self.written_once[span.start : span.stop] = _ONCE * k
        if not self._answers:
            self._state[span.start : span.stop] = _SETTLED_BYTE * k
            return
        self._state[span.start : span.stop] = _FLYING_BYTE * k
        self.in_flight += k
        if deadline is not None:
            self._deadlines.append((deadline, span))

    # --- settle --------------------------------------------------------------------------------

    def settle(self, i: int, ack: Ack | None = None, error: LiftbridgeError | None = None) -> bool:
        """Record ``i`` is answered: its ``ack`` or its ``error``. ``False`` (and nothing changes)
        when ``i`` is neither in flight nor late: not a record of the batch, settled already, or a
        repeat after a re-send."""
        if not 0 <= i < self._n:
            return False
        state = self._state[i]
        if state == _FLYING:
            self.in_flight -= 1
        elif state == _LATE:
            self.timed_out.remove(i)
        else:
            return False
        self._state[i] = _SETTLED
        if error is None:
            self.acks[i] = ack
        else:
            self.errors[i] = error
        return True

    def refuse(self, i: int, error: LiftbridgeError) -> None:
        """Record ``i``, not handed over, cannot be sent at all (e.g. too large): it settles with
        ``error``, and nothing more is sent."""
        self._state[i] = _SETTLED
        self.errors[i] = error

    # --- expire --------------------------------------------------------------------------------

    def expire(self, error: Callable[[int], LiftbridgeError]) -> int:
        """The oldest record in flight timed out: it gets ``error(i)``; returns ``i``."""
        first = self._state.find(_FLYING_BYTE)
        self.errors[first] = error(first)
        return first

    def overdue(self, now: float, resend: ResendPolicy, deadline: float) -> list[int]:
        """The records still in flight of the sends whose deadline is ``now`` or earlier: each is
        sent again, with ``deadline``, when ``resend`` allows that send of it (the records
        returned, for the caller to send now), else it is late (``timed_out``, out of flight)."""
        again: list[int] = []
        state = self._state
        while self._deadlines and self._deadlines[0][0] <= now:
            for i in self._deadlines.popleft()[1]:
                if state[i] != _FLYING:
                    continue
                attempt = self._sends.get(i, 1) + 1
                if resend.should_resend(i, attempt):
                    self._sends[i] = attempt
                    again.append(i)
                else:
                    state[i] = _LATE
                    self.timed_out.append(i)
                    self.in_flight -= 1
        if again:
            self._deadlines.append((deadline, again))
        return again

    # --- re-send -------------------------------------------------------------------------------

    def requeue(self, resend: ResendPolicy | None, refusal: Callable[[int], LiftbridgeError]) -> tuple[list[int], int]:
        """The connection was lost: every record in flight waits again, in input order with the
        others, as one more send of it, unless ``resend`` refuses that send (the record then
        settles with ``refusal(i)``). Returns ``(refused, requeued)``: the refused records, in
        input order, and how many records were put back (0 when any was refused: the caller
        stops)."""
        flying = self._find(_FLYING_BYTE)
        again = {i: self._sends.get(i, 1) + 1 for i in flying}
        refused = [i for i in flying if resend is not None and not resend.should_resend(i, again[i])]
        for i in refused:
            self.errors[i] = refusal(i)
        if refused:
            return refused, 0
        self._sends.update(again)
        self._wait_again(flying)
        self.in_flight = 0
        self._deadlines.clear()
        return [], len(flying)

    def retry(self, indices: Iterable[int]) -> None:
        """Records that failed wait again (their errors are dropped), in input order with the others."""
        back = list(indices)
        for i in back:
            del self.errors[i]
        self._wait_again(back)

    def _wait_again(self, records: Sequence[int]) -> None:
        for i in records:
            self._state[i] = _WAITING
        self._again = deque(sorted(set(records) | set(self._again)))

    def _find(self, state: bytes) -> list[int]:
        """The records in ``state``, in input order (searched at C speed)."""
        found, at = [], self._state.find(state)
        while at >= 0:
            found.append(at)
            at = self._state.find(state, at + 1)
        return found
