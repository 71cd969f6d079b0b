"""The hand-written protobuf of the dev server's hot path equals what the protobuf library writes.

``Partition.append`` builds the stored ``Message`` bytes itself, and ``varint`` encodes offsets,
lengths and timestamps from tables; both are checked here against ``google.protobuf``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]  # protobuf's own varint
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_liftbridge._proto import api_pb2
from airflow_provider_liftbridge.devserver.state import BrokerSlot, Partition, Store
from airflow_provider_liftbridge.devserver.wire import header_entries, header_entry, varint

_SUBJECT = st.text(
    st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="."), min_size=1, max_size=12
)
_HEADERS = st.dictionaries(st.sampled_from(["a", "subject", "reply", "h-é", "x" * 200]), st.binary(max_size=300))


@given(st.integers(min_value=0, max_value=(1 << 64) - 1))
def test_varint_matches_protobuf(n: int) -> None:
    assert varint(n) == _VarintBytes(n)


@pytest.mark.parametrize("n", [-1, -2, -(1 << 63), 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 1 << 63])
def test_varint_edges_and_negative_int64(n: int) -> None:
    assert varint(n) == _VarintBytes(n & ((1 << 64) - 1))


@settings(max_examples=150, deadline=None)
@given(headers=_HEADERS)
def test_header_entries_are_protobufs_without_the_server_headers(headers: dict[str, bytes]) -> None:
    for name, value in headers.items():
        assert header_entry(name, value) == api_pb2.Message(headers={name: value}).SerializeToString()
    kept = {k: v for k, v in headers.items() if k not in ("subject", "reply")}
    assert api_pb2.Message.FromString(header_entries(headers)).headers == kept
    # The same from a protobuf map (what the NATS ingest passes): read by key, same bytes.
    assert header_entries(api_pb2.Message(headers=headers).headers) == b"".join(
        header_entry(k, v) for k, v in api_pb2.Message(headers=headers).headers.items() if k in kept
    )


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def partitions(tmp_path_factory: pytest.TempPathFactory, loop: asyncio.AbstractEventLoop) -> Iterator[list[Partition]]:
    """Partitions 0 and 3 of a stream in a real store (appends are buffered, never flushed here)."""
    store = Store(Path(tmp_path_factory.mktemp("store")), [BrokerSlot(0, "b0", "127.0.0.1", 1, True)])
    req = api_pb2.CreateStreamRequest(name="strëam", subject="subj", partitions=4)
    stream = loop.run_until_complete(store.create_stream(req))
    yield [stream.partitions[0], stream.partitions[3]]
    store.close()


def _append(loop: asyncio.AbstractEventLoop, part: Partition, *args: object) -> tuple[int, bytes]:
    async def run() -> tuple[int, bytes]:
        offset = part.append(*args)  # type: ignore[arg-type]
        return offset, part.log._pending[-1][24:]  # the body, after the record's framing

    return loop.run_until_complete(run())


@settings(max_examples=150, deadline=None)
@given(
    which=st.sampled_from([0, 1]),
    key=st.binary(max_size=200),
    value=st.one_of(st.binary(max_size=300), st.just(b"v" * 20_000)),
    headers=st.one_of(st.none(), _HEADERS),
    other_subject=st.one_of(st.none(), _SUBJECT),
    reply=st.one_of(st.just(""), _SUBJECT),
    timestamp=st.integers(min_value=1, max_value=(1 << 63) - 1),
)
def test_stored_body_is_the_protobuf_message(
    loop: asyncio.AbstractEventLoop,
    partitions: list[Partition],
    which: int,
    key: bytes,
    value: bytes,
    headers: dict[str, bytes] | None,
    other_subject: str | None,
    reply: str,
    timestamp: int,
) -> None:
    part = partitions[which]
    subject = other_subject or part.subject
    offset, body = _append(loop, part, key, value, headers, subject, reply, 0, timestamp)
    timestamp = max(timestamp, part._last_ts)  # timestamps never go backwards within a partition
    fields = api_pb2.Message(
        offset=offset,
        key=key,
        value=value,
        timestamp=timestamp,
        stream="strëam",
        partition=part.id,
        subject=subject,
        replySubject=reply,
    )
    server_headers = header_entry("subject", subject.encode()) + header_entry("reply", reply.encode())
    if not headers:
        # Byte for byte what the library writes, then the server's header entries.
        assert body == fields.SerializeToString() + server_headers
    expected = api_pb2.Message()
    expected.CopyFrom(fields)
    expected.headers.update({k: v for k, v in (headers or {}).items() if k not in ("subject", "reply")})
    expected.headers.update({"subject": subject.encode(), "reply": reply.encode()})
    assert api_pb2.Message.FromString(body) == expected
