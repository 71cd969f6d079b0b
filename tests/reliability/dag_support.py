"""Record source of the reliability DAG: on the first try it dies part-way (``EO_FAULT``:
``exit`` ends the process with ``os._exit``, ``raise`` raises), later tries yield everything."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def records(n: int) -> Iterator[bytes]:
    """``n`` payloads ``rec-000000``...; the first try (no marker file yet) dies at ``EO_CRASH_AT``."""
    marker = Path(os.environ["EO_MARKER"])
    first_try = not marker.exists()
    if first_try:
        marker.write_text("first try started\n")
    crash_at = int(os.environ.get("EO_CRASH_AT", "-1"))
    for i in range(n):
        if first_try and i == crash_at:
            if os.environ.get("EO_FAULT") == "exit":
                os._exit(137)  # the process dies: no exception handler, no cleanup, no task state update
            raise RuntimeError(f"injected failure after {i} records")
        yield f"rec-{i:06d}".encode()


#: Offsets the apply function below was shown, in order (the trigger tests read it).
SEEN: list[int] = []


def note_and_match(message: object, target: str) -> bool:
    """Apply function for the trigger tests: remember the offset, match the value ``target``."""
    SEEN.append(message.offset)  # type: ignore[attr-defined]
    return message.value == target.encode()  # type: ignore[attr-defined]


def kill_first_try_after_file(entry: dict[str, object], after: int) -> None:
    """``on_file`` of the archive DAG: on the first try (no ``EO_MARKER`` file yet), SIGKILL this
    process once ``after`` files are complete: the last one renamed into place, its position not
    committed. Records each file it is shown in ``EO_MARKER`` (one line per file)."""
    marker = Path(os.environ["EO_MARKER"])
    lines = marker.read_text().splitlines() if marker.exists() else []
    first_try = not lines or lines[0] != "retry"
    if first_try:
        lines.append(str(entry["path"]))
        marker.write_text("\n".join(lines) + "\n")
        if len(lines) == after:
            marker.write_text("retry\n" + "\n".join(lines) + "\n")  # the next process is the retry
            os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup, no task state update


def note_batch(messages: list[object]) -> None:
    """``apply_function_batch`` of the campaign's consume DAG: append ``partition offset`` of each
    message to the file ``EO_SEEN``."""
    with open(os.environ["EO_SEEN"], "a") as seen:
        seen.writelines(f"{m.partition} {m.offset}\n" for m in messages)  # type: ignore[attr-defined]


#: What ``records_replacing_history`` needs of its test: ``cluster`` (a ``DevServer``), ``stream``;
#: it and ``rows_held_after_the_first_group`` count their calls (the task's tries) in ``tries``.
HISTORY: dict[str, object] = {}


def records_replacing_history(n: int, first: int, keep_to: int) -> Iterator[bytes]:
    """``n`` payloads; on the first try, once the first ``first`` are committed (the exactly-once
    publisher reads a batch only once every ack of the batch before is in), a follower of partition
    0 cuts its log after ``keep_to`` and leads (the dev server's ``replace_history``): the
    publisher's next batch meets a replaced history. Later tries replace nothing."""
    from airflow_provider_liftbridge.client import LiftbridgeClient
    from airflow_provider_liftbridge.devserver import DevServer
    from tests.margins import wait_until

    cluster, stream = HISTORY["cluster"], str(HISTORY["stream"])
    assert isinstance(cluster, DevServer)
    tries = HISTORY["tries"] = int(HISTORY.get("tries", 0)) + 1  # type: ignore[call-overload]
    for i in range(n):
        if i == first and tries == 1:
            with LiftbridgeClient(cluster.addresses, timeout=5.0) as client:
                wait_until(
                    lambda c=client: c.fetch_partition_metadata(stream, 0).high_watermark == first - 1,  # type: ignore[misc]
                    60.0,
                    "the first records committed",
                    interval=0.05,
                )
                part = client.fetch_metadata([stream]).streams[stream].partitions[0]
            follower = next(r for r in part.replicas if r != part.leader)
            cluster.replace_history(stream, 0, cluster.broker_ids.index(follower), keep_to)
        yield f"rec-{i:06d}".encode()


def rows_held_after_the_first_group(spark: Any, rest: int, flag: str, hold: float) -> Any:
    """``dataframe_callable`` of the Spark replaced-history DAG: one Spark partition whose first
    group of rows (``spark.publish.GROUP_ROWS`` rounded up to whole Arrow batches of the session,
    ``spark.sql.execution.arrow.maxRecordsPerBatch``: ``HISTORY["first_group"]``) reaches the
    publishing Python worker while ``rest`` more rows wait, at most ``hold`` seconds, for the file
    ``flag``. Values ``r000000``...; counts its calls in ``HISTORY["tries"]``.

    Spark ends a full Arrow batch only once it has the row after it (its ``BatchIterator`` asks
    ``hasNext`` first), so the JVM's part (``range``) holds one row more than the first group; the
    Python source of the rest starts once those are read (``coalesce(1)`` reads the union's parts
    in turn) and waits before it writes anything, so nothing sits in its output buffer meanwhile.

    :raises TimeoutError: (in the Spark task) no ``flag`` within ``hold`` seconds.
    """
    from pyspark.sql import functions as F

    from airflow_provider_liftbridge.spark.publish import GROUP_ROWS

    batch = int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch"))
    if batch <= 0:
        raise ValueError("needs Arrow batches of a bounded size: spark.sql.execution.arrow.maxRecordsPerBatch > 0")
    first = -(-GROUP_ROWS // batch) * batch  # the worker's first group: whole batches, GROUP_ROWS or more
    HISTORY["tries"] = int(HISTORY.get("tries", 0)) + 1  # type: ignore[call-overload]
    HISTORY["first_group"] = first
    jvm_rows = first + 1

    def held(batches: Iterator[Any]) -> Iterator[Any]:
        # Pickled by value (a nested function): the Python worker needs no import of tests/.
        import time

        import pyarrow as pa

        for _ in batches:  # the one row of range(1): the source's only input
            pass
        deadline = time.monotonic() + hold
        while not os.path.exists(flag):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {flag} within {hold} s: the test did not release the rest")
            time.sleep(0.05)
        yield pa.RecordBatch.from_pydict(
            {"value": [f"r{i:06d}".encode() for i in range(jvm_rows, first + rest)]},
            schema=pa.schema([("value", pa.binary())]),
        )

    value = F.format_string("r%06d", "id").cast("binary").alias("value")
    jvm_part = spark.range(jvm_rows, numPartitions=1).select(value)
    python_part = spark.range(1, numPartitions=1).mapInArrow(held, "value binary")
    return jvm_part.union(python_part).coalesce(1)
