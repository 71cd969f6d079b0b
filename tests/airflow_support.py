"""Airflow in tests: a throw-away AIRFLOW_HOME set before Airflow is first imported, a migrated
SQLite database on demand, and ``liftbridge`` connections given through environment variables.

Import this module (and call :func:`configure_airflow`) from a conftest before anything imports
Airflow: Airflow reads AIRFLOW_HOME and its configuration once, at first import.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DAGS_FOLDER = REPO / "dags_examples"

_home: Path | None = None
_db_ready = False


def configure_airflow() -> Path:
    """Point Airflow at a temporary home (SQLite, no examples, the example DAGs folder); idempotent.

    :return: the AIRFLOW_HOME in use.
    """
    global _home
    if _home is not None:
        return _home
    if "airflow" in sys.modules and os.environ.get("AIRFLOW_HOME"):
        # Someone imported Airflow first; keep what it was configured with.
        _home = Path(os.environ["AIRFLOW_HOME"])
        return _home
    _home = Path(tempfile.mkdtemp(prefix="airflow-home-"))
    atexit.register(shutil.rmtree, _home, True)
    os.environ.update(
        {
            "AIRFLOW_HOME": str(_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            # The provider's own task lines (e.g. whether a sensor deferred) are what tests look at.
            "AIRFLOW__LOGGING__NAMESPACE_LEVELS": "airflow.task.operators.airflow_provider_liftbridge=INFO",
            # Airflow signs its execution API's tokens with HS512, which wants a 64-byte key; the
            # one it makes up otherwise is 16 bytes and PyJWT warns at every token.
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
        }
    )
    return _home


def init_db() -> None:
    """Create the metadata database (SQLite in the temporary home) once per process (~3 s)."""
    global _db_ready
    if _db_ready:
        return
    configure_airflow()
    from airflow.utils import db

    db.initdb()
    _close_in_process_selectors()
    _db_ready = True


def _close_in_process_selectors() -> None:
    """Have ``dag.test()``'s supervisors close their epoll selector when their comms thread ends.

    ``dag.test()`` runs each task try under an ``InProcessTestSupervisor`` whose selector Airflow
    never closes (3.2, 3.3): it goes when the supervisor is collected. The supervisor's comms thread
    keeps it alive for up to a second after ``dag.test()`` returns, so the collection and
    ``gc.freeze()`` after each test (``tests/gc_between_tests.py``) often freeze it for good: one
    descriptor per task try, kept for the worker's life. The thread is the selector's last user.
    """
    try:
        from airflow.sdk.execution_time.supervisor import InProcessTestSupervisor
    except ImportError:  # another Airflow: nothing to mend
        return
    handle = InProcessTestSupervisor.__dict__.get("_handle_socket_comms")
    if handle is None or getattr(handle, "closes_selector", False):
        return

    def handle_then_close(self: Any) -> None:
        try:
            handle(self)
        finally:
            self.selector.close()

    handle_then_close.closes_selector = True  # type: ignore[attr-defined]
    InProcessTestSupervisor._handle_socket_comms = handle_then_close  # type: ignore[method-assign]


def conn_env_name(conn_id: str) -> str:
    """The environment variable Airflow reads connection ``conn_id`` from."""
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def liftbridge_conn_json(host: str, *, port: int | None = None, nats_url: str | None = None, **extra: Any) -> str:
    """A ``liftbridge`` connection as the JSON Airflow accepts in ``AIRFLOW_CONN_*``."""
    if nats_url:
        extra.setdefault("nats_servers", nats_url)
    conn: dict[str, Any] = {"conn_type": "liftbridge", "host": host, "extra": extra}
    if port is not None:
        conn["port"] = port
    return json.dumps(conn)


def register_dag(dag: Any) -> None:
    """Store a DAG defined in a test as the DAG processor would (``dag.test()`` runs only DAGs
    the metadata database knows; this one is in no DAG folder)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        manager = DagBundlesManager()
        manager.sync_bundles_to_db(session=session)
        session.commit()  # the DAG row refers to its bundle's row
        bundle = next(iter(manager.get_all_dag_bundles())).name
        update_dag_parsing_results_in_db(bundle, None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session)


def xcom_of(dag_run: Any, task_id: str, map_index: int | None = None) -> Any:
    """The XCom return value of ``task_id`` in ``dag_run`` (of one mapped instance if given)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id,
                dag_ids=dag_run.dag_id,
                task_ids=task_id,
                key="return_value",
                map_indexes=map_index,
            )
        ).all()
        return XComModel.deserialize_value(rows[0]) if rows else None
