"""``exactly_once.decision.unwrap``: the typed error behind a ``PublishError``, chosen by type."""

from __future__ import annotations

from airflow_provider_liftbridge.client import (
    AckTimeoutError,
    NotSentError,
    PublishError,
    ReadonlyPartitionError,
    UnavailableError,
)
from airflow_provider_liftbridge.client.exactly_once.decision import unwrap


def _error(
    errors: dict[int, Exception] | None = None, cause: BaseException | None = None, text: str = "x"
) -> PublishError:
    exc = PublishError(text, acks=[None, None], index=None, errors=dict(errors or {}))  # type: ignore[arg-type]
    exc.__cause__ = cause
    return exc


def test_the_failed_records_own_error_comes_first() -> None:
    own = ReadonlyPartitionError("read-only")
    exc = PublishError("x", acks=[None], index=0, errors={0: own})
    assert unwrap(exc) is own


def test_a_typed_cause_then_a_telling_record_error() -> None:
    cause = UnavailableError("down")
    assert unwrap(_error(cause=cause)) is cause
    telling = AckTimeoutError("late")
    assert unwrap(_error({0: NotSentError("not sent"), 1: telling})) is telling


def test_a_publish_error_raised_from_another_is_read_through() -> None:
    inner = _error({1: ReadonlyPartitionError("read-only")})
    assert isinstance(unwrap(_error({0: NotSentError("n")}, cause=inner)), ReadonlyPartitionError)


def test_without_a_typed_error_the_cause_type_decides_not_the_words() -> None:
    # The words do not matter (they once did: "ack" in the message meant a time-out).
    assert type(unwrap(_error(cause=ConnectionResetError("reset"), text="no acknowledgement"))) is UnavailableError
    assert type(unwrap(_error(text="stopped"))) is AckTimeoutError
