"""The path of a NATS publish from the operator to the socket (issue 27): at most six files, each
entered once, none of them a client facade, and one thread switch, inside one transport module.
``docs/architecture.md`` writes the path down; this test holds the code to it.

The operator runs as the other operator tests run it (``execute`` with a real hook, client, dev
server and nats-server); the call path is recorded with a profile function (``tests/call_path.py``).
"""

from __future__ import annotations

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, PublishOptions
from airflow_provider_liftbridge.operators.publish import LiftbridgePublishOperator
from tests.call_path import follow

pytestmark = pytest.mark.usefixtures("liftbridge_conn")

#: Where the frames are handed to nats-py, which writes them to the socket.
SOCKET = ("nats_adapter.py", "publish_burst")
FACADES = ("client/sync_client.py", "client/async_client.py")


def test_a_nats_publish_reaches_the_socket_through_six_files_without_a_return_trip(
    stream_name: str, liftbridge_client: LiftbridgeClient
) -> None:
    liftbridge_client.create_stream(stream_name, stream_name)
    op = LiftbridgePublishOperator(
        task_id="p", stream=stream_name, records=[b"a", b"b"], options=PublishOptions(path="nats")
    )
    with follow(*SOCKET, within=("operators/publishing_base.py", "send_records")) as call:
        summary = op.execute({})
    assert summary["acknowledged"] == 2
    assert call.path and call.path[-1] == SOCKET, call.path
    # From the operator's publish: Airflow enters the operator through execute (operators/base.py,
    # which makes the client and calls run); the publishing operator's run and publish follow.
    files = call.files[call.files.index("operators/publishing_base.py") :]
    assert files == [
        "operators/publishing_base.py",
        "client/publishing/publisher.py",
        "client/transport/sync.py",
        "client/publishing/batch.py",
        "client/publishing/nats_engine.py",
        "nats_adapter.py",
    ], call.path
    assert not set(FACADES) & set(call.files), call.path
    assert call.switch == ("client/transport/sync.py", "client/transport/sync.py"), call.switch
    assert not call.return_trips, call.return_trips[:5]
