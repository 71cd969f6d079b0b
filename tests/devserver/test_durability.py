"""Durability: a clean restart keeps everything; a SIGKILL in the middle of writing loses nothing that was acked."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import grpc

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message, unmarshal_ack
from airflow_provider_liftbridge.devserver import DevServer, DevServerProcess

from .helpers import TIMEOUT, create, partition_meta, publish, subscribe, user_streams


def _stub(address: str) -> tuple[grpc.Channel, api_pb2_grpc.APIStub]:
    ch = grpc.insecure_channel(address)
    return ch, api_pb2_grpc.APIStub(ch)


def _values(stub: api_pb2_grpc.APIStub, stream: str, partition: int = 0) -> list[bytes]:
    req = pb.SubscribeRequest(
        stream=stream, partition=partition, startPosition=pb.EARLIEST, stopPosition=pb.STOP_LATEST
    )
    return [m.value for m in subscribe(stub, req, timeout=30).data]


def test_clean_restart_keeps_streams_messages_cursors_and_flags(tmp_path: Path) -> None:
    with DevServer(data_dir=tmp_path) as srv:
        ch, stub = _stub(srv.address)
        create(stub, "keep", partitions=3, optimisticConcurrencyControl=pb.NullableBool(value=True))
        for i in range(10):
            publish(stub, "keep", b"v%d" % i, partition=i % 2, expectedOffset=-1)
        stub.PauseStream(pb.PauseStreamRequest(name="keep", partitions=[2]), timeout=TIMEOUT)
        stub.SetStreamReadonly(pb.SetStreamReadonlyRequest(name="keep", partitions=[1], readonly=True), timeout=TIMEOUT)
        stub.SetCursor(pb.SetCursorRequest(stream="keep", partition=0, cursorId="c", offset=3), timeout=TIMEOUT)
        create(stub, "gone")
        stub.DeleteStream(pb.DeleteStreamRequest(name="gone"), timeout=TIMEOUT)
        before = stub.FetchMetadata(pb.FetchMetadataRequest(streams=["keep"]), timeout=TIMEOUT).streamMetadata[0]
        ch.close()
    with DevServer(data_dir=tmp_path) as srv:
        ch, stub = _stub(srv.address)
        after = user_streams(stub.FetchMetadata(pb.FetchMetadataRequest(), timeout=TIMEOUT))
        assert [s.name for s in after] == ["keep"]
        assert after[0] == before  # subject, creation time, offsets, leaders, flags, timestamps
        assert _values(stub, "keep", 0) == [b"v%d" % i for i in range(0, 10, 2)]
        assert _values(stub, "keep", 1) == [b"v%d" % i for i in range(1, 10, 2)]
        assert partition_meta(stub, "keep", 1).readonly is True
        assert after[0].partitions[2].paused is True
        cursor = pb.FetchCursorRequest(stream="keep", partition=0, cursorId="c")
        assert stub.FetchCursor(cursor, timeout=TIMEOUT).offset == 3
        # Offsets go on where they stopped, and OCC is still on.
        assert publish(stub, "keep", b"next", expectedOffset=5).ack.offset == 5
        err = None
        try:
            publish(stub, "keep", b"stale", expectedOffset=5)
        except grpc.RpcError as exc:
            err = exc
        assert err is not None and err.code() == grpc.StatusCode.UNKNOWN
        ch.close()


def test_sigkill_mid_publish_loses_no_acked_record(tmp_path: Path) -> None:
    """Publishers over gRPC and over NATS write while the server is SIGKILLed; every acked record survives."""
    proc = DevServerProcess(tmp_path)
    with proc:
        ch, stub = _stub(proc.address)
        create(stub, "crash", partitions=2)
        grpc_acked: list[bytes] = []
        nats_acked: list[bytes] = []
        stop = threading.Event()

        def grpc_writer() -> None:
            i = 0
            while not stop.is_set():
                value = b"g%06d" % i
                try:
                    publish(stub, "crash", value, partition=0)
                except grpc.RpcError:
                    return
                grpc_acked.append(value)
                i += 1

        async def nats_writer() -> None:
            nc = await nats_adapter.connect(proc.nats_url, allow_reconnect=False)
            inbox = nc.new_inbox()
            sub = await nc.subscribe(inbox)
            sent: dict[str, bytes] = {}

            async def read_acks() -> None:
                async for msg in sub.messages:
                    ack = unmarshal_ack(msg.data)
                    nats_acked.append(sent[ack.correlationId])

            reader = asyncio.create_task(read_acks())
            i = 0
            try:
                while not stop.is_set():
                    # A windowed publisher: at most 1,000 messages in flight.
                    while i - len(nats_acked) >= 1000 and not stop.is_set():
                        await asyncio.sleep(0.001)
                    for _ in range(100):
                        value = b"n%06d" % i
                        sent[str(i)] = value
                        await nc.publish("crash.1", new_message(value, ack_inbox=inbox, correlation_id=str(i)))
                        i += 1
                    await nc.flush(timeout=2)
            except Exception:
                pass  # the server went away
            await asyncio.sleep(0.2)
            reader.cancel()
            try:
                await nc.close()
            except Exception:
                pass

        threads = [
            threading.Thread(target=grpc_writer),
            threading.Thread(target=lambda: asyncio.run(nats_writer())),
        ]
        for t in threads:
            t.start()
        while len(grpc_acked) < 50 or len(nats_acked) < 3000:
            threading.Event().wait(0.05)
        proc.kill()
        stop.set()
        for t in threads:
            t.join(30)
        ch.close()
        assert grpc_acked and nats_acked

        proc.start()  # same ports, same data directory
        ch, stub = _stub(proc.address)
        stored0 = _values(stub, "crash", 0)
        stored1 = _values(stub, "crash", 1)
        # No corruption: offsets are contiguous values in publish order, and every acked one is there.
        assert stored0[: len(grpc_acked)] == grpc_acked
        assert stored0 == [b"g%06d" % i for i in range(len(stored0))]
        assert set(nats_acked) <= set(stored1)
        assert stored1 == sorted(stored1) and len(set(stored1)) == len(stored1)
        # The log takes new writes after recovery.
        assert publish(stub, "crash", b"after", partition=0).ack.offset == len(stored0)
        ch.close()
