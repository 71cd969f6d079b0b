"""Dotted paths of the operators (``apply_function``, ``apply_function_batch``, ``on_file``,
``records_callable``) are checked for their shape when the DAG is parsed and imported on the worker
when the task runs: a DAG whose function module is absent where it is parsed loads, and its run
succeeds where the module is present; a module missing at run time fails the try with an error
naming the parameter, the path, the cause and the worker, before anything is read or committed."""

from __future__ import annotations

import datetime as dt
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.reading import plan_cursor_ids
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from airflow_provider_liftbridge.operators.stream_to_file import LiftbridgeStreamToFileOperator
from tests.airflow_support import register_dag, xcom_of
from tests.operators.helpers import read_all
from tests.worker_module import WorkerModule

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)

DAG_FILE = """
import datetime as dt

from airflow.sdk import DAG

from airflow_provider_liftbridge.operators import SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator

with DAG({dag_id!r}, schedule=None, start_date=dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)):
    LiftbridgeConsumeOperator(
        task_id="consume", stream={stream!r}, read=SinceLastRun("c"), apply_function={path!r}, apply_function_args=["x"]
    )
"""


def cannot_import(parameter: str, path: str) -> str:
    """The start of the error of a function that cannot be imported on the worker."""
    return (
        f"{parameter}={path!r} cannot be imported on the Airflow worker (where the task runs): "
        f"ModuleNotFoundError: No module named '{path.split('.')[0]}'"
    )


def one_task_dag(operator: type, **kwargs: Any) -> Any:
    """A registered DAG of one task, not retried, built (parsed) in this process."""
    from airflow.sdk import DAG

    with DAG(f"paths_{uuid.uuid4().hex[:8]}", schedule=None, start_date=START) as dag:
        operator(task_id="task", **kwargs)
    register_dag(dag)
    return dag


def task_state(dag_run: Any) -> str:
    return str(dag_run.get_task_instances()[0].state)


def publish(client: LiftbridgeClient, stream: str, n: int) -> None:
    client.create_stream(stream, stream)
    client.publish_many(stream, [f"m{i}".encode() for i in range(n)])


def test_a_consume_dag_file_parses_without_the_module_and_runs_where_it_is(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """The DAG file is parsed as the DAG processor does (a DagBag), in this process where the
    function's module does not exist; the task runs after the module is put on the path."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    module = WorkerModule(tmp_path)
    assert not module.importable()
    publish(liftbridge_client, stream_name, 3)
    dags = tmp_path / "dags"
    dags.mkdir()
    dag_id = f"worker_only_consume_{uuid.uuid4().hex[:8]}"
    (dags / "worker_only_consume.py").write_text(
        DAG_FILE.format(dag_id=dag_id, stream=stream_name, path=module.path("handle")), encoding="utf-8"
    )
    DagBundlesManager().sync_bundles_to_db()
    bag = BundleDagBag(dag_folder=str(dags), bundle_path=dags, bundle_name="dags-folder")
    assert bag.import_errors == {}
    assert module.name not in sys.modules  # parsing did not import it
    sync_bag_to_db(bag, "dags-folder", None)
    with module.on_path():
        dag_run = bag.get_dag(dag_id).test()
    assert str(dag_run.state) == "success"
    assert [(c["offset"], c["value"], c["args"]) for c in module.calls()] == [(i, f"m{i}", ["x"]) for i in range(3)]
    assert xcom_of(dag_run, "consume")["processed"] == 3
    assert liftbridge_client.fetch_cursor("c", stream_name, 0) == 2


def test_a_batch_function_is_imported_where_the_task_runs(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    module = WorkerModule(tmp_path)
    publish(liftbridge_client, stream_name, 4)
    dag = one_task_dag(
        LiftbridgeConsumeOperator,
        stream=stream_name,
        read=SinceLastRun("c"),
        apply_function_batch=module.path("handle_batch"),
        batch_size=3,
    )
    with module.on_path():
        dag_run = dag.test()
    assert task_state(dag_run) == "success"
    assert [c["offset"] for c in module.calls()] == [0, 1, 2, 3]
    assert liftbridge_client.fetch_cursor("c", stream_name, 0) == 3


@pytest.mark.parametrize("parameter", ["apply_function", "apply_function_batch"])
def test_a_module_missing_on_the_worker_fails_the_try_before_anything_is_read(
    parameter: str,
    tmp_path: Path,
    stream_name: str,
    liftbridge_client: LiftbridgeClient,
    capfd: pytest.CaptureFixture[str],
) -> None:
    module = WorkerModule(tmp_path)
    publish(liftbridge_client, stream_name, 3)
    path = module.path("handle")
    dag = one_task_dag(LiftbridgeConsumeOperator, stream=stream_name, read=SinceLastRun("c"), **{parameter: path})
    dag_run = dag.test()  # the module is not on this worker's path
    assert task_state(dag_run) == "failed"
    logs = capfd.readouterr().out
    assert cannot_import(parameter, path) in logs
    assert "importable there (install its package, or put it in the DAGs or plugins folder)" in logs
    assert module.calls() == []
    # Nothing was planned, read or committed: the position and the plan cursors are unset.
    assert liftbridge_client.fetch_cursor("c", stream_name, 0) == -1
    end_id, tag_id = plan_cursor_ids("c", f"{dag.dag_id}/task")
    assert [liftbridge_client.fetch_cursor(c, stream_name, 0) for c in (end_id, tag_id)] == [-1, -1]


def test_on_file_is_imported_where_the_archive_task_runs(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    module = WorkerModule(tmp_path)
    publish(liftbridge_client, stream_name, 3)
    archive = tmp_path / "archive"
    kwargs = dict(
        stream=stream_name, path=str(archive), format="jsonl", read=SinceLastRun("a"), on_file=module.path("on_file")
    )
    dag = one_task_dag(LiftbridgeStreamToFileOperator, **kwargs)  # parsed without the module

    dag_run = dag.test()  # run without it: fails before the archive is touched
    assert task_state(dag_run) == "failed"
    assert cannot_import("on_file", module.path("on_file")) in capfd.readouterr().out
    assert not archive.exists() and module.calls() == []
    assert liftbridge_client.fetch_cursor("a", stream_name, 0) == -1

    with module.on_path():
        dag_run = dag.test()
    assert task_state(dag_run) == "success"
    files = xcom_of(dag_run, "task")["files"]
    assert [(c["path"], c["rows"]) for c in module.calls()] == [(f["path"], 3) for f in files]
    assert len(files) == 1 and os.path.exists(files[0]["path"])
    assert liftbridge_client.fetch_cursor("a", stream_name, 0) == 2


def test_records_callable_templated_is_checked_after_rendering_and_imported_where_the_task_runs(
    tmp_path: Path, stream_name: str, liftbridge_client: LiftbridgeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    module = WorkerModule(tmp_path)
    liftbridge_client.create_stream(stream_name, stream_name)
    # Parsed without the module; the path itself is known only once rendered.
    dag = one_task_dag(
        LiftbridgePublishOperator,
        stream=stream_name,
        records_callable="{{ params.source }}",
        records_callable_kwargs={"count": 4},
        params={"source": module.path("records")},
    )
    dag_run = dag.test()
    assert task_state(dag_run) == "failed"
    assert cannot_import("records_callable", module.path("records")) in capfd.readouterr().out
    assert read_all(liftbridge_client, stream_name) == []  # nothing was published

    with module.on_path():
        dag_run = dag.test()
    assert task_state(dag_run) == "success"
    assert module.calls() == [{"function": "records", "count": 4}]
    assert [m.value for m in read_all(liftbridge_client, stream_name)] == [f"record-{i}".encode() for i in range(4)]

    dag_run = dag.test(run_conf={"source": "not a dotted path"})  # rendered, then checked: no import tried
    assert task_state(dag_run) == "failed"
    assert "records_callable='not a dotted path' is not valid: a dotted path of a function is required" in (
        capfd.readouterr().out
    )


@pytest.mark.parametrize(
    ("operator", "kwargs"),
    [
        (LiftbridgeConsumeOperator, {"read": SinceLastRun("c"), "apply_function": "my_pkg.handlers.handle"}),
        (LiftbridgeConsumeOperator, {"read": SinceLastRun("c"), "apply_function_batch": "my_pkg.handlers:handle"}),
        (LiftbridgeStreamToFileOperator, {"read": SinceLastRun("c"), "path": "/tmp/x", "on_file": "my_pkg.files.done"}),
        (LiftbridgePublishOperator, {"records_callable": "my_pkg.records.make"}),
    ],
)
def test_a_path_to_a_module_absent_here_is_accepted_when_the_dag_is_parsed(
    operator: type, kwargs: dict[str, Any]
) -> None:
    assert "my_pkg" not in sys.modules
    operator(task_id="t", stream="s", **kwargs)
    assert "my_pkg" not in sys.modules


@pytest.mark.parametrize(
    ("operator", "kwargs", "words"),
    [
        (LiftbridgeConsumeOperator, {"apply_function": "handle"}, "apply_function='handle' is not valid: a callable"),
        (LiftbridgeConsumeOperator, {"apply_function_batch": "my pkg.f"}, "apply_function_batch='my pkg.f' is not"),
        (LiftbridgeConsumeOperator, {"apply_function": 3}, "apply_function=3 is not valid: a callable or the dotted"),
        (LiftbridgeStreamToFileOperator, {"path": "/tmp/x", "on_file": "a..b"}, "on_file='a..b' is not valid"),
        (LiftbridgePublishOperator, {"records_callable": print}, "records_callable=<built-in function print> is not"),
        (LiftbridgePublishOperator, {"records_callable": "1pkg.f"}, "a dotted path of a function is required"),
    ],
)
def test_a_path_of_the_wrong_shape_fails_when_the_dag_is_parsed(
    operator: type, kwargs: dict[str, Any], words: str
) -> None:
    if operator is not LiftbridgePublishOperator:
        kwargs = {"read": SinceLastRun("c")} | kwargs
    with pytest.raises(LiftbridgeArgumentError, match=re.escape(words)):
        operator(task_id="t", stream="s", **kwargs)
