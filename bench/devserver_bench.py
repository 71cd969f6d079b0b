"""Throughput and CPU cost of the dev server: Publish, PublishAsync, Subscribe and NATS enveloped ingest with acks.

The server runs in its own process (``DevServerProcess``) so it does not share the GIL with the
load generator in this one. Values are 100 bytes. For every path the table gives the rate, and the
CPU time spent per message by the dev server process, by its nats-server child and by this (load)
process, all threads included (psutil). The server's µs/msg is the figure to watch: the rate
depends on the two shared cores, the CPU cost much less. With ``--rounds N`` each path runs N
times and the fastest run is kept.

    .venv/bin/python bench/devserver_bench.py [--messages 50000] [--publish-messages 3000] [--rounds 1]
    .venv/bin/python bench/devserver_bench.py --only subscribe --py-spy /tmp/sub.svg   # profile the server
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import hpack
import nats
import psutil

from airflow_provider_liftbridge._proto import api_pb2 as pb
from airflow_provider_liftbridge._proto import api_pb2_grpc
from airflow_provider_liftbridge.codec import new_message
from airflow_provider_liftbridge.devserver import DevServerProcess

VALUE = b"x" * 100
PATHS = ("publish", "async", "async-raw", "subscribe", "nats")
_H2_HEAD = struct.Struct(">BHBBI")


def _identity(b: bytes) -> bytes:
    return b


def bench_publish(channel: grpc.Channel, stream: str, n: int) -> None:
    """Sequential Publish calls, each waiting for its LEADER ack."""
    stub = api_pb2_grpc.APIStub(channel)
    req = pb.PublishRequest(stream=stream, value=VALUE)
    for _ in range(n):
        stub.Publish(req, timeout=10)


def bench_publish_async(channel: grpc.Channel, stream: str, n: int) -> None:
    """One PublishAsync stream; requests pre-serialized so the client spends little per message."""
    call = channel.stream_stream(
        "/proto.API/PublishAsync", request_serializer=_identity, response_deserializer=_identity
    )
    reqs = [pb.PublishRequest(stream=stream, value=VALUE, correlationId=str(i)).SerializeToString() for i in range(n)]

    def gen() -> Iterator[bytes]:
        yield from reqs

    count = sum(1 for _ in call(gen(), timeout=600))
    if count != n:
        raise RuntimeError(f"PublishAsync returned {count} responses for {n} requests")


def _h2_frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return _H2_HEAD.pack(len(payload) >> 16, len(payload) & 0xFFFF, ftype, flags, sid) + payload


class _RawWindows:
    """The server's flow-control windows and frame-size limit, as a sending thread must respect them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.conn = self.stream = 65_535
        self.max_frame = 16_384
        self.settings_seen = False

    def take(self, wanted: int) -> int:
        """Block until some window is open; return how many bytes (≤ ``wanted``) may be sent now."""
        with self.cond:
            self.cond.wait_for(lambda: self.settings_seen and min(self.conn, self.stream) > 0)
            size = min(wanted, self.conn, self.stream, self.max_frame)
            self.conn -= size
            self.stream -= size
            return size

    def update(self, *, conn: int = 0, stream: int = 0, max_frame: int | None = None, seen: bool = False) -> None:
        with self.cond:
            self.conn += conn
            self.stream += stream
            if max_frame is not None:
                self.max_frame = max_frame
            self.settings_seen = self.settings_seen or seen
            self.cond.notify_all()


def bench_publish_async_raw(address: str, stream: str, n: int, per_write: int = 256) -> None:
    """One PublishAsync stream from a bare HTTP/2 client that writes ``per_write`` requests at a time
    (in as few DATA frames as the server's frame size allows, within its flow-control windows), as a
    client that coalesces its writes does: what the server can take when the client is not the
    limit. Python gRPC clients send one frame per request."""
    host, port = address.rsplit(":", 1)
    headers = hpack.Encoder().encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/proto.API/PublishAsync"),
            (":authority", address),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    big = (1 << 31) - 1  # our receive windows wide open: the client never has to send WINDOW_UPDATE
    start = [
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        _h2_frame(4, 0, 0, struct.pack(">HI", 4, big)),
        _h2_frame(8, 0, 0, struct.pack(">I", big - 65_535)),
        _h2_frame(1, 4, 1, headers),
    ]
    reqs = [pb.PublishRequest(stream=stream, value=VALUE, correlationId=str(i)).SerializeToString() for i in range(n)]
    chunks = [
        b"".join(struct.pack(">BI", 0, len(r)) + r for r in reqs[i : i + per_write]) for i in range(0, n, per_write)
    ]
    windows = _RawWindows()
    with socket.create_connection((host, int(port))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        lock = threading.Lock()  # the reader acknowledges SETTINGS and PINGs while the sender writes

        def send(data: bytes) -> None:
            with lock:
                sock.sendall(data)

        def sender() -> None:
            for i, chunk in enumerate(chunks):
                frames, pos = [], 0
                while pos < len(chunk):
                    size = windows.take(len(chunk) - pos)
                    last = i == len(chunks) - 1 and pos + size == len(chunk)
                    frames.append(_h2_frame(0, 1 if last else 0, 1, chunk[pos : pos + size]))
                    pos += size
                send(b"".join(frames))

        send(b"".join(start))
        writer = threading.Thread(target=sender)
        writer.start()
        decoder = hpack.Decoder()
        buf, grpc_buf, responses, status = bytearray(), bytearray(), 0, None
        while status is None:
            data = sock.recv(1 << 20)
            if not data:
                break
            buf += data
            pos = 0
            while len(buf) - pos >= 9:
                hi, lo, ftype, flags, sid = _H2_HEAD.unpack_from(buf, pos)
                length = (hi << 16) | lo
                if len(buf) - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9 : pos + 9 + length])
                pos += 9 + length
                if ftype == 0 and sid == 1:  # DATA: count the gRPC messages in it
                    grpc_buf += payload
                    p = 0
                    while len(grpc_buf) - p >= 5:
                        size = struct.unpack_from(">I", grpc_buf, p + 1)[0]
                        if len(grpc_buf) - p - 5 < size:
                            break
                        p += 5 + size
                        responses += 1
                    del grpc_buf[:p]
                elif ftype == 1:  # HEADERS: decoded to keep the HPACK table in step; trailers end the call
                    block = payload[1 : len(payload) - payload[0]] if flags & 0x8 else payload
                    fields = dict(decoder.decode(block[5:] if flags & 0x20 else block))
                    if sid == 1 and flags & 1:
                        status = fields.get("grpc-status", "?")
                elif ftype == 4 and not flags & 1:  # SETTINGS: apply and acknowledge
                    values = dict(struct.unpack_from(">HI", payload, k) for k in range(0, len(payload), 6))
                    delta = values[4] - 65_535 if 4 in values and not windows.settings_seen else 0
                    windows.update(stream=delta, max_frame=values.get(5), seen=True)
                    send(_h2_frame(4, 1, 0))
                elif ftype == 8:  # WINDOW_UPDATE
                    inc = struct.unpack(">I", payload)[0] & 0x7FFFFFFF
                    windows.update(conn=inc if sid == 0 else 0, stream=inc if sid == 1 else 0)
                elif ftype == 6 and not flags & 1:  # PING: answer
                    send(_h2_frame(6, 1, 0, payload))
                elif ftype in (3, 7):  # RST_STREAM, GOAWAY
                    status = f"reset/goaway {payload.hex()}"
            del buf[:pos]
        writer.join(5)
    if responses != n or status != "0":
        raise RuntimeError(f"raw PublishAsync got {responses} responses for {n} requests (grpc-status {status})")


def bench_subscribe(channel: grpc.Channel, stream: str, n: int) -> None:
    """Read ``n`` stored messages from EARLIEST (raw bytes, not parsed, so the client costs little)."""
    call = channel.unary_stream("/proto.API/Subscribe", request_serializer=_identity, response_deserializer=_identity)
    req = pb.SubscribeRequest(stream=stream, startPosition=pb.EARLIEST, stopPosition=pb.STOP_OFFSET, stopOffset=n - 1)
    count = -1  # the handshake
    try:
        for _ in call(req.SerializeToString(), timeout=600):
            count += 1
    except grpc.RpcError as err:
        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
    if count != n:
        raise RuntimeError(f"Subscribe delivered {count} messages, expected {n}")


async def _nats(nats_url: str, subject: str, n: int) -> None:
    nc = await nats.connect(nats_url, pending_size=64 * 1024 * 1024)
    inbox = nc.new_inbox()
    done = asyncio.Event()
    acks = 0

    async def on_ack(_msg: object) -> None:
        nonlocal acks
        acks += 1
        if acks == n:
            done.set()

    await nc.subscribe(inbox, cb=on_ack, pending_msgs_limit=n + 10)
    payloads = [new_message(VALUE, ack_inbox=inbox, correlation_id=str(i)) for i in range(n)]
    window = 5000
    for i, payload in enumerate(payloads):
        await nc.publish(subject, payload)
        if i % 500 == 499:
            while i + 1 - acks > window:  # bounded in-flight, like a real publisher
                await asyncio.sleep(0.0005)
    await asyncio.wait_for(done.wait(), 600)
    await nc.close()


def bench_nats(nats_url: str, subject: str, n: int) -> None:
    """Enveloped publishes straight to the stream's NATS subject; done when every ack is back."""
    asyncio.run(_nats(nats_url, subject, n))


@dataclass
class Row:
    path: str
    messages: int
    seconds: float
    server_us: float
    nats_us: float
    client_us: float
    load1: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(name: str, n: int, run: Callable[[], None], server: DevServerProcess, py_spy: Path | None = None) -> Row:
    """Run ``run()`` once and return its rate and CPU µs per message of server, NATS child and this process."""
    srv = psutil.Process(server.pid)
    nats_proc = next((c for c in srv.children(recursive=True) if "nats" in c.name()), None)
    spy = None
    if py_spy is not None:
        exe = Path(sys.executable).parent / "py-spy"
        spy = subprocess.Popen(
            [str(exe), "record", "--pid", str(server.pid), "--rate", "500", "--output", str(py_spy), "--nonblocking"]
            + (["--format", "raw"] if py_spy.suffix == ".txt" else []),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
    s0, n0, c0, t0 = _cpu(srv), _cpu(nats_proc), _self_cpu(), time.perf_counter()
    run()
    t1, s1, n1, c1 = time.perf_counter(), _cpu(srv), _cpu(nats_proc), _self_cpu()
    if spy is not None:
        spy.send_signal(2)
        spy.wait(30)
    us = 1e6 / n
    return Row(name, n, t1 - t0, (s1 - s0) * us, (n1 - n0) * us, (c1 - c0) * us, os.getloadavg()[0])


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, Python {sys.version.split()[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000, help="messages for PublishAsync, Subscribe, NATS")
    parser.add_argument("--publish-messages", type=int, default=3_000, help="messages for sequential Publish")
    parser.add_argument("--rounds", type=int, default=1, help="runs per path; the fastest is kept")
    parser.add_argument("--only", choices=PATHS, action="append", help="run only these paths (repeatable)")
    parser.add_argument("--py-spy", type=Path, help="profile the server with py-spy during the (single) path")
    args = parser.parse_args()
    only = args.only or list(PATHS)
    if args.py_spy and len(only) != 1:
        parser.error("--py-spy needs exactly one --only path")
    n, p = args.messages, args.publish_messages
    load_start = os.getloadavg()
    best: dict[str, Row] = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as data, DevServerProcess(data) as server:
        channel = grpc.insecure_channel(server.address)
        stub = api_pb2_grpc.APIStub(channel)
        stub.CreateStream(pb.CreateStreamRequest(subject="bench.sub", name="sub"), timeout=10)
        if "subscribe" in only:
            bench_publish_async(channel, "sub", n)  # the stored messages Subscribe reads
        cases: dict[str, tuple[str, int, Callable[[str], None]]] = {
            "publish": ("Publish (sequential, LEADER ack)", p, lambda s: bench_publish(channel, s, p)),
            "async": ("PublishAsync (one stream, LEADER acks)", n, lambda s: bench_publish_async(channel, s, n)),
            "async-raw": (
                "PublishAsync, bare HTTP/2 client writing 256 requests at a time",
                n,
                lambda s: bench_publish_async_raw(server.address, s, n),
            ),
            "subscribe": ("Subscribe (EARLIEST, stored messages)", n, lambda _s: bench_subscribe(channel, "sub", n)),
            "nats": (
                "NATS enveloped publish + acks on inbox",
                n,
                lambda s: bench_nats(server.nats_url, f"bench.{s}", n),
            ),
        }
        for r in range(args.rounds):
            for key in only:
                stream = f"{key}-{r}"
                stub.CreateStream(pb.CreateStreamRequest(subject=f"bench.{stream}", name=stream), timeout=10)
                title, count, fn = cases[key]
                row = measure(title, count, lambda fn=fn, stream=stream: fn(stream), server, args.py_spy)  # type: ignore[misc]
                if key not in best or row.rate > best[key].rate:
                    best[key] = row
        channel.close()
    load_end = os.getloadavg()
    print(
        f"Dev server throughput, 100-byte values, best of {args.rounds} run(s) per path, {time.time() - started:.0f} s."
    )
    print(f"Machine: {machine()}.")
    print(
        "Load average (1/5/15 min) at start {:.1f}/{:.1f}/{:.1f}, at end {:.1f}/{:.1f}/{:.1f}.\n".format(
            *load_start, *load_end
        )
    )
    print("| path | messages | seconds | msgs/s | server µs/msg | nats-server µs/msg | load µs/msg | load1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for key in only:
        row = best[key]
        print(
            f"| {row.path} | {row.messages:,} | {row.seconds:.2f} | {row.rate:,.0f} | {row.server_us:.1f} "
            f"| {row.nats_us:.1f} | {row.client_us:.1f} | {row.load1:.1f} |"
        )


if __name__ == "__main__":
    main()
