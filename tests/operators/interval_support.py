"""Three hours of messages for the interval-read tests, stamped by the dev server's reception
clock (devserver/clock.py), and an hourly DAG around one reading task."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.devserver import set_reception_clock
from airflow_provider_liftbridge.operators import DataInterval
from tests.airflow_support import register_dag

UTC = dt.UTC
#: The first of the three hours (10:00, 11:00 and 12:00 on 2026-03-02).
T0 = dt.datetime(2026, 3, 2, 10, 0, tzinfo=UTC)
HOUR = dt.timedelta(hours=1)
#: Minutes of each hour at which messages are received.
MINUTES = (1, 17, 33, 59)


def publish_three_hours(client: LiftbridgeClient, stream: str) -> dict[int, set[tuple[int, int]]]:
    """Create ``stream`` (2 partitions) and publish JSON messages ``{"hour", "minute", "country"}``
    at :01, :17, :33 and :59 of each hour (partition 1 skips :17), then one on each partition with
    the real clock ("today"). Returns, per hour (0, 1, 2), its (partition, offset) pairs."""
    client.create_stream(stream, stream, partitions=2)
    per_hour: dict[int, set[tuple[int, int]]] = {0: set(), 1: set(), 2: set()}
    offsets = [0, 0]
    try:
        for hour in range(3):
            for minute in MINUTES:
                set_reception_clock(stream, T0 + hour * HOUR + dt.timedelta(minutes=minute))
                for partition in (0, 1):
                    if partition == 1 and minute == 17:
                        continue  # the partitions hold different numbers
                    value = {"hour": 10 + hour, "minute": minute, "country": "DE" if minute < 30 else "FR"}
                    client.publish(stream, json.dumps(value).encode(), partition=partition)
                    per_hour[hour].add((partition, offsets[partition]))
                    offsets[partition] += 1
    finally:
        set_reception_clock(stream, None)
    for partition in (0, 1):
        client.publish(stream, b'{"hour": "today"}', partition=partition)
    return per_hour


def hourly_dag(operator: type, task_id: str, stream: str, **op_kwargs: Any) -> Any:
    """A registered hourly DAG (data intervals of one hour from 10:00) with one ``operator`` task."""
    from airflow.sdk import DAG
    from airflow.timetables.interval import CronDataIntervalTimetable

    op_kwargs.setdefault("read", DataInterval())
    op_kwargs.setdefault("retries", 1)
    op_kwargs.setdefault("retry_delay", dt.timedelta(seconds=0))
    with DAG(
        f"interval_{task_id}_{stream}_{uuid.uuid4().hex[:6]}",
        schedule=CronDataIntervalTimetable("0 * * * *", "UTC"),
        start_date=T0,
        catchup=False,
    ) as dag:
        operator(task_id=task_id, stream=stream, **op_kwargs)
    register_dag(dag)
    return dag


def logical_date_of(hour: int) -> dt.datetime:
    """The logical date of a manual run of hour ``hour`` (10:00 + ``hour``): its data interval is
    the last whole hour before it (Airflow's ``infer_manual_data_interval``)."""
    return T0 + (hour + 1) * HOUR
