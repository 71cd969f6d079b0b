"""``SendWindow``: the bounded window of a batch — send, settle, expire, re-send, account."""

from __future__ import annotations

from airflow_provider_liftbridge.client import AckTimeoutError, NoSuchStreamError, ReadonlyPartitionError
from airflow_provider_liftbridge.client.publishing.resend import NO_RESEND, ResendUnacked
from airflow_provider_liftbridge.client.publishing.window import SendWindow
from airflow_provider_liftbridge.client.types import Ack, AckPolicy


def _ack(i: int) -> Ack:
    return Ack("s", 0, "s", "s", i, "", str(i), AckPolicy.LEADER, 0, 0)


def test_send_takes_records_in_order_while_the_window_has_room() -> None:
    w = SendWindow(5, 2)
    assert list(w.sendable()) == [0, 1] and w.in_flight == 2
    assert list(w.sendable()) == []  # full
    assert w.settle(0, _ack(0)) and list(w.sendable()) == [2]
    assert bytes(w.written_once) == b"\x01\x01\x01\x00\x00"


def test_an_answer_for_a_record_not_in_flight_changes_nothing() -> None:
    w = SendWindow(2, 2)
    list(w.sendable())
    assert w.settle(0, _ack(0))
    assert not w.settle(0, _ack(0)) and not w.settle(-1, _ack(9))
    assert w.acks[0] is not None and w.acks[1] is None


def test_a_failure_stops_new_sends_but_the_flight_is_still_waited_for() -> None:
    w = SendWindow(4, 2)
    list(w.sendable())
    w.settle(0, error=ReadonlyPartitionError("read-only"))
    assert list(w.sendable()) == [] and w.running  # record 1 is still in flight
    w.settle(1, _ack(1))
    assert not w.running and w.unfinished  # 2 and 3 never sent
    assert set(w.errors) == {0} and bytes(w.written_once) == b"\x01\x01\x00\x00"


def test_expire_names_the_oldest_record_in_flight() -> None:
    w = SendWindow(3, 3)
    list(w.sendable())
    w.settle(0, _ack(0))
    assert w.expire(lambda i: AckTimeoutError(f"late {i}")) == 1
    assert str(w.errors[1]) == "late 1"


def test_a_lost_connection_requeues_the_flight_in_input_order_and_counts_sends() -> None:
    w = SendWindow(4, 2)
    list(w.sendable())  # 0, 1
    w.settle(1, _ack(1))
    list(w.sendable())  # 2
    refused, requeued = w.requeue(ResendUnacked(max_resends=1), lambda i: AckTimeoutError(str(i)))
    assert (refused, requeued) == ([], 2) and w.in_flight == 0
    assert list(w.sendable()) == [0, 2]  # before 3, which never went
    # A second loss: a third send of 0 and 2 is more than the policy allows.
    refused, requeued = w.requeue(ResendUnacked(max_resends=1), lambda i: AckTimeoutError(f"refused {i}"))
    assert (refused, requeued) == ([0, 2], 0) and str(w.errors[0]) == "refused 0"


def test_no_resend_refuses_every_record_in_flight() -> None:
    w = SendWindow(2, 2)
    list(w.sendable())
    refused, _ = w.requeue(NO_RESEND, lambda i: AckTimeoutError(str(i)))
    assert refused == [0, 1]


def test_retry_puts_refused_records_back_in_order() -> None:
    w = SendWindow(3, 1)
    list(w.sendable())
    w.settle(0, error=NoSuchStreamError("not yet"))
    w.retry([0])
    assert not w.errors and list(w.sendable()) == [0]


# --- the NATS engine's steps: bursts, deadlines, late answers ----------------------------------


def test_a_burst_takes_the_free_room_in_one_span() -> None:
    w = SendWindow(10, 4)
    span = w.next_span()
    assert span == range(0, 4) and w.in_flight == 0  # named, not taken
    w.sent(span[:3], deadline=1.0)  # record 3 did not go (its frame was cut off)
    assert w.in_flight == 3 and bytes(w.written_once[:4]) == b"\x01\x01\x01\x00"
    assert w.next_span() == range(3, 4)
    w.settle(0, _ack(0))
    w.settle(1, _ack(1))
    assert w.next_span() == range(3, 6)
    assert not w.settle(-1, _ack(9)) and not w.settle(10, _ack(9))  # no such record


class _EvenOnce:
    """Re-sends even records once."""

    def should_resend(self, index: int, attempt: int) -> bool:
        return index % 2 == 0 and attempt <= 2


def test_overdue_resends_what_the_policy_allows_and_the_rest_is_late() -> None:
    w = SendWindow(4, 4)
    w.sent(w.next_span(), deadline=1.0)
    w.settle(2, _ack(2))
    assert w.next_deadline == 1.0 and w.overdue(0.5, ResendUnacked(), 2.0) == []  # not yet
    allow_even = _EvenOnce()
    again = w.overdue(1.0, allow_even, 2.0)
    assert again == [0] and w.timed_out == [1, 3] and w.in_flight == 1
    assert not w.more_to_send and w.running  # a time-out stops new sends; 0 is still awaited
    assert w.next_deadline == 2.0
    # Record 0's second deadline passes: a third send is more than the policy allows.
    assert w.overdue(2.0, allow_even, 3.0) == [] and w.timed_out == [1, 3, 0] and w.in_flight == 0
    # A late ack still counts; a repeat of it changes nothing.
    assert w.settle(3, _ack(3)) and w.timed_out == [1, 0] and w.acks[3] is not None
    assert not w.settle(3, _ack(30)) and w.acks[3].offset == 3  # type: ignore[union-attr]
    assert not w.running


def test_a_refused_record_stops_the_bursts_before_it() -> None:
    w = SendWindow(5, 8)
    w.sent(range(0, 2), deadline=1.0)
    w.refuse(2, ReadonlyPartitionError("too large"))
    assert w.next_span() == range(0) and not w.more_to_send and w.running
    assert not w.settle(2, _ack(2))  # never sent: no answer can settle it
    assert bytes(w.written_once) == b"\x01\x01\x00\x00\x00"


def test_without_answers_a_record_is_settled_once_handed_over() -> None:
    w = SendWindow(5, 2, answers=False)
    spans = []
    while span := w.next_span():
        w.sent(span)
        spans.append(span)
    assert spans == [range(0, 2), range(2, 4), range(4, 5)] and w.in_flight == 0
    assert bytes(w.written_once) == b"\x01" * 5 and not w.running


def test_a_span_after_a_requeue_is_the_first_run_of_waiting_records() -> None:
    w = SendWindow(8, 8)
    w.sent(w.next_span()[:5], deadline=1.0)  # 0-4
    for i in (0, 2):
        w.settle(i, _ack(i))
    w.requeue(ResendUnacked(), lambda i: AckTimeoutError(str(i)))  # 1, 3, 4 wait again
    assert w.next_span() == range(1, 2)
    w.sent(range(1, 2))
    assert w.next_span() == range(3, 5)
    w.sent(range(3, 5))
    assert w.next_span() == range(5, 8) and w.in_flight == 3
