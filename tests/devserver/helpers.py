"""Helpers of the dev-server tests: Subscribe collection, stream creation, status checks over raw stubs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from tests import margins

TIMEOUT = 5.0


@dataclass
class SubResult:
    """What a Subscribe call produced: every message (handshake included) and how it ended."""

    messages: list[pb.Message] = field(default_factory=list)
    code: grpc.StatusCode | None = None
    details: str = ""

    @property
    def handshake(self) -> bool:
        return bool(self.messages) and self.messages[0].ByteSize() == 0

    @property
    def data(self) -> list[pb.Message]:
        """Messages after the handshake."""
        return self.messages[1:] if self.handshake else self.messages

    @property
    def offsets(self) -> list[int]:
        return [m.offset for m in self.data]


def subscribe(
    stub: api_pb2_grpc.APIStub, req: pb.SubscribeRequest, *, count: int | None = None, timeout: float = TIMEOUT
) -> SubResult:
    """Run Subscribe until it ends, or until ``count`` data messages arrived (then cancel).

    With a ``count``, the margin report (tests/margins.py) notes how much of ``timeout`` it took;
    without one, a subscription that runs out is what the test asked for (nothing more came)."""
    result = SubResult()
    where, start = margins.caller(), time.monotonic()
    call = stub.Subscribe(req, timeout=timeout)
    try:
        for msg in call:
            result.messages.append(msg)
            if count is not None and len(result.data) >= count:
                call.cancel()
                break
    except grpc.RpcError as err:
        result.code, result.details = err.code(), err.details()
    timed_out = result.code == grpc.StatusCode.DEADLINE_EXCEEDED
    if count is not None or not timed_out:
        margins.record(f"subscribe ({where})", time.monotonic() - start, timeout, timed_out=timed_out)
    return result


def user_streams(resp: pb.FetchMetadataResponse) -> list[pb.StreamMetadata]:
    """The streams of a FetchMetadata answer without the server's internal ones (``__cursors``)."""
    return [s for s in resp.streamMetadata if not s.name.startswith("__")]


def create(stub: api_pb2_grpc.APIStub, name: str, **kwargs: object) -> None:
    """CreateStream with the name as subject unless ``subject`` is given."""
    kwargs.setdefault("subject", name)
    stub.CreateStream(pb.CreateStreamRequest(name=name, **kwargs), timeout=TIMEOUT)  # type: ignore[arg-type]


def known_everywhere(stubs: list[api_pb2_grpc.APIStub], stream: str, timeout: float = TIMEOUT) -> None:
    """Wait until every broker lists ``stream``: in cluster mode a new stream reaches the brokers
    other than the creating one a moment later, as on a real cluster (and each broker's
    FetchMetadata has then surveyed the others, as a real broker caches)."""

    def everywhere() -> bool:
        req = pb.FetchMetadataRequest(streams=[stream])
        return not any(stub.FetchMetadata(req, timeout=TIMEOUT).streamMetadata[0].error for stub in stubs)

    margins.wait_until(everywhere, timeout, "stream on every broker", where=margins.caller())


def publish(stub: api_pb2_grpc.APIStub, stream: str, value: bytes, **kwargs: object) -> pb.PublishResponse:
    """Publish with a deadline (so LEADER/ALL wait for the ack)."""
    return stub.Publish(pb.PublishRequest(stream=stream, value=value, **kwargs), timeout=TIMEOUT)  # type: ignore[arg-type]


def partition_meta(stub: api_pb2_grpc.APIStub, stream: str, partition: int = 0) -> pb.PartitionMetadata:
    req = pb.FetchPartitionMetadataRequest(stream=stream, partition=partition)
    return stub.FetchPartitionMetadata(req, timeout=TIMEOUT).metadata


def rpc_error(fn: object, *args: object, **kwargs: object) -> grpc.RpcError:
    """Call ``fn`` and return the RpcError it must raise."""
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    return info.value


def subscribe_while(
    stub: api_pb2_grpc.APIStub,
    req: pb.SubscribeRequest,
    action: Callable[[], object],
    *,
    count: int | None = None,
    settle: float = 0.3,
    timeout: float = TIMEOUT,
) -> SubResult:
    """Subscribe on a thread, run ``action`` once the subscriber had ``settle`` seconds to start
    waiting, and return what the subscription got when it ended. The subscription's deadline,
    ``timeout``, runs from its start, so it covers ``action`` too: an action of many calls needs
    more than the default."""
    result: list[SubResult] = []
    thread = threading.Thread(target=lambda: result.append(subscribe(stub, req, count=count, timeout=timeout)))
    thread.start()
    time.sleep(settle)
    action()
    thread.join(timeout)
    assert result, "the subscription did not end in time"
    return result[0]
