"""A password set in the connection reaches no log line, XCom value or error text of a full DAG
run. The example lifecycle DAG (create, publish over NATS, deferrable sensors, pause, delete)
runs with ``airflow dags test`` at log level INFO against a dev server whose nats-server demands
a user and password, given as the connection's NATS user/password or inside the NATS URL
(``nats://user:password@host:port``, which Airflow's own masking does not cover)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.devserver import DevServer, NatsServerSecurity
from airflow_provider_liftbridge.hooks.base import LiftbridgeHook
from airflow_provider_liftbridge.nats_security import NatsSecurity
from tests.airflow_support import conn_env_name
from tests.processes import run_child

pytestmark = [pytest.mark.usefixtures("airflow_db"), pytest.mark.timeout(300)]
SECRET = "Pw-9c1f7e2d-never-printed"
DAG_ID = "liftbridge_stream_lifecycle"


@pytest.fixture(scope="module")
def guarded() -> Iterator[DevServer]:
    creds = NatsSecurity(user="airflow", password=SECRET)
    with DevServer(nats_security=NatsServerSecurity(user="airflow", password=SECRET, client=creds)) as server:
        yield server


def _connection(server: DevServer, where: str) -> dict[str, Any]:
    host_port = server.nats_url.removeprefix("nats://")
    if where == "url":
        return {
            "conn_type": "liftbridge",
            "host": server.address,
            "extra": {"nats_servers": f"nats://airflow:{SECRET}@{host_port}"},
        }
    return {
        "conn_type": "liftbridge",
        "host": server.address,
        "login": "airflow",
        "password": SECRET,
        "extra": {"nats_servers": server.nats_url},
    }


@pytest.mark.parametrize("where", ["login/password", "url"])
def test_the_password_is_never_printed(guarded: DevServer, where: str) -> None:
    env = os.environ | {
        conn_env_name("liftbridge_default"): json.dumps(_connection(guarded, where)),
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    airflow = str(Path(sys.executable).with_name("airflow"))
    done = run_child([airflow, "dags", "test", DAG_ID], env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    # The run published over NATS and said so: the log line that names the NATS servers exists.
    assert "Publishing to stream" in output and "over NATS (nats://" in output, output[-3000:]
    assert SECRET not in output, "the password appears in the task logs"
    logs = "".join(p.read_text(errors="replace") for p in Path(os.environ["AIRFLOW_HOME"]).rglob("*.log"))
    assert SECRET not in logs, "the password appears in a log file"
    assert SECRET not in json.dumps(_xcoms_of_last_run(), default=repr), "the password appears in an XCom value"


def test_error_texts_do_not_carry_it(guarded: DevServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # A NATS server that is not there: the error names the URL, redacted.
    conn = _connection(guarded, "url")
    conn["extra"]["nats_servers"] = f"nats://airflow:{SECRET}@127.0.0.1:1"
    monkeypatch.setenv(conn_env_name("lb_secret"), json.dumps(conn))
    hook = LiftbridgeHook("lb_secret")
    ok, message = hook.test_connection()
    assert not ok and "nats://***@127.0.0.1:1" in message and SECRET not in message
    assert SECRET not in repr(hook.settings) and SECRET not in repr(hook.client)
    with pytest.raises(Exception) as info:
        hook.client.publish_many("s", [b"x"], path="nats")
    assert SECRET not in str(info.value) and SECRET not in repr(info.value)
    hook.close()


def _xcoms_of_last_run() -> list[Any]:
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        last = session.query(DagRun).filter(DagRun.dag_id == DAG_ID).order_by(DagRun.id.desc()).first()
        assert last is not None
        rows = session.scalars(XComModel.get_many(run_id=last.run_id, dag_ids=DAG_ID)).all()
        values = [XComModel.deserialize_value(row) for row in rows]
    assert values, "the run pushed no XCom"
    return values
