"""Event-driven: a DAG that runs when a "ready" order arrives on a Liftbridge stream.

No schedule, no sensor: an ``AssetWatcher`` in the triggerer watches the stream with
``LiftbridgeEventTrigger`` and turns every matching message into an asset event, which starts a
run of this DAG. The message travels in the asset event (``triggering_asset_events``).

It is fed by the ``liftbridge_stream_lifecycle`` example, given this stream name::

    export AIRFLOW_CONN_LIFTBRIDGE_DEFAULT='{"conn_type": "liftbridge", "host": "127.0.0.1", "port": 9292}'
    airflow triggerer &            # the watcher runs here
    airflow dags unpause liftbridge_event_consumer
    airflow dags trigger liftbridge_stream_lifecycle -c '{"stream": "lifecycle-orders"}'

The lifecycle run publishes four orders, one of them ``"ready"``; this DAG runs once for it.
The watcher keeps its place in a Liftbridge cursor, so a restarted triggerer carries on after the
last message it fired for (see docs/event-driven.md for the exact guarantees).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset, AssetWatcher, dag, task

from airflow_provider_liftbridge.triggers.event import LiftbridgeEventTrigger

STREAM = "lifecycle-orders"

ready_orders = Asset(
    name="liftbridge_ready_orders",
    watchers=[
        AssetWatcher(
            name="liftbridge_ready_orders_watcher",
            trigger=LiftbridgeEventTrigger(
                stream=STREAM,
                partition=0,
                apply_function="airflow_provider_liftbridge.sensors.matchers.json_field_equals",
                apply_function_args=["status", "ready"],
                cursor_id="example-ready-orders",
                # The lifecycle example creates the stream, then deletes it at the end of its run:
                # the watcher waits for it, and starts each new incarnation of it from the start.
                start_at="earliest",
                poll_interval=2,
            ),
        )
    ],
)


def orders_from(events: Any) -> list[dict[str, Any]]:
    """The orders carried by the triggering asset events: several when they came close together.
    On Airflow 3.3.2 the last events of a burst can wait for the next event before a run takes
    them (Airflow issue #56050; docs/event-driven.md says which schedule avoids the wait)."""
    orders = []
    for event in events:
        payload = event.extra["payload"]
        orders.append({"offset": payload["message"]["offset"], "order": payload["match"]})
    return orders


@dag(
    dag_id="liftbridge_event_consumer",
    schedule=[ready_orders],
    start_date=datetime(2024, 1, 1),
    catchup=False,
    tags=["liftbridge", "example", "event-driven"],
)
def liftbridge_event_consumer() -> None:
    @task
    def handle_ready_orders(triggering_asset_events: Any = None) -> dict[str, Any]:
        orders = orders_from(triggering_asset_events[ready_orders])
        for order in orders:
            print(f"order {order['order']['order']} is ready (stream offset {order['offset']})")
        return {"orders": orders}

    handle_ready_orders()


liftbridge_event_consumer()
