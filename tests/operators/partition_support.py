"""Partitioned runs for the operator tests: ``dag.test()`` of Airflow 3.3.2 makes a manual run
without a partition key, so :func:`run_partitioned` makes the run as the scheduler does for a
``CronPartitionTimetable`` (``create_dagrun`` with ``partition_key`` and ``partition_date``) and
then runs its tasks with the same in-process loop and task runner as ``dag.test()``."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

from tests.airflow_support import register_dag


def run_partitioned(dag: Any, partition_key: str, partition_date: dt.datetime | None = None) -> Any:
    """Register ``dag``, create a run of it for ``partition_key`` (and ``partition_date``, as the
    scheduler gives a ``CronPartitionTimetable`` run; ``None`` as Airflow 3.2 does), run every
    task in this process until the run is finished; return the run (its ``state`` set)."""
    from airflow.models.dagbag import DBDagBag
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select

    register_dag(dag)
    with create_session() as session:
        scheduler_dag = DBDagBag().get_latest_version_of_dag(dag.dag_id, session=session)
        assert scheduler_dag is not None
        dag_run = scheduler_dag.create_dagrun(
            run_id=f"partition__{partition_key}__{uuid.uuid4().hex[:6]}",
            run_after=partition_date or dt.datetime.now(dt.UTC),
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.TEST,
            state=DagRunState.RUNNING,
            start_date=dt.datetime.now(dt.UTC),
            partition_key=partition_key,
            partition_date=partition_date,
            session=session,
        )
        session.commit()
        while dag_run.state == DagRunState.RUNNING:
            session.expire_all()
            schedulable, _ = dag_run.update_state(session=session)
            for ti in schedulable:
                ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            scheduled = [ti for ti in dag_run.get_task_instances(session=session) if ti.state == "scheduled"]
            if not scheduled and dag_run.state == DagRunState.RUNNING:
                time.sleep(0.2)  # a retry waiting for its delay (the tests give none): look again
            for ti in scheduled:
                try:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
                except Exception:  # noqa: BLE001 - the task's state says it, as in dag.test()
                    pass
        run_id = dag_run.run_id
    with create_session() as session:
        finished = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id))
        session.expunge(finished)
    return finished
