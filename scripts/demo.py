"""Run the stream-lifecycle example DAG end to end against an embedded Liftbridge dev server.

What it does, in order:

1. starts a dev server (gRPC broker + a nats-server child) in this process;
2. makes a throw-away AIRFLOW_HOME with a migrated SQLite database, points the DAGs folder at
   ``dags_examples/`` and gives the ``liftbridge_default`` connection through
   ``AIRFLOW_CONN_LIFTBRIDGE_DEFAULT``;
3. runs ``airflow dags test liftbridge_stream_lifecycle`` (create -> publish -> deferred offset
   sensor -> deferred message sensor -> pause -> delete) under a timeout, because
   ``airflow dags test`` ignores the timeouts given to deferred tasks;
4. beside it (unless ``--skip-archive``), runs ``liftbridge_stream_archive`` (consume, clean,
   archive to Parquet, read with Spark) with its archive task SIGKILLed mid-run and the same DAG
   run retried (``scripts/demo_archive.py``), in a copy of the database;
5. prints what happened (task states, offsets, the message found, the archive's files and what
   Spark found) from the runs' metadata;
6. stops the server and exits non-zero if anything failed.

Usage: ``python scripts/demo.py [--dag-id ID] [--timeout SECONDS] [--skip-archive] [--keep-home] [--verbose]``.
``--server HOST:PORT --nats-url URL`` uses a server that already runs instead of step 1 (the wheel
tier, ``scripts/test_wheel.py``, starts ``liftbridge-devserver`` from the installed wheel).

``--ui [--port PORT]`` instead starts a whole deployment to look at in a browser (the one the
system tests use, ``scripts/deployment.py``): the dev server, then ``airflow api-server`` (UI
and REST API), a second one for the execution API, ``scheduler`` (LocalExecutor, SQLite),
``dag-processor`` and ``triggerer`` as separate processes, with the example DAGs and the
``liftbridge_default`` connection. It prints the UI address and the login, starts one run of the
lifecycle example (which feeds the event-driven example), and stops everything on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from demo_archive import DAG_ID as ARCHIVE_DAG
from demo_archive import ArchiveDemo

REPO = Path(__file__).resolve().parent.parent
DAGS_FOLDER = REPO / "dags_examples"
DEFAULT_DAG = "liftbridge_stream_lifecycle"


class DemoError(Exception):
    """A step of the demo failed; the message says which and why."""


def airflow_command() -> list[str]:
    """The ``airflow`` CLI of this interpreter's environment."""
    candidate = Path(sys.executable).with_name("airflow")
    return [str(candidate)] if candidate.exists() else [sys.executable, "-m", "airflow"]


def run_airflow(args: list[str], env: dict[str, str], timeout: float, log: Path) -> None:
    """Run an ``airflow`` command, its output going to ``log``.

    :raises DemoError: it failed or ran past ``timeout``.
    """
    with log.open("ab") as out:
        out.write(f"\n$ airflow {' '.join(args)}\n".encode())
        out.flush()
        try:
            result = subprocess.run(
                airflow_command() + args, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            raise DemoError(f"'airflow {' '.join(args)}' did not finish within {timeout:.0f}s (log: {log})") from None
    if result.returncode != 0:
        raise DemoError(f"'airflow {' '.join(args)}' exited with {result.returncode} (log: {log})")


def load_json(value: Any) -> Any:
    """An XCom value as stored by Airflow 3 (JSON text, sometimes JSON inside JSON)."""
    for _ in range(2):
        if isinstance(value, bytes | bytearray):
            value = value.decode()
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            break
    return value


def read_run(db_path: Path, dag_id: str) -> tuple[str, str, dict[str, str], dict[str, Any]]:
    """The latest run of ``dag_id``: run id, state, task states and XCom return values.

    :raises DemoError: no run was recorded.
    """
    with sqlite3.connect(db_path) as db:
        row = db.execute(
            "SELECT run_id, state FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (dag_id,)
        ).fetchone()
        if row is None:
            raise DemoError(f"no run of {dag_id} was recorded in {db_path}")
        run_id, state = row
        states = dict(
            db.execute(
                "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ? ORDER BY start_date, task_id",
                (dag_id, run_id),
            )
        )
        xcoms = {
            task_id: load_json(value)
            for task_id, value in db.execute(
                "SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'",
                (dag_id, run_id),
            )
        }
    return run_id, state, states, xcoms


def report(dag_id: str, run_id: str, state: str, states: dict[str, str], xcoms: dict[str, Any]) -> None:
    """Print the run in a few readable lines."""
    print(f"\nDAG {dag_id}, run {run_id}: {state}")
    width = max(map(len, states), default=10)
    for task_id, task_state in states.items():
        print(f"  {task_id:<{width}}  {task_state}")
    create = xcoms.get("create_stream") or {}
    publish = xcoms.get("publish_records") or {}
    offset = xcoms.get("wait_for_offset") or {}
    found = xcoms.get("find_ready_order") or {}
    if create:
        print(
            f"\nstream      {create.get('stream')} (subject {create.get('subject')}, created={create.get('created')})"
        )
    if publish:
        spans = ", ".join(
            f"partition {p}: offsets {s['first_offset']}-{s['last_offset']}"
            for p, s in (publish.get("partitions") or {}).items()
        )
        print(f"published   {publish.get('count')} records, {publish.get('acknowledged')} acknowledged ({spans})")
    if offset:
        print(f"committed   offset {offset.get('offset')} reached (waited for {offset.get('target_offset')}, deferred)")
    if found:
        message = found.get("message") or {}
        print(f"found       offset {message.get('offset')}: {message.get('value_text')} (match: {found.get('match')})")
    if "delete_stream" in xcoms:
        print(f"deleted     {xcoms['delete_stream'].get('deleted')}")


def running_server(address: str | None, nats_url: str | None) -> contextlib.AbstractContextManager[Any]:
    """A dev server started in this process, or (``address`` given) the server that runs there;
    either has ``address`` and ``nats_url``."""
    if address:
        return contextlib.nullcontext(types.SimpleNamespace(address=address, nats_url=nats_url))
    from airflow_provider_liftbridge.devserver import DevServer

    return DevServer()


def serve_ui(port: int, keep_home: bool) -> int:
    """``--ui``: run the deployment until Ctrl-C (or SIGTERM); 0 when it stopped cleanly."""
    import signal
    import socket

    from deployment import COMPONENTS, PASSWORD, USERNAME, Deployment, DeploymentError

    if port:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                print(f"port {port} is taken; using a free one (choose with --port)")
                port = 0
    home = Path(tempfile.mkdtemp(prefix="liftbridge-demo-ui-"))
    deployment = Deployment(home, api_port=port)
    stop = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    components = ", ".join(COMPONENTS)
    print(f"starting the dev server and Airflow ({components}) in {home} ...")
    try:
        deployment.start()
        print(f"dev server  gRPC {deployment.devserver.address}, NATS {deployment.devserver.nats_url}")
        deployment.wait_for_dags(["liftbridge_stream_lifecycle", "liftbridge_event_consumer"])
        run_id = deployment.trigger_dag("liftbridge_stream_lifecycle", {"stream": "lifecycle-orders"})
        print(
            f"""
Airflow UI  {deployment.url}
login       {USERNAME} / {PASSWORD}

Look at:    DAGs -> liftbridge_stream_lifecycle, run {run_id}: its sensors defer to the triggerer
            DAGs -> liftbridge_event_consumer: one run per "ready" order (the asset's events)
            Assets -> liftbridge_ready_orders: the asset events the watcher fired
            Admin -> Connections -> liftbridge_default (the Test button works)
            Browse -> Liftbridge ({deployment.url}/liftbridge/): streams, the stream-archive
            example's pipelines with their lag, its dead letters, a message browser (docs/ui.md)
Logs:       {deployment.log_dir}/<component>.log

Ctrl-C stops everything.""",
            flush=True,
        )
        while not stop:
            deployment.check_running()
            time.sleep(0.5)
    except DeploymentError as exc:
        print(f"\nFAILED: {exc} (logs in {deployment.log_dir})", file=sys.stderr)
        keep_home = True
    finally:
        print("stopping ...", flush=True)
        deployment.stop()
        if keep_home:
            print(f"(AIRFLOW_HOME kept at {home})", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    return 0 if stop else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dag-id", default=DEFAULT_DAG, help=f"example DAG to run (default {DEFAULT_DAG})")
    parser.add_argument("--timeout", type=float, default=300, help="seconds allowed for the DAG run (default 300)")
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary AIRFLOW_HOME (logs, database)")
    parser.add_argument("--verbose", action="store_true", help="print Airflow's output at the end")
    parser.add_argument("--skip-archive", action="store_true", help=f"do not run {ARCHIVE_DAG} beside it")
    parser.add_argument("--ui", action="store_true", help="run the whole deployment with the UI until Ctrl-C")
    parser.add_argument("--server", metavar="HOST:PORT", help="use this running server instead of starting one")
    parser.add_argument("--nats-url", help="with --server: the NATS URL of that server")
    parser.add_argument("--port", type=int, default=8080, help="--ui: the UI's port (default 8080; 0: any free one)")
    args = parser.parse_args(argv)
    if args.ui:
        return serve_ui(args.port, args.keep_home)
    if bool(args.server) != bool(args.nats_url):
        parser.error("--server and --nats-url go together")

    from airflow_provider_liftbridge.client import LiftbridgeClient

    home = Path(tempfile.mkdtemp(prefix="liftbridge-demo-airflow-"))
    log = home / "demo.log"
    started = time.monotonic()
    ok = False
    try:
        with running_server(args.server, args.nats_url) as server:
            print(f"dev server  gRPC {server.address}, NATS {server.nats_url}")
            conn = {
                "conn_type": "liftbridge",
                "host": server.address,
                "extra": {"nats_servers": server.nats_url, "timeout": 10},
            }
            env = os.environ | {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW_CONN_LIFTBRIDGE_DEFAULT": json.dumps(conn),
            }
            print(f"airflow     home {home} (SQLite), migrating the database ...")
            run_airflow(["db", "migrate"], env, timeout=240, log=log)
            archive = None
            if not args.skip_archive:
                # Its own home (a copy of the migrated database): the two DAGs run side by side.
                archive_home = home / "archive-home"
                archive_home.mkdir()
                shutil.copy(home / "airflow.db", archive_home / "airflow.db")
                archive = ArchiveDemo(env | {"AIRFLOW_HOME": str(archive_home)}, home / "archive.log", args.timeout)
                print(f"airflow     {ARCHIVE_DAG} beside it: its archive task is SIGKILLed once, then retried ...")
                archive.start()
            print(f"airflow     dags test {args.dag_id} (timeout {args.timeout:.0f}s) ...")
            failure: DemoError | None = None
            try:
                run_airflow(["dags", "test", args.dag_id], env, timeout=args.timeout, log=log)
            except DemoError as exc:
                failure = exc  # still report what the run recorded
            run_id, state, states, xcoms = read_run(home / "airflow.db", args.dag_id)
            report(args.dag_id, run_id, state, states, xcoms)
            stream = (xcoms.get("create_stream") or {}).get("stream")
            if stream:
                with LiftbridgeClient(server.address) as client:
                    left = stream in client.fetch_metadata([stream]).streams
                print(f"check       stream {'still exists' if left else 'is gone from the server'}")
            if archive is not None:
                archive.join()
                _, archive_state, archive_states, archive_xcoms = read_run(archive_home / "airflow.db", ARCHIVE_DAG)
                archive.report(archive_states, archive_xcoms)
            if failure is not None:
                raise failure
            bad = {t: s for t, s in states.items() if s != "success"}
            if state != "success" or bad:
                raise DemoError(f"the run ended {state}; tasks not successful: {bad or 'none'} (log: {log})")
            if archive is not None and (archive.error or archive_state != "success"):
                log = home / "archive.log"
                raise DemoError(f"{ARCHIVE_DAG}: {archive.error or 'the run ended ' + archive_state} (log: {log})")
            ok = True
    except DemoError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-40:]
            print("--- last lines of the Airflow output ---", *tail, sep="\n", file=sys.stderr)
    finally:
        if args.verbose and log.exists():
            print(log.read_text(errors="replace"))
        if args.keep_home or not ok:
            print(f"(AIRFLOW_HOME kept at {home})", file=sys.stderr)
        else:
            shutil.rmtree(home, ignore_errors=True)
    print(f"\n{'OK' if ok else 'FAILED'} in {time.monotonic() - started:.1f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
