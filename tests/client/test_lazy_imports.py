"""What a process that only reads over gRPC imports of the client (issue 57): Spark's read planner
and readers are fresh Python processes, and each import of nats-py or the publishing engines there
is paid again. Each check runs in a new interpreter, so modules this test run imported do not count.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Imported only where a batch is published, a consumer group joined or the asyncio client made.
HEAVY = [
    "nats",
    "airflow_provider_liftbridge.nats_adapter",
    "airflow_provider_liftbridge.client.publishing.batch",
    "airflow_provider_liftbridge.client.publishing.nats_engine",
    "airflow_provider_liftbridge.client.async_client",
]

PROBE = """
import json, sys
{statements}
print(json.dumps(sorted(m for m in sys.modules if m in {heavy!r})))
"""


def heavy_modules_after(statements: str) -> list[str]:
    """The modules of ``HEAVY`` a new interpreter holds after running ``statements``."""
    code = PROBE.format(statements=statements, heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    loaded: list[str] = json.loads(result.stdout)
    return loaded


@pytest.mark.parametrize(
    "statements",
    [
        "import airflow_provider_liftbridge.client",
        "from airflow_provider_liftbridge.client import LiftbridgeClient, ConnectionSettings, MessageColumns",
        # What a read does: a client, metadata, a subscription (no server: the client connects lazily).
        "from airflow_provider_liftbridge.client import LiftbridgeClient\n"
        "client = LiftbridgeClient('127.0.0.1:1', nats_servers=['nats://127.0.0.1:2'])\nclient.close()",
    ],
)
def test_reading_imports_no_nats_and_no_publishing_engine(statements: str) -> None:
    assert heavy_modules_after(statements) == []


def test_the_public_names_still_import() -> None:
    import airflow_provider_liftbridge.client as client

    for name in client.__all__:
        assert getattr(client, name) is not None, name
    assert set(client.__all__) <= set(dir(client))
    with pytest.raises(AttributeError):
        _ = client.NoSuchName  # type: ignore[attr-defined]


def test_publishing_a_batch_imports_the_engines_on_first_use() -> None:
    loaded = heavy_modules_after(
        "from airflow_provider_liftbridge.client import LiftbridgeClient\n"
        "client = LiftbridgeClient('127.0.0.1:1', nats_servers=['nats://127.0.0.1:2'])\n"
        "client.batch_publisher('orders')\nclient.close()"
    )
    assert "airflow_provider_liftbridge.client.publishing.nats_engine" in loaded and "nats" in loaded
