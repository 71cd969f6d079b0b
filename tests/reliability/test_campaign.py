"""The fault campaign's smoke (issue 36): a few randomized runs in the default test run, each path
at least once, each judged by the campaign's checker. The long run is ``scripts/fault_campaign.py``.

The seeds are fixed (``LIFTBRIDGE_CAMPAIGN_SEED`` moves them), so a failure here is reproduced by
its seed: ``python scripts/fault_campaign.py --seed N``.
"""

from __future__ import annotations

import os

import pytest

from airflow_provider_liftbridge.client import Ack, AckPolicy, NotSentError, PublishError, Record

from .campaign import PATHS, DevRig, Outcome, Schedule, check, draw, run

pytestmark = [pytest.mark.timeout(300)]

BASE_SEED = int(os.environ.get("LIFTBRIDGE_CAMPAIGN_SEED", "36000"))
SMOKE = [draw(BASE_SEED + i, paths=[PATHS[i % len(PATHS)]]) for i in range(len(PATHS) + 1)]


@pytest.mark.parametrize("schedule", SMOKE, ids=[f"seed-{s.seed}-{s.path}" for s in SMOKE])
def test_randomized_fault_run_breaks_no_invariant(schedule: Schedule) -> None:
    with DevRig() as rig:
        verdict = run(schedule, rig)
    assert verdict.violations == [], (
        f"{schedule} ({verdict.struck}): {verdict.outcome}: {verdict.violations}; "
        f"reproduce with: python scripts/fault_campaign.py --seed {schedule.seed}"
    )


def test_a_schedule_comes_from_its_seed_alone() -> None:
    assert draw(7) == draw(7)
    assert len({draw(seed) for seed in range(50)}) == 50
    assert {draw(seed).path for seed in range(200)} == set(PATHS)


# -- the checker catches what it must (no cluster: outcomes made by hand) ----------------------


def _ack(partition: int, offset: int) -> Ack:
    return Ack(
        stream="s",
        partition=partition,
        partition_subject="s",
        msg_subject="s",
        offset=offset,
        ack_inbox="",
        correlation_id="",
        ack_policy=AckPolicy.ALL,
        reception_timestamp=0,
        commit_timestamp=0,
    )


class _Stored:
    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self.partition, self.offset, self.value = partition, offset, value


_BULK = Schedule(1, "bulk-nats", "leader", "kill", "during", 0.5, 1.0, 0.0, 3, 1)
_RECORDS = [Record(b"a"), Record(b"b"), Record(b"c")]


def test_the_checker_calls_a_short_list_of_acks_a_violation() -> None:
    stored = [_Stored(0, 0, b"a"), _Stored(0, 1, b"b")]
    outcome = Outcome(_RECORDS, acks=[_ack(0, 0), _ack(0, 1)])
    assert check(_BULK, outcome, stored) == [
        "returned 2 acks for 3 records",
        "returned success, but 1 record(s) are not in the stream",
    ]


def test_the_checker_calls_an_ack_pointing_elsewhere_a_violation() -> None:
    stored = [_Stored(0, 0, b"a"), _Stored(0, 1, b"b"), _Stored(0, 2, b"c")]
    outcome = Outcome(_RECORDS, acks=[_ack(0, 0), _ack(0, 2), _ack(0, 1)])
    assert check(_BULK, outcome, stored) == ["2 ack(s) point at no stored record with that payload, e.g. [1, 2]"]


def test_the_checker_holds_a_publish_error_to_the_contract() -> None:
    stored = [_Stored(0, 0, b"a"), _Stored(0, 1, b"c")]
    unnamed = PublishError("x", acks=[_ack(0, 0), None, None], index=1, errors={2: NotSentError("not sent")})
    outcome = Outcome(_RECORDS, errors=[unnamed])
    assert check(_BULK, outcome, stored) == [
        "PublishError leaves 1 record(s) without an ack or an error, e.g. [1]",
        "1 record(s) named NotSentError are in the stream, e.g. [2]",
    ]


def test_the_checker_calls_a_duplicate_of_exactly_once_a_violation() -> None:
    schedule = Schedule(1, "exactly-once", "leader", "kill", "during", 0.5, 1.0, 0.0, 3, 1)
    stored = [_Stored(0, 0, b"a"), _Stored(0, 1, b"b"), _Stored(0, 2, b"b"), _Stored(0, 3, b"c")]
    assert check(schedule, Outcome(_RECORDS, written=3), stored) == ["1 record(s) stored more than once"]


def test_the_checker_calls_a_skipped_message_a_violation() -> None:
    schedule = Schedule(1, "consume", "leader", "kill", "during", 0.5, 1.0, 0.0, 3, 1)
    stored = [_Stored(0, 0, b"a"), _Stored(0, 1, b"b"), _Stored(0, 2, b"c")]
    outcome = Outcome(_RECORDS, consumed=[(0, 0, b"a"), (0, 2, b"c")], planned={0: 3}, left_after=0)
    assert check(schedule, outcome, stored) == ["1 message(s) never handed to the function, e.g. [(0, 1)]"]
