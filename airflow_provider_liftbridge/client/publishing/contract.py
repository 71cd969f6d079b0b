"""The publish contract, enforced in one place: a publishing call accounts for every input record
(an ack, or a typed error naming that record) or it raises. A short list of acks is never success.

Every batch of every publisher passes :func:`.batch.send_batch`: ``publish_many`` (blocking and
asyncio), ``BatchPublisher``, exactly-once publishing, Spark tasks and the publishing operators.
There the engines' result goes through :func:`accounted` or :func:`accounted_failure`. The engines
name what they know about each record they could not get acknowledged
(:func:`name_unacknowledged`); a record they leave unnamed, which is a bug, fails the call with
:class:`~..errors.UnaccountedRecordError` rather than dropping out of the result. Recovery logic
(re-sends, read-backs, resumes) may grow; this check stays where it is.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat

from ..errors import LiftbridgeError, NotSentError, PublishError, UnaccountedRecordError
from ..types import Ack

__all__ = ["accounted", "accounted_failure", "name_unacknowledged"]


def name_unacknowledged(
    acks: Sequence[Ack | None],
    errors: dict[int, LiftbridgeError],
    *,
    unsent: Iterable[int],
    in_doubt: Callable[[int], LiftbridgeError] | None,
    stopped_by: str,
) -> None:
    """Give each record without an ack or an error the error that says where it stands
    (``errors`` is updated in place): :class:`NotSentError` for the ``unsent`` ones (never handed
    to the connection: certainly not stored), ``in_doubt(i)`` for the others (handed over, no ack:
    the failure that ended the call, "may or may not be stored"). Without ``in_doubt`` those stay
    unnamed, for :func:`accounted_failure` to report.

    :param stopped_by: what stopped the call, for the not-sent message (e.g. "record 12's failure").
    """
    for i in unsent:
        if acks[i] is None and i not in errors:
            errors[i] = NotSentError(
                f"record {i} was not sent: the call stopped at {stopped_by} first. It is not stored; "
                "publishing it again cannot duplicate it."
            )
    if in_doubt is None:
        return
    for i, ack in enumerate(acks):
        if ack is None and i not in errors:
            errors[i] = in_doubt(i)


def accounted(acks: Sequence[Ack | None], n: int, *, expects_acks: bool, where: str) -> list[Ack]:
    """The acks of a batch of ``n`` records that the engine reports as published: one per record
    in input order, or ``[]`` when no acks are expected (ack policy ``NONE``).

    :raises PublishError: the engine returned a different number of acks, or a ``None`` among
        them; each record without an ack gets :class:`UnaccountedRecordError`.
    """
    if not expects_acks:
        if not acks:
            return []
    elif len(acks) == n and not any(map(operator.is_, acks, repeat(None))):  # at C speed
        return acks if isinstance(acks, list) else list(acks)  # type: ignore[arg-type]  # no None
    raise _unaccounted(acks, n, {}, where, None)


def accounted_failure(exc: PublishError, n: int, where: str, *, expects_acks: bool = True) -> PublishError:
    """``exc`` (a batch of ``n`` records failed) checked against the contract: returned as it is
    when every record is acknowledged or named in ``exc.errors``; else a :class:`PublishError` in
    which every other record gets :class:`UnaccountedRecordError`, chained to ``exc``. Without
    acks (ack policy ``NONE``) a record handed to the connection has neither, by design: only
    the length is checked then."""
    if len(exc.acks) == n and (
        not expects_acks or all(a is not None or i in exc.errors for i, a in enumerate(exc.acks))
    ):
        return exc
    return _unaccounted(exc.acks, n, dict(exc.errors), where, exc)


def _unaccounted(
    acks: Sequence[Ack | None], n: int, errors: dict[int, LiftbridgeError], where: str, failure: PublishError | None
) -> PublishError:
    if len(acks) != n:
        # The acks cannot be matched to records any more: none of them proves anything.
        acks, errors = [None] * n, {}
    missing = [i for i, a in enumerate(acks) if a is None and i not in errors]
    for i in missing:
        errors[i] = UnaccountedRecordError(
            f"record {i} of the batch to {where} got neither an ack nor an error from the publishing engine; "
            "it may or may not be stored. This is a bug of airflow-provider-liftbridge: please report it."
        )
    first = min(errors) if errors else None
    what = f"{failure}; and " if failure is not None and str(failure) else ""
    exc = PublishError(
        f"{what}{len(missing)} of {n} records are unaccounted for (the publish contract caught it, so the call "
        "fails instead of returning fewer acks than records)",
        acks=acks,
        index=first,
        errors=errors,
    )
    exc.__cause__ = failure if failure is not None else (errors[first] if first is not None else None)
    return exc
