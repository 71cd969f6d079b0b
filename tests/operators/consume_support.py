"""Functions the consume tests hand to LiftbridgeConsumeOperator by dotted path: they record what
they were given (the DAG runs in the test's process, so the test reads the records back)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from pathlib import Path
from typing import Any

from airflow.sdk import get_current_context

from airflow_provider_liftbridge.client import LiftbridgeClient, Message
from tests.margins import bounded

#: The logical date (so the run id) of the killable DAG's one run.
KILLABLE_DATE = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)
#: (try number, offset, value) of every message handed over.
SEEN: list[tuple[int, int, Any]] = []
#: Batches handed to ``record_batch``: lists of offsets.
BATCHES: list[list[int]] = []
#: Settings of the failing functions, set by each test: ``fail_at`` (offset), ``fail_tries``
#: (how many tries fail there), ``publish_more`` (address, stream, count: published by the first
#: call of the first try, i.e. after the plan was made).
STATE: dict[str, Any] = {}


def reset(**state: Any) -> None:
    """Forget what was seen; set the failing functions' settings."""
    SEEN.clear()
    BATCHES.clear()
    STATE.clear()
    STATE.update({"fail_tries": 1} | state)


def record(message: Message, tag: str = "", *, suffix: str = "") -> None:
    """Remember the message (its value decoded if it is JSON, else the bytes)."""
    SEEN.append((get_current_context()["ti"].try_number, message.offset, message.value))
    assert tag == "t" and suffix == "!"  # the args and kwargs arrived


def record_batch(messages: list[Message]) -> None:
    """Remember a batch."""
    BATCHES.append([m.offset for m in messages])
    for m in messages:
        SEEN.append((0, m.offset, m.value))


def fail_at_offset(message: Message) -> None:
    """Record the message; raise at ``STATE['fail_at']`` during the first ``fail_tries`` tries.
    The first call of the first try publishes ``STATE['publish_more']`` messages (after the plan)."""
    STATE["tries"] = get_current_context()["ti"].try_number
    more = STATE.pop("publish_more", None)
    if more:
        address, stream, count = more
        with LiftbridgeClient(address) as client:
            client.publish_many(stream, [b"late-%d" % i for i in range(count)])
    SEEN.append((STATE["tries"], message.offset, message.value))
    if message.offset == STATE.get("fail_at") and STATE["tries"] <= STATE["fail_tries"]:
        raise ValueError(f"cannot handle offset {message.offset}")


def fail_on_odd(message: Message) -> None:
    """Raise on odd ``n`` of a JSON value (for dead letters)."""
    SEEN.append((0, message.offset, message.value))
    if message.value["n"] % 2:
        raise KeyError(f"odd n {message.value['n']}")


def record_to_file(message: Message) -> None:
    """For the killed-try test (two processes): append ``try offset`` to ``$CONSUME_SEEN``; the
    first try SIGKILLs its own process at offset ``$CONSUME_KILL_AT`` (no handler runs, nothing
    is cleaned up: as a worker killed by the OOM killer)."""
    try_number = get_current_context()["ti"].try_number
    with open(os.environ["CONSUME_SEEN"], "a") as seen:
        seen.write(f"{try_number} {message.offset}\n")
    if message.offset == int(os.environ["CONSUME_KILL_AT"]) and not os.path.exists(os.environ["CONSUME_MARKER"]):
        Path(os.environ["CONSUME_MARKER"]).write_text("killed once\n")
        os.kill(os.getpid(), signal.SIGKILL)


def run_killable_dag() -> Any:
    """Run the killable DAG (tests/operators/dags) for its one fixed DAG run; return the run."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.airflow_support import register_dag

    bag = DagBag(str(Path(__file__).parent / "dags"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag("liftbridge_consume_killable")
    register_dag(dag)
    return dag.test(logical_date=KILLABLE_DATE, run_after=KILLABLE_DATE)


if __name__ == "__main__":
    run_killable_dag()


def reject_odd_batches(messages: list[Message]) -> None:
    """A batch function that refuses any batch holding an odd ``n``."""
    BATCHES.append([m.offset for m in messages])
    if any(m.value["n"] % 2 for m in messages):
        raise RuntimeError("odd batch")


def record_plain(message: Message) -> None:
    """Record the message (a JSON value ``{"n": ...}``, as bytes)."""
    SEEN.append((0, message.offset, message.value))


def slow_batch(messages: list[Message]) -> None:
    """Record a batch after ``STATE['sleep']`` seconds of work (a batch slower than a member timeout)."""
    time.sleep(STATE["sleep"])
    record_batch(messages)


def record_interval(message: Message) -> None:
    """Remember (try, partition, offset, value) of each message; raise at ``STATE['fail_at']``
    (a ``(partition, offset)``) the first ``STATE['fails']`` times it comes."""
    try_number = get_current_context()["ti"].try_number
    if (message.partition, message.offset) == STATE.get("fail_at") and STATE.get("fails", 0) > 0:
        STATE["fails"] -= 1
        raise ValueError(f"cannot handle partition {message.partition} offset {message.offset}")
    SEEN.append((try_number, (message.partition, message.offset), message.value))


def batch_back_after_leaving(messages: list[Message]) -> None:
    """Record (try, offsets) of a batch; the first try's batch starting at ``STATE['slow_from']``
    comes back only once ``STATE['leaves']()`` (how many times the server logged the task's member
    out of the group) has grown since the batch began: its keeper left after ``max_poll_interval``,
    a batch function slower than that bound."""
    try_number = get_current_context()["ti"].try_number
    if try_number == 1 and messages[0].offset == STATE["slow_from"]:
        before = STATE["leaves"]()
        with bounded("the member left the group", 60):
            deadline = time.monotonic() + 60
            while STATE["leaves"]() == before:
                if time.monotonic() > deadline:
                    raise AssertionError("the task's member did not leave the group after max_poll_interval")
                time.sleep(0.05)
    BATCHES.append([try_number, *(m.offset for m in messages)])
