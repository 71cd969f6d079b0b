"""min_messages over several partitions, deferrable: the triggerer's wait counts the messages of
all the task's partitions together (LiftbridgeCountTrigger), so messages arriving on partitions
other than the first end it; before, it waited for all of them on the first partition."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.operators import SinceLastRun
from tests.operators import consume_support as support
from tests.operators.test_consume_operator import make_dag, run

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]


def when_deferred(dag_id: str, stop: threading.Event, deferred: threading.Event, action: Callable[[], None]) -> None:
    """Run ``action`` once the DAG's task has deferred (its task instance has a ``next_method``);
    never, if it does not before ``stop``."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    while not stop.wait(0.05):
        with create_session() as session:
            resumes = session.query(TaskInstance.next_method).filter(TaskInstance.dag_id == dag_id).all()
        if any(method is not None for (method,) in resumes):
            deferred.set()
            action()
            return


def test_the_deferred_wait_counts_messages_on_every_partition(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=3)
    liftbridge_client.publish(stream_name, b"p2-0", partition=2)  # 1 of 3 there: the task defers
    support.reset()
    dag = make_dag(
        stream_name,
        apply_function="tests.operators.consume_support.record_plain",
        read=SinceLastRun("c", min_messages=3, poll_timeout=120),
        deferrable=True,
    )

    def publish_elsewhere() -> None:  # the first partition gets none
        liftbridge_client.publish_many(stream_name, [b"p1-0", b"p1-1"], partition=1)

    stop, deferred = threading.Event(), threading.Event()
    feeder = threading.Thread(target=when_deferred, args=(dag.dag_id, stop, deferred, publish_elsewhere))
    feeder.start()
    try:
        dag_run, result = run(dag)
    finally:
        stop.set()
        feeder.join()
    assert deferred.is_set()
    assert str(dag_run.state) == "success"
    assert result["processed"] == 3
    assert sorted(value for _, _, value in support.SEEN) == [b"p1-0", b"p1-1", b"p2-0"]
