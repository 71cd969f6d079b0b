"""The reading operators' metrics (``operators/metrics.py``, docs/ui.md) through Airflow's real
``Stats`` module, in real DAG runs (``dag.test()``) against the dev server.

What is not real: the metrics backend. ``Stats`` is initialised with a backend that records what
it is sent (Airflow's StatsD backend needs the ``statsd`` package, which this environment lacks);
everything from the operator to ``Stats``' dispatch (name checks, tags) is Airflow's own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators import DeadLetterStream, SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.metrics import DEAD_LETTERED, LAG, PARTITION_LAG, PROCESSED
from tests.airflow_support import register_dag

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


class Recorder(NoStatsLogger):
    """Airflow's no-op backend, keeping ``(kind, name, value, tags)`` of every count and gauge."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, float, dict[str, Any]]] = []

    def incr(self, stat: str, count: int | None = 1, rate: float = 1, *, tags: Any = None) -> None:
        self.sent.append(("incr", stat, 1 if count is None else count, dict(tags or {})))

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: Any = None) -> None:
        self.sent.append(("gauge", stat, value, dict(tags or {})))


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    from airflow.sdk._shared.observability.metrics import stats

    backend = Recorder()
    stats.initialize(factory=lambda: backend, export_legacy_names=False)
    try:
        yield backend
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)


def test_consume_sends_processed_dead_lettered_and_lag(
    recorder: Recorder, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    liftbridge_client.publish_many(stream_name, [b'{"n": 1}', b"not json", b'{"n": 2}'], partition=0)
    liftbridge_client.publish_many(stream_name, [b'{"n": 3}'] * 4, partition=1)
    dag_id = f"metrics_{uuid.uuid4().hex[:8]}"
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator(
            task_id="consume",
            stream=stream_name,
            read=SinceLastRun("metrics", max_messages=2),  # partition 1 keeps 2 messages of lag
            value_format="json",
            apply_function="tests.ui.ui_support.accept",
            dead_letters=DeadLetterStream(f"{stream_name}-dlq", create=True),
        )
    register_dag(dag)
    assert str(dag.test().state) == "success"
    tags = {"dag_id": dag_id, "task_id": "consume", "stream": stream_name}
    ours = [sent for sent in recorder.sent if sent[1].startswith("liftbridge.") and sent[3].get("dag_id") == dag_id]
    assert ours == [
        ("incr", PROCESSED, 4, tags),
        ("incr", DEAD_LETTERED, 1, tags),
        ("gauge", LAG, 3, tags),
        ("gauge", PARTITION_LAG, 1, tags | {"partition": "0"}),
        ("gauge", PARTITION_LAG, 2, tags | {"partition": "1"}),
    ]
