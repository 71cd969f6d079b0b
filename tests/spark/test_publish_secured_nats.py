"""publish_dataframe from the standalone cluster's executors to a NATS that requires TLS (a private
CA) and a token: the NatsSecurity in the data-source options reaches every executor, each row
arrives; without the token the executors are refused, and the error says NATS authentication.

The CA file is referenced by absolute path: executors on this machine read it where the driver
wrote it (a real cluster ships it with ``spark.files`` or installs it on every node; docs/spark.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from airflow_provider_liftbridge.client import LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.devserver import DevServer, NatsServerSecurity
from airflow_provider_liftbridge.nats_security import NatsSecurity
from airflow_provider_liftbridge.spark import ConnectionSettings, SparkPublishError, publish_dataframe
from tests.tls_certs import SERVER_NAME, make_certs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]
TOKEN = "spark-t0ken-Secret"


@pytest.fixture(scope="module")
def secured_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevServer, NatsSecurity]]:
    certs = {name: str(path) for name, path in make_certs(tmp_path_factory.mktemp("spark-nats-certs")).items()}
    client = NatsSecurity(tls_ca_file=certs["ca"], tls_server_name=SERVER_NAME, token=TOKEN)
    server_side = NatsServerSecurity(
        tls_cert_file=certs["server"], tls_key_file=certs["server_key"], token=TOKEN, client=client
    )
    with DevServer(nats_security=server_side) as server:
        yield server, client


def test_executors_publish_to_tls_and_token_nats(
    spark: SparkSession, secured_server: tuple[DevServer, NatsSecurity], stream_name: str
) -> None:
    server, security = secured_server
    assert server.nats_url.startswith("tls://")
    with LiftbridgeClient(server.address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
    settings = ConnectionSettings(
        brokers=server.address, nats_servers=[server.nats_url], nats_security=security, timeout=10.0
    )
    rows = 3000
    df = spark.range(rows, numPartitions=3).select(F.col("id").alias("n"))

    summary = publish_dataframe(df, stream_name, settings=settings, options=PublishOptions(window=128))

    assert (summary.count, summary.acknowledged, summary.extra["spark_partitions"]) == (rows, rows, 3)
    seen: list[int] = []
    with LiftbridgeClient(server.address) as client:
        for partition in (0, 1):
            high = client.fetch_partition_metadata(stream_name, partition).high_watermark
            if high >= 0:
                messages = client.subscribe(stream_name, partition=partition, start_at=0, stop_at=high)
                seen += [json.loads(m.value)["n"] for m in messages]
    assert sorted(seen) == list(range(rows))

    # The same publish with TLS but without the token: every executor is refused by NATS.
    bare = replace(settings, nats_security=replace(security, token=None))
    with pytest.raises(SparkPublishError) as caught:
        publish_dataframe(df, stream_name, settings=bare, options=PublishOptions(window=128))
    message = str(caught.value)
    assert "NATS" in message and "refused the credentials" in message, message
    assert TOKEN not in message
    with LiftbridgeClient(server.address) as client:
        assert sum(client.fetch_partition_metadata(stream_name, p).newest_offset + 1 for p in (0, 1)) == rows
