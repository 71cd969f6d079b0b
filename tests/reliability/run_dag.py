"""Run a reliability DAG (``EO_DAG_ID``, default the publish one) once with ``dag.test()`` (fixed
logical date, so every run is the same DAG run and the same producer id) and write the states and
XComs to ``EO_OUT``."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

LOGICAL_DATE = dt.datetime(2024, 6, 1, tzinfo=dt.UTC)


def main() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    if bag.import_errors:
        raise SystemExit(f"DAG import errors: {bag.import_errors}")
    dag = bag.get_dag(os.environ.get("EO_DAG_ID", "liftbridge_reliability_publish"))
    # run_after fixes the run id too (it is built from run_after): every run is the same DAG run.
    dag_run = dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    with create_session() as session:
        rows = session.scalars(XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag.dag_id, key="return_value")).all()
        xcoms = {row.task_id: XComModel.deserialize_value(row) for row in rows}
        tries = {ti.task_id: ti.try_number for ti in dag_run.get_task_instances(session=session)}
    Path(os.environ["EO_OUT"]).write_text(
        json.dumps({"state": str(dag_run.state), "publish": xcoms.get("publish"), "xcoms": xcoms, "tries": tries})
    )


if __name__ == "__main__":
    main()
