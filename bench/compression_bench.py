"""Publishing JSON-like records with and without compression: throughput and bytes on the wire.

    .venv/bin/python bench/compression_bench.py [--records 20000] [--rounds 3] [--path nats|grpc]

Records are JSON objects of about 600 bytes shaped like an orders table (ids, names, repeated
enums, a free-text note), the kind of rows files and Spark publish. For each variant (none, gzip,
zstd) the script publishes the same records through ``publish_many`` on a dev server in its own
process, variants interleaved ``--rounds`` times, keeping each variant's fastest run. "Bytes on the
wire" is the sum of the enveloped messages' sizes (value + headers + envelope), what NATS carries;
the rate includes compressing (``publish_many(..., compression=...)``). Prints one markdown table and the machine line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import machine  # noqa: E402

from airflow_provider_liftbridge._proto import api_pb2  # noqa: E402
from airflow_provider_liftbridge.client import LiftbridgeClient, Record  # noqa: E402
from airflow_provider_liftbridge.client.compression import compress_record, compressor  # noqa: E402
from airflow_provider_liftbridge.codec import encode_message  # noqa: E402
from airflow_provider_liftbridge.devserver import DevServerProcess  # noqa: E402

VARIANTS = (None, "gzip", "zstd")
_WORDS = "order shipped delayed refund customer premium standard express warehouse berlin paris lyon".split()


def json_rows(n: int, seed: int = 1) -> list[bytes]:
    """``n`` JSON records of about 600 bytes, deterministic."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        row = {
            "order_id": 10_000_000 + i,
            "customer": {"id": rng.randrange(100_000), "name": f"customer-{rng.randrange(100_000)}", "tier": "premium"},
            "status": rng.choice(["created", "paid", "shipped", "delivered"]),
            "currency": "EUR",
            "lines": [
                {
                    "sku": f"SKU-{rng.randrange(5000):05d}",
                    "qty": rng.randrange(1, 5),
                    "price": round(rng.uniform(1, 99), 2),
                }
                for _ in range(4)
            ],
            "note": " ".join(rng.choice(_WORDS) for _ in range(20)),
            "created_at": f"2026-11-{rng.randrange(1, 29):02d}T{rng.randrange(24):02d}:00:00Z",
        }
        rows.append(json.dumps(row).encode())
    return rows


def wire_bytes(records: list[Record], stream: str) -> int:
    """What NATS carries for these records: the enveloped Message of each."""
    total = 0
    for r in records:
        msg = api_pb2.Message(value=r.value, key=r.key or b"", headers=dict(r.headers or {}), ackInbox="_INBOX.x" * 3)
        msg.correlationId = uuid.uuid4().hex
        msg.subject = stream
        total += len(encode_message(msg))
    return total


def publish(client: LiftbridgeClient, rows: list[bytes], codec: str | None, path: str) -> tuple[float, int]:
    stream = f"bench-compress-{uuid.uuid4().hex[:8]}"
    client.create_stream(stream, stream)
    started = time.perf_counter()
    acks = client.publish_many(stream, rows, path=path, compression=codec)  # type: ignore[arg-type]
    seconds = time.perf_counter() - started
    assert len(acks) == len(rows)
    client.delete_stream(stream)
    squeeze = compressor(codec)  # the same records again, to count what went on the wire
    records = [Record(v) for v in rows]
    if squeeze is not None:
        records = [compress_record(r, squeeze, codec or "") for r in records]
    return len(rows) / seconds, wire_bytes(records, stream)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--path", choices=("nats", "grpc"), default="nats")
    args = parser.parse_args()
    rows = json_rows(args.records)
    raw = sum(map(len, rows))
    best: dict[str | None, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data_dir=data) as srv:
        with LiftbridgeClient(srv.address, nats_servers=[srv.nats_url], timeout=30) as client:
            for r in range(args.rounds):
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
                for codec in order:
                    rate, wire = publish(client, rows, codec, args.path)
                    if codec not in best or rate > best[codec][0]:
                        best[codec] = (rate, wire)
    base_rate, base_wire = best[None]
    print(f"records: {args.records} JSON rows, {raw / args.records:.0f} bytes each on average; path {args.path}")
    print("| compression | records/s | ratio | bytes on the wire | per record | wire ratio |")
    print("|---|---|---|---|---|---|")
    for codec in VARIANTS:
        rate, wire = best[codec]
        print(
            f"| {codec or 'none'} | {rate:,.0f} | {rate / base_rate:.2f}x | {wire:,} | {wire / args.records:.0f} B |"
            f" {base_wire / wire:.2f}x smaller |"
        )
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
