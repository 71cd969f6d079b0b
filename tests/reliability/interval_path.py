"""The campaign's ``consume-interval`` path: the interval reads' machinery (``IntervalPlanner`` and
the shared ``read_plan``) under the campaign's faults, retried after a failure as Airflow retries
a task. The stream is filled before the run; the interval is [2000-01-01, the moment the call is
built), so it holds every message, with no allowed lateness: the reader waits only for everything
to be committed. Judged like ``consume`` (nothing of the interval skipped, values as stored), and
a second look at the same interval must find the same ends (an interval's offsets are fixed once
it is complete)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient, LiftbridgeError
from airflow_provider_liftbridge.client.reading import Interval, IntervalPlanner, read_plan

PATH = "consume-interval"
PLAN_KEY = "campaign/interval"


def interval_call(
    client: LiftbridgeClient, stream: str, partitions: int, outcome: Any, tries: int
) -> tuple[Callable[[], None], str]:
    """The call (on a thread: results and failures go into ``outcome``) and its progress cursor id."""
    interval = Interval(dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime.now(dt.UTC))

    def planner() -> IntervalPlanner:
        return IntervalPlanner(
            client, stream, cursor_prefix="campaign", plan_key=PLAN_KEY, interval=interval, lateness=dt.timedelta(0)
        )

    def call() -> None:
        for _ in range(tries):
            try:
                reader = planner()
                chosen = list(range(partitions))
                if reader.incomplete(chosen):
                    raise LiftbridgeError("the interval is not complete yet (written, not committed)")
                plans = reader.plan(chosen)
                outcome.planned = {p.partition: p.end for p in plans}

                def handle(batch: list[Any]) -> int:
                    outcome.consumed.extend((m.partition, m.offset, m.value) for m in batch)
                    return 0

                read_plan(client, plans, handle, position_cursor=reader.progress_cursor, batch_size=200)
                reader.finish(chosen)
                return
            except LiftbridgeError as exc:
                outcome.errors.append(exc)
                time.sleep(1.0)
        outcome.planned = {}  # never finished: nothing to hold it to

    return call, planner().progress_cursor


def ends_again(client: LiftbridgeClient, stream: str, partitions: int, planned: dict[int, int]) -> int:
    """How many partitions a second look at the interval ends elsewhere than the finished read."""
    interval_planner = IntervalPlanner(
        client,
        stream,
        cursor_prefix="campaign",
        plan_key=PLAN_KEY + "/check",
        interval=Interval(dt.datetime(2000, 1, 1, tzinfo=dt.UTC), dt.datetime.now(dt.UTC)),
        lateness=dt.timedelta(0),
    )
    again = {b.partition: b.end for b in (interval_planner.bounds(p) for p in range(partitions))}
    return sum(1 for p, end in planned.items() if again.get(p) != end)
