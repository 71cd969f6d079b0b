"""Functions the consume tests hand to LiftbridgeConsumeOperator by dotted path: they record what
they were given (the DAG runs in the test's process, so the test reads the records back)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import get_current_context

from airflow_provider_liftbridge.client import LiftbridgeClient, Message

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
