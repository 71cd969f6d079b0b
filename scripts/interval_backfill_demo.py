"""A backfill of three past hours with ``liftbridge_interval_archive``: prints what each run
archived and the archive's tree (the output shown in docs/consume.md, "A backfill of three hours").

An in-process dev server is started; three hours of messages (10:00 to 13:00 on 2026-03-02) are
published with its reception clock set to those times (devserver/clock.py: a real Liftbridge
stamps messages with the leader's clock, so past hours can only be produced this way here), plus
one message now. Then the DAG runs three times with those hours' logical dates, as
``airflow backfill create`` would, in a throw-away AIRFLOW_HOME.

    .venv/bin/python scripts/interval_backfill_demo.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    from tests.airflow_support import configure_airflow, init_db, liftbridge_conn_json

    configure_airflow()
    init_db()
    from airflow_provider_liftbridge.client import LiftbridgeClient
    from airflow_provider_liftbridge.devserver import DevServer

    work = Path(tempfile.mkdtemp(prefix="interval-backfill-"))
    with DevServer(data_dir=str(work / "lb")) as server:
        os.environ["AIRFLOW_CONN_LIFTBRIDGE_DEFAULT"] = liftbridge_conn_json(server.address, nats_url=server.nats_url)
        from airflow.dag_processing.dagbag import DagBag
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session

        from tests.operators.interval_support import logical_date_of, publish_three_hours

        with LiftbridgeClient(server.address) as client:
            per_hour = publish_three_hours(client, "sensor-readings")
        print("published:", {f"{10 + h}:00": len(v) for h, v in per_hour.items()}, "+ 1 per partition now")
        dag = DagBag(str(REPO / "dags_examples")).get_dag("liftbridge_interval_archive")
        root = work / "lake"
        for hour in range(3):
            run = dag.test(logical_date=logical_date_of(hour), run_conf={"archive_url": root.as_uri()})
            with create_session() as session:
                rows = session.scalars(
                    XComModel.get_many(
                        run_id=run.run_id, dag_ids=dag.dag_id, task_ids="hour_report", key="return_value"
                    )
                ).all()
                report = XComModel.deserialize_value(rows[0])
            print(f"run {run.run_id}: {run.state}; {json.dumps(report)}")
        print("archive:")
        for path in sorted(root.rglob("*.parquet")):
            print("  " + str(path.relative_to(root)))


if __name__ == "__main__":
    main()
