"""The triggers' ``apply_function`` is checked for its shape where the trigger is made (the DAG
processor for an ``AssetWatcher``, the worker for a deferring sensor) and imported in the triggerer:
a watcher DAG whose filter module is absent where it is parsed loads, and the trigger made from its
serialized form fires where the module is present; where it is missing, the watcher stops (the
message trigger sends an error event) naming the path and the triggerer, before reading anything."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger, incarnation_cursor_id
from airflow_provider_liftbridge.triggers.message import LiftbridgeMessageTrigger
from tests.airflow_conftest import needs_ack_mode
from tests.worker_module import WorkerModule

pytestmark = [pytest.mark.usefixtures("liftbridge_conn"), pytest.mark.timeout(120)]

WATCHER_DAG = """
import datetime as dt

from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.providers.standard.operators.empty import EmptyOperator

from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger

trigger = LiftbridgeEventTrigger(
    stream={stream!r}, apply_function={path!r}, apply_function_args=["go"], start_at="earliest"
)
orders = Asset({asset!r}, watchers=[AssetWatcher(name="go_orders", trigger=trigger)])

with DAG({dag_id!r}, schedule=[orders], start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)):
    EmptyOperator(task_id="react")
"""

IN_TRIGGERER = "cannot be imported on the triggerer (where the trigger runs): ModuleNotFoundError: No module named"


def cursor_of(client: LiftbridgeClient, trigger: LiftbridgeEventTrigger) -> int:
    created = client.fetch_metadata([trigger.stream]).streams[trigger.stream].creation_timestamp
    return client.fetch_cursor(incarnation_cursor_id(trigger.cursor_id, created), trigger.stream, trigger.partition)


def as_the_triggerer_makes_it(trigger: Any) -> Any:
    """The trigger rebuilt from its serialized form, as the triggerer does."""
    classpath, kwargs = trigger.serialize()
    assert classpath == f"{type(trigger).__module__}.{type(trigger).__qualname__}"
    return type(trigger)(**json.loads(json.dumps(kwargs)))


async def first_events(trigger: LiftbridgeEventTrigger, count: int) -> list[dict[str, Any]]:
    events = trigger.run()
    try:
        return [dict((await asyncio.wait_for(events.__anext__(), 15)).payload) for _ in range(count)]
    finally:
        await events.aclose()  # type: ignore[attr-defined]


def parsed_watcher_trigger(tmp_path: Path, stream: str, path: str) -> LiftbridgeEventTrigger:
    """Parse a DAG file with an AssetWatcher as the DAG processor does (a DagBag) and return the
    watcher's trigger."""
    from airflow.dag_processing.dagbag import BundleDagBag

    dags = tmp_path / "dags"
    dags.mkdir()
    dag_id = f"watch_{uuid.uuid4().hex[:8]}"
    source = WATCHER_DAG.format(stream=stream, path=path, asset=f"liftbridge://{stream}", dag_id=dag_id)
    (dags / "watcher_dag.py").write_text(source, encoding="utf-8")
    bag = BundleDagBag(dag_folder=str(dags), bundle_path=dags, bundle_name="dags-folder")
    assert bag.import_errors == {}
    (asset,) = bag.dags[dag_id].schedule
    (watcher,) = asset.watchers
    return watcher.trigger  # type: ignore[no-any-return]


async def test_a_watcher_dag_parses_without_the_filter_module_and_fires_where_it_is(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    module = WorkerModule(tmp_path)
    assert not module.importable()
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"no", b"go", b"go"])
    trigger = parsed_watcher_trigger(tmp_path, stream_name, module.path("value_is"))
    assert module.name not in sys.modules  # parsing did not import it
    with module.on_path():
        events = await first_events(as_the_triggerer_makes_it(trigger), 2)
    assert [e["message"]["offset"] for e in events] == [1, 2]
    assert [c["offset"] for c in module.calls()] == [0, 1, 2]


async def test_a_filter_missing_in_the_triggerer_stops_the_watcher_before_reading(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    module = WorkerModule(tmp_path)
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"go"] * 3)
    trigger = as_the_triggerer_makes_it(
        LiftbridgeEventTrigger(stream=stream_name, apply_function=module.path("value_is"), start_at="earliest")
    )
    with pytest.raises(LiftbridgeArgumentError) as raised:
        await first_events(trigger, 1)
    assert f"apply_function='{module.path('value_is')}' {IN_TRIGGERER} '{module.name}'" in str(raised.value)
    assert module.calls() == [] and cursor_of(liftbridge_client, trigger) == -1


@needs_ack_mode
async def test_in_ack_mode_a_filter_missing_in_the_triggerer_stops_the_watcher_and_moves_no_cursor(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    from airflow.triggers.shared_stream import SharedStreamManager

    module = WorkerModule(tmp_path)
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"go"] * 3)
    trigger = LiftbridgeEventTrigger(stream=stream_name, apply_function=module.path("value_is"), start_at="earliest")
    key = trigger.shared_stream_key()
    manager = SharedStreamManager(ack_timeout=30)
    try:
        events = trigger.filter_shared_stream(manager.subscribe(trigger_id=1, trigger=trigger, key=key))
        with pytest.raises(LiftbridgeArgumentError, match=re.escape(IN_TRIGGERER)):
            await asyncio.wait_for(events.__anext__(), 15)
    finally:
        await manager.stop_all()
    assert module.calls() == [] and cursor_of(liftbridge_client, trigger) == -1


async def test_the_message_trigger_imports_its_function_in_the_triggerer(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    module = WorkerModule(tmp_path)
    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b"no", b"go"])
    # Made (on the worker) where the module is absent: only the shape is checked.
    made = LiftbridgeMessageTrigger(
        stream=stream_name, apply_function=module.path("value_is"), apply_function_args=["go"]
    )

    async def event_of(trigger: LiftbridgeMessageTrigger) -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    missing = await asyncio.wait_for(event_of(as_the_triggerer_makes_it(made)), 15)
    assert missing["status"] == "error" and missing["error_type"] == "LiftbridgeArgumentError"
    assert f"apply_function='{module.path('value_is')}' {IN_TRIGGERER}" in missing["message"]
    assert module.calls() == []  # nothing was read before the import failed
    with module.on_path():
        found = await asyncio.wait_for(event_of(as_the_triggerer_makes_it(made)), 15)
    assert found["status"] == "success" and found["message"]["offset"] == 1
    assert [c["offset"] for c in module.calls()] == [0, 1]
