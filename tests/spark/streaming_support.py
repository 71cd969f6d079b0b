"""Helpers of the Structured Streaming tests: publish values, start a source, run a query to the end,
edit a checkpoint as a crash would leave it."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from airflow_provider_liftbridge.client import LiftbridgeClient, Record
from airflow_provider_liftbridge.spark import ConnectionSettings, to_options

Row3 = tuple[int, int, str]  # partition, offset, value


def publish(lb_address: str, stream: str, values: range, partitions: int) -> None:
    """Publish ``str(i)`` for i in values, i-th value to partition i % partitions."""
    records = [Record(value=str(i).encode(), partition=i % partitions) for i in values]
    with LiftbridgeClient(lb_address) as client:
        client.publish_many(stream, records)


def read_all(lb_address: str, stream: str, partitions: int) -> list[bytes]:
    values = []
    with LiftbridgeClient(lb_address) as client:
        for p in range(partitions):
            high = client.fetch_partition_metadata(stream, p).high_watermark
            if high >= 0:
                values += [m.value for m in client.subscribe(stream, partition=p, start_at=0, stop_at=high)]
    return values


def source(spark: SparkSession, settings: ConnectionSettings, stream: str, **options: str) -> DataFrame:
    return (
        spark.readStream.format("liftbridge")
        .options(**to_options(settings))
        .option("stream", stream)
        .options(**options)
        .load()
    )


def run_available_now(df: DataFrame, checkpoint: Path) -> dict[int, list[Row3]]:
    """Run the query to the end with Trigger.AvailableNow; the rows of each micro-batch by batch id."""
    batches: dict[int, list[Row3]] = {}

    def collect(batch: DataFrame, batch_id: int) -> None:
        rows = batch.select("partition", "offset", "value").collect()
        batches[batch_id] = sorted((r.partition, r.offset, bytes(r.value).decode()) for r in rows)

    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive
    return batches


def forget_last_commit(checkpoint: Path) -> int:
    """Make Spark replay the last micro-batch on restart, as after a crash between the sink's
    write and the commit log: remove the batch's commit entry (the offset log keeps it)."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]
    (checkpoint / "commits" / str(last)).unlink()
    crc = checkpoint / "commits" / f".{last}.crc"
    if crc.exists():
        crc.unlink()
    return last


def assert_each_message_once(batches: dict[int, list[Row3]], messages: int, partitions: int) -> None:
    """The batches hold values 0..messages-1 once each, and every partition's offsets without a gap."""
    delivered = [row for rows in batches.values() for row in rows]
    assert sorted(int(v) for _, _, v in delivered) == list(range(messages))
    for p in range(partitions):
        assert sorted(o for q, o, _ in delivered if q == p) == list(range(messages // partitions))


def rewrite_last_offsets(checkpoint: Path, offset_json: str) -> None:
    """Replace the source offset of the checkpoint's last micro-batch, as an older source version
    (or a hand-edited checkpoint) would have written it."""
    logs = sorted((p for p in (checkpoint / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    lines = logs[-1].read_text().splitlines()
    logs[-1].write_text("\n".join([*lines[:-1], offset_json]))
    crc = checkpoint / "offsets" / f".{logs[-1].name}.crc"
    if crc.exists():
        crc.unlink()


def values_read(batches: dict[int, list[Row3]]) -> list[int]:
    """Every value the batches delivered, as integers, sorted."""
    return sorted(int(v) for rows in batches.values() for _, _, v in rows)
