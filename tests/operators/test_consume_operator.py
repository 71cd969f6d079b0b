"""LiftbridgeConsumeOperator through real DAG runs (``dag.test()``) against the dev server:
planned ranges across retries and runs, commit cadences, dead letters, bad input."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, StartPosition
from airflow_provider_liftbridge.client.reading import plan_cursor_ids, run_tag
from airflow_provider_liftbridge.devserver import DevServerProcess
from airflow_provider_liftbridge.operators import ConsumerGroup, SinceLastRun
from airflow_provider_liftbridge.operators.consume import LiftbridgeConsumeOperator
from airflow_provider_liftbridge.operators.dead_letters import DeadLetterStream
from airflow_provider_liftbridge.operators.read_modes import parse_reading_start
from airflow_provider_liftbridge.operators.reading_base import parse_partitions
from tests.airflow_support import REPO, conn_env_name, liftbridge_conn_json, register_dag, xcom_of
from tests.margins import bounded
from tests.operators import consume_support as support
from tests.operators.helpers import read_all
from tests.processes import run_child

pytestmark = [pytest.mark.usefixtures("airflow_db", "liftbridge_conn"), pytest.mark.timeout(180)]
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def make_dag(stream: str, **op_kwargs: Any) -> Any:
    """One registered DAG with one consume task (retried once, at once, unless told otherwise)."""
    from airflow.sdk import DAG

    op_kwargs.setdefault("read", SinceLastRun("c"))
    op_kwargs.setdefault("retries", 1)
    op_kwargs.setdefault("retry_delay", dt.timedelta(seconds=0))
    with DAG(f"consume_{stream}_{uuid.uuid4().hex[:6]}", schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator(task_id="consume", stream=stream, **op_kwargs)
    register_dag(dag)
    return dag


def run(dag: Any) -> tuple[Any, Any]:
    """Run ``dag`` once (a new run each time); return (run, the consume task's XCom)."""
    dag_run = dag.test()
    return dag_run, xcom_of(dag_run, "consume")


def run_dag(stream: str, **op_kwargs: Any) -> tuple[Any, Any]:
    return run(make_dag(stream, **op_kwargs))


def publish(client: LiftbridgeClient, stream: str, n: int, start: int = 0, partition: int = 0) -> None:
    client.publish_many(stream, [json.dumps({"n": i}).encode() for i in range(start, start + n)], partition=partition)


def test_consume_end_to_end_with_args_and_a_second_run(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    publish(liftbridge_client, stream_name, 5, partition=0)
    publish(liftbridge_client, stream_name, 3, partition=1)
    support.reset()
    kwargs = dict(
        apply_function="tests.operators.consume_support.record",
        apply_function_args=["t"],
        apply_function_kwargs={"suffix": "!"},
        batch_size=2,
    )
    dag_run, result = run_dag(stream_name, **kwargs)
    assert str(dag_run.state) == "success"
    assert sorted(o for _, o, _ in support.SEEN) == [0, 0, 1, 1, 2, 2, 3, 4]
    assert result["processed"] == 8 and result["dead_lettered"] == 0
    assert result["partitions"]["0"] | {} == {
        "first_offset": 0,
        "last_offset": 4,
        "processed": 5,
        "dead_lettered": 0,
        "committed": 4,
        "plan_end": 5,
        "resumed": False,
        "lag": 0,
    }
    assert liftbridge_client.fetch_cursor("c", stream_name, 1) == 2
    # A second DAG (another task) with the same cursor goes on where the first stopped.
    publish(liftbridge_client, stream_name, 2, start=5, partition=0)
    support.reset()
    _, result = run_dag(stream_name, **kwargs)
    assert [(o, json.loads(v)["n"]) for _, o, v in support.SEEN] == [(5, 5), (6, 6)]
    assert result["partitions"]["1"]["processed"] == 0


def test_retry_resumes_at_the_failed_message_and_reads_only_the_plan(
    stream_name: str, liftbridge_client: LiftbridgeClient, lb_address: str
) -> None:
    """Try 1 fails at offset 3 (after messages arrived beyond the plan): the position stays at 2;
    try 2 reads 3..4 only; the next run reads what arrived after the plan."""
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 5)
    support.reset(fail_at=3, publish_more=(lb_address, stream_name, 4))
    dag = make_dag(stream_name, apply_function="tests.operators.consume_support.fail_at_offset", batch_size=2)
    dag_run, result = run(dag)
    assert str(dag_run.state) == "success"
    assert [(t, o) for t, o, _ in support.SEEN] == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 3), (2, 4)]
    assert result["partitions"]["0"] == {
        "first_offset": 3,
        "last_offset": 4,
        "processed": 2,
        "dead_lettered": 0,
        "committed": 4,
        "plan_end": 5,
        "resumed": True,
        "lag": 4,
    }
    end_id, tag_id = plan_cursor_ids("c", f"{dag.dag_id}/consume")
    assert liftbridge_client.fetch_cursor(end_id, stream_name, 0) == 5
    assert liftbridge_client.fetch_cursor(tag_id, stream_name, 0) == run_tag(dag_run.run_id)
    support.reset()
    dag_run, result = run(dag)  # a new run: plans afresh from the position
    assert [(o, v) for _, o, v in support.SEEN] == [(5 + i, b"late-%d" % i) for i in range(4)]
    assert result["partitions"]["0"]["resumed"] is False and result["partitions"]["0"]["committed"] == 8


def test_a_sigkilled_try_then_a_retry(
    stream_name: str, liftbridge_client: LiftbridgeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try's process is SIGKILLed at offset 6 (batches of 4): the position stays at 3;
    the retry (same DAG run, another process) reads 4..9 and not what arrived after the plan."""
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 10)
    seen = tmp_path / "seen.txt"
    for name, value in {
        "CONSUME_STREAM": stream_name,
        "CONSUME_SEEN": str(seen),
        "CONSUME_KILL_AT": "6",
        "CONSUME_MARKER": str(tmp_path / "killed"),
    }.items():
        monkeypatch.setenv(name, value)
    killed = run_child(
        [sys.executable, "-m", "tests.operators.consume_support"],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert liftbridge_client.fetch_cursor("killable", stream_name, 0) == 3
    publish(liftbridge_client, stream_name, 3, start=10)  # after the plan: for the next run
    dag_run = support.run_killable_dag()  # the same DAG run: its task instance was left running
    assert str(dag_run.state) == "success"
    offsets = [int(line.split()[1]) for line in seen.read_text().splitlines()]
    restart = next(i for i in range(1, len(offsets)) if offsets[i] <= offsets[i - 1])
    assert offsets[:restart] == list(range(7)) and offsets[restart:] == list(range(4, 10))
    result = xcom_of(dag_run, "consume")
    assert result["partitions"]["0"] | {} == {
        "first_offset": 4,
        "last_offset": 9,
        "processed": 6,
        "dead_lettered": 0,
        "committed": 9,
        "plan_end": 10,
        "resumed": True,
        "lag": 3,
    }


def test_dead_letters_carry_the_error_and_the_source(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    """Per message: odd values raise and a value that is not JSON cannot be decoded; both go to
    the dead-letter stream (created on demand) and processing goes on. Per batch: a raising batch
    function sends its whole batch."""
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name)
    values = [b'{"n": 0}', b'{"n": 1}', b"not json", b'{"n": 3}', b'{"n": 4}', b'{"n": 6}']
    liftbridge_client.publish_many(stream_name, values)
    liftbridge_client.publish(stream_name, b'{"n": 9}', key=b"k", headers={"trace": b"t-1"})
    support.reset()
    common = dict(stream=stream_name, value_format="json", batch_size=2)
    with DAG(f"dead_letters_{stream_name}", schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator(
            task_id="per_message",
            read=SinceLastRun("m"),
            apply_function="tests.operators.consume_support.fail_on_odd",
            dead_letters=DeadLetterStream(f"{stream_name}-dlq", create=True),
            **common,
        )
        liftbridge_client.create_stream(f"{stream_name}-dlq2", f"{stream_name}-dlq2")
        LiftbridgeConsumeOperator(
            task_id="per_batch",
            read=SinceLastRun("b"),
            apply_function_batch="tests.operators.consume_support.reject_odd_batches",
            dead_letters=DeadLetterStream("{{ params.dead_letters }}"),
            params={"dead_letters": f"{stream_name}-dlq2"},
            **common,
        )
    register_dag(dag)
    dag_run = dag.test()
    assert str(dag_run.state) == "success"
    assert [o for _, o, _ in support.SEEN] == [0, 1, 3, 4, 5, 6]  # offset 2 never reached the function
    per_message = xcom_of(dag_run, "per_message")
    assert (per_message["processed"], per_message["dead_lettered"]) == (7, 4)
    assert per_message["partitions"]["0"]["committed"] == 6
    dead = read_all(liftbridge_client, f"{stream_name}-dlq")
    assert [(m.value, m.headers["dead-letter-source-offset"]) for m in dead] == [
        (b'{"n": 1}', b"1"),
        (b"not json", b"2"),
        (b'{"n": 3}', b"3"),
        (b'{"n": 9}', b"6"),
    ]
    assert (dead[3].key, dead[3].headers["trace"]) == (b"k", b"t-1")
    assert dead[0].headers["dead-letter-error-type"] == b"KeyError"
    assert dead[0].headers["dead-letter-error"] == b"'odd n 1'"
    assert dead[0].headers["dead-letter-source-stream"] == stream_name.encode()
    assert dead[0].headers["dead-letter-source-partition"] == b"0"
    assert dead[1].headers["dead-letter-error-type"] == b"NotJsonError"
    assert b"offset 2 is not JSON" in dead[1].headers["dead-letter-error"]
    # Per batch: [0, 1] raises -> both dead; [2 (not JSON), 3] -> 2 dead as not JSON, [3] raises;
    # [4, 5] passes, [6] raises.
    per_batch = xcom_of(dag_run, "per_batch")
    assert (per_batch["processed"], per_batch["dead_lettered"]) == (7, 5)
    assert support.BATCHES == [[0, 1], [3], [4, 5], [6]]
    assert [m.headers["dead-letter-source-offset"] for m in read_all(liftbridge_client, f"{stream_name}-dlq2")] == [
        b"0",
        b"1",
        b"2",
        b"3",
        b"6",
    ]


def test_bad_input_at_run_time_fails_before_reading_and_names_the_fix(
    stream_name: str, liftbridge_client: LiftbridgeClient, capfd: pytest.CaptureFixture[str]
) -> None:
    """Independent tasks of one DAG run, each with one bad input, retried never: each fails with
    words that name the problem, and none moves a position past what it processed."""
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name)
    liftbridge_client.publish_many(stream_name, [b'{"n": 0}', b"<xml/>", b'{"n": 2}'])
    support.reset()
    record = "tests.operators.consume_support.fail_on_odd"
    with DAG(f"bad_input_{stream_name}", schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator(
            task_id="not_json", stream=stream_name, read=SinceLastRun("j"), apply_function=record, value_format="json"
        )
        LiftbridgeConsumeOperator(
            task_id="no_dead_letter_stream",
            stream=stream_name,
            read=SinceLastRun("d"),
            apply_function=record,
            dead_letters=DeadLetterStream(f"{stream_name}-missing"),
        )
        LiftbridgeConsumeOperator(
            task_id="no_partition",
            stream=stream_name,
            read=SinceLastRun("p"),
            apply_function=record,
            partitions="{{ 3 }}",
        )
        LiftbridgeConsumeOperator(
            task_id="no_stream", stream=f"{stream_name}-missing", read=SinceLastRun("s"), apply_function=record
        )
        LiftbridgeConsumeOperator(
            task_id="bad_rendered",
            stream=stream_name,
            read=SinceLastRun("r"),
            apply_function=record,
            partitions="{{ 'x,y' }}",
        )
    register_dag(dag)
    dag_run = dag.test()
    states = {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}
    assert set(states.values()) == {"failed"}, states
    assert [o for _, o, _ in support.SEEN] == [0]  # the not_json task, before offset 1
    assert liftbridge_client.fetch_cursor("j", stream_name, 0) == 0
    assert [liftbridge_client.fetch_cursor(c, stream_name, 0) for c in "dpsr"] == [-1, -1, -1, -1]
    logs = capfd.readouterr().out
    for words in (
        f"apply_function failed at stream '{stream_name}' partition 0 offset 1: NotJsonError",
        f"dead-letter stream '{stream_name}-missing' does not exist: create it, or have it created (DeadLetterStream(",
        f"stream '{stream_name}' has no partition 3 (it has partitions 0..0): fix partitions",
        f"stream '{stream_name}-missing' does not exist: create it first, or fix the stream name",
        "partitions=['x', 'y'] is not valid: partition numbers are whole numbers",
    ):
        assert words in logs, words


def test_group_mode_reads_the_partitions_the_group_assigns(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """Another member of the group holds one of the two partitions; the task reads the other one
    from the group's position and commits it to the group's cursor."""
    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    publish(liftbridge_client, stream_name, 3, partition=0)
    publish(liftbridge_client, stream_name, 4, partition=1)
    group = f"g-{stream_name}"
    support.reset()
    with liftbridge_client.group_consumer(group, [stream_name], auto_commit_interval=None) as other:
        assert other.assignments == {stream_name: [0, 1]}
        # The other member stays in the group while dag.test() runs: its keeper heartbeats for it.
        dag_run, result = run_dag(
            stream_name,
            read=ConsumerGroup(group),
            apply_function="tests.operators.consume_support.record_plain",
        )
    assert str(dag_run.state) == "success"
    assert result["group_id"] == group and len(result["partitions"]) == 1
    (mine,) = (int(p) for p in result["partitions"])
    assert sorted(o for _, o, _ in support.SEEN) == list(range([3, 4][mine]))
    assert liftbridge_client.fetch_cursor(f"__group:{group}", stream_name, mine) == [2, 3][mine]
    assert liftbridge_client.fetch_cursor(f"__group:{group}", stream_name, 1 - mine) == -1


@pytest.mark.parametrize("present", [5, 3])
def test_min_messages_defers_only_when_they_are_not_there(
    present: int, stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """min_messages=5, deferrable: with 5 there it reads at once, never deferred; with 3 it
    defers, and once two more arrive (published when the task is seen waiting on its trigger)
    the trigger resumes it and it reads all 5."""
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, present)
    support.reset()
    dag = make_dag(
        stream_name,
        apply_function="tests.operators.consume_support.record_plain",
        read=SinceLastRun("c", min_messages=5, poll_timeout=120),
        deferrable=True,
    )
    stop, deferred = threading.Event(), threading.Event()
    feeder = threading.Thread(
        target=publish_when_deferred, args=(dag.dag_id, liftbridge_client, stream_name, stop, deferred)
    )
    feeder.start()
    try:
        dag_run, result = run(dag)
    finally:
        stop.set()
        feeder.join()
    assert str(dag_run.state) == "success"
    assert deferred.is_set() is (present < 5)
    assert result["processed"] == 5 and sorted(o for _, o, _ in support.SEEN) == list(range(5))


def publish_when_deferred(
    dag_id: str, client: LiftbridgeClient, stream: str, stop: threading.Event, deferred: threading.Event
) -> None:
    """Publish two messages once the DAG's task has deferred (never, if it does not).

    A deferral is recognised by the task instance's ``next_method``, which Airflow sets when the
    task defers. Watching the state for "running, then deferred or queued" missed the running
    state when the task deferred within one poll (under load), and then nothing was published
    while dag.test() ran the trigger in line with no timeout: the test hung."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    while not stop.wait(0.05):
        with create_session() as session:
            resumes = session.query(TaskInstance.next_method).filter(TaskInstance.dag_id == dag_id).all()
        if any(method is not None for (method,) in resumes):
            deferred.set()
            publish(client, stream, 2, start=3)
            return


def test_min_messages_in_the_worker_outlasts_a_broker_restart(
    stream_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """min_messages=5, not deferrable, no retries: 2 are there, the task waits; the broker is
    killed while it waits (its looks fail: no broker reachable), started again, and 3 more are
    published. The failed looks are logged and repeated, and the task reads all 5: a look at the
    stream can only end the wait early, never fail the task."""
    import structlog

    server = DevServerProcess(tmp_path / "data").start()
    try:
        monkeypatch.setenv(conn_env_name("lb_restarting"), liftbridge_conn_json(server.address))
        with LiftbridgeClient(server.address) as client:
            client.create_stream(stream_name, stream_name)
            publish(client, stream_name, 2)
        support.reset()
        dag = make_dag(
            stream_name,
            liftbridge_conn_id="lb_restarting",
            apply_function="tests.operators.consume_support.record_plain",
            read=SinceLastRun("c", min_messages=5, poll_timeout=90),
            retries=0,
        )
        failed_looks: list[str] = []
        with structlog.testing.capture_logs() as logs:
            restarter = threading.Thread(target=restart_while_waiting, args=(server, stream_name, logs, failed_looks))
            restarter.start()
            try:
                dag_run, result = run(dag)
            finally:
                restarter.join(120)
    finally:
        server.close()
    assert str(dag_run.state) == "success"
    assert failed_looks, "no look at the stream failed while the broker was down"
    assert result["processed"] == 5 and sorted(o for _, o, _ in support.SEEN) == list(range(5))


def restart_while_waiting(server: DevServerProcess, stream: str, logs: list[Any], failed_looks: list[str]) -> None:
    """Once the task logs that it waits for min_messages: kill the broker, wait until the task
    logs a failed look, start the broker again and publish the 3 messages still missing."""

    def logged(words: str, timeout: float) -> dict[str, Any] | None:
        with bounded("the task's log line", timeout):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                found = next((e for e in list(logs) if words in str(e.get("event"))), None)
                if found is not None:
                    return found
                time.sleep(0.05)
            return None

    if logged("message(s) there: waiting up to", 60) is None:
        return  # the task never waited: the test fails on its result
    server.kill()
    try:
        failed = logged("looking for min_messages failed", 30)
        if failed is not None:
            failed_looks.append(str(failed.get("positional_args")))
    finally:
        server.start()
    with LiftbridgeClient(server.address) as client:
        publish(client, stream, 3, start=2)


def test_mapped_over_partitions_one_task_per_partition(stream_name: str, liftbridge_client: LiftbridgeClient) -> None:
    from airflow.sdk import DAG

    liftbridge_client.create_stream(stream_name, stream_name, partitions=2)
    publish(liftbridge_client, stream_name, 2, partition=0)
    publish(liftbridge_client, stream_name, 3, partition=1)
    support.reset()
    with DAG(f"mapped_{stream_name}", schedule=None, start_date=START) as dag:
        LiftbridgeConsumeOperator.partial(
            task_id="consume",
            stream=stream_name,
            read=SinceLastRun("c"),
            apply_function="tests.operators.consume_support.record_plain",
        ).expand(partitions=[[0], [1]])
    register_dag(dag)
    dag_run = dag.test()
    assert str(dag_run.state) == "success"
    assert [list(xcom_of(dag_run, "consume", i)["partitions"]) for i in (0, 1)] == [["0"], ["1"]]
    assert [xcom_of(dag_run, "consume", i)["processed"] for i in (0, 1)] == [2, 3]
    end_id, _ = plan_cursor_ids("c", f"{dag.dag_id}/consume/1")  # each mapped instance has its own plan
    assert liftbridge_client.fetch_cursor(end_id, stream_name, 1) == 3


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({}, "give exactly one of apply_function (called per message) and apply_function_batch"),
        ({"apply_function": print, "apply_function_batch": print}, "got both"),
        ({"apply_function": "no_such_pkg..handle"}, "apply_function='no_such_pkg..handle' is not valid"),
        ({"apply_function_batch": "json"}, "a callable or the dotted path of a function is required"),
        ({"batch_size": 0}, "batch_size=0 is not valid: a whole number, 1 or more"),
        ({"batch_size": -5}, "batch_size=-5 is not valid: a whole number, 1 or more"),
        ({"read": SinceLastRun("c", max_messages=0)}, "max_messages=0 is not valid: a whole number, 1 or more"),
        (
            {"commit_cadence": "sometimes"},
            "commit_cadence='sometimes' is not valid: use one of 'end_of_batch', 'end_of_operator', 'never'",
        ),
        ({"read": None}, "needs read=: what to read, e.g. read=SinceLastRun('orders-reader')"),
        ({"read": "c"}, "read='c' is not valid: a SinceLastRun, ConsumerGroup or DataInterval value"),
        ({"read": SinceLastRun("")}, "cursor_id='' is not valid"),
        ({"read": ConsumerGroup("g"), "partitions": [0]}, "with read=ConsumerGroup(...) the consumer group assigns"),
        ({"dead_letters": "dlq"}, "dead_letters='dlq' is not valid: a DeadLetterStream value or None"),
        ({"dead_letters": DeadLetterStream("")}, "dead_letters.stream='' is not valid"),
        ({"apply_function_args": "orders"}, "apply_function_args='orders' is not valid: a list of positional"),
        ({"apply_function_kwargs": ["a"]}, "apply_function_kwargs=['a'] is not valid: a dict of keyword arguments"),
        ({"partitions": "[0,"}, "partitions='[0,' is not valid: a list of partition numbers"),
        ({"value_format": "avro"}, "value_format='avro' is not valid: use one of 'bytes', 'text', 'json'"),
        (
            {"read": SinceLastRun("c", start_at="yesterday-ish")},
            "start_at='yesterday-ish' is not valid: a start position is an offset",
        ),
        ({"partitions": [0, -1]}, "partitions=[0, -1] is not valid: partition numbers are whole numbers, 0 or more"),
        ({"read": SinceLastRun("c", poll_timeout=0)}, "poll_timeout=0 is not valid: a positive number of seconds"),
    ],
)
def test_bad_arguments_fail_when_the_dag_is_parsed(kwargs: dict[str, Any], words: str) -> None:
    from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError

    args: dict[str, Any] = {"task_id": "c", "stream": "s", "read": SinceLastRun("c")}
    if not {"apply_function", "apply_function_batch"} & set(kwargs) and kwargs:
        args["apply_function"] = print
    with pytest.raises(LiftbridgeArgumentError) as info:
        LiftbridgeConsumeOperator(**(args | kwargs))
    assert words in str(info.value)


def test_templated_values_wait_for_rendering_and_times_parse() -> None:
    op = LiftbridgeConsumeOperator(
        task_id="c",
        stream="{{ params.stream }}",
        read=SinceLastRun("c", start_at="{{ params.start }}"),
        partitions="{{ params.partitions }}",
        apply_function=print,
    )
    assert op.partitions == "{{ params.partitions }}"
    assert parse_partitions("[0, 2]") == [0, 2] and parse_partitions("1, 0") == [0, 1] and parse_partitions(3) == [3]
    assert parse_reading_start("1700000000000ms") == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    assert parse_reading_start("new_only") is StartPosition.LATEST
    assert parse_reading_start("2024-06-01T00:00:00") == dt.datetime(2024, 6, 1, tzinfo=dt.UTC)


def test_a_retry_reads_the_rest_of_its_plan_without_waiting_for_min_messages(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    """min_messages=5 held for the first try; its retry has 2 left, and reads them at once."""
    liftbridge_client.create_stream(stream_name, stream_name)
    publish(liftbridge_client, stream_name, 5)
    support.reset(fail_at=3)
    dag_run, result = run_dag(
        stream_name,
        apply_function="tests.operators.consume_support.fail_at_offset",
        batch_size=2,
        read=SinceLastRun("c", min_messages=5, poll_timeout=30),
    )
    assert str(dag_run.state) == "success"
    assert [(t, o) for t, o, _ in support.SEEN] == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 3), (2, 4)]
    assert result["partitions"]["0"]["resumed"] is True
