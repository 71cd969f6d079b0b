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
