"""Fixtures of the dev-server tests: a raw generated ``APIStub`` (never the project client) on the session server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
from nats.aio.client import Client

from airflow_provider_liftbridge import nats_adapter
from airflow_provider_liftbridge._proto import api_pb2_grpc


@pytest.fixture(scope="session")
def channel(lb_address: str) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(lb_address)
    try:
        yield ch
    finally:
        ch.close()


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> api_pb2_grpc.APIStub:
    """A raw ``APIStub`` on the session dev server."""
    return api_pb2_grpc.APIStub(channel)


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A plain nats-py connection to the session's NATS server, closed after the test."""
    client = await nats_adapter.connect(nats_url)
    try:
        yield client
    finally:
        await client.close()
