"""The client's UnavailableError names gRPC's cause and what to check (a real refused port), and
suggests max_retries only when the call was retried."""

from __future__ import annotations

import socket

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient, UnavailableError


def _refused() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize(("retries", "advice"), [(0, False), (1, True)])
def test_unavailable_names_the_cause(retries: int, advice: bool) -> None:
    address = _refused()
    with LiftbridgeClient(address, max_retries=retries, timeout=2, backoff_base=0.01) as client:
        with pytest.raises(UnavailableError) as info:
            client.fetch_metadata()
    text = str(info.value)
    assert f"({address}): connection refused; nothing listens on this host and port" in text
    assert ("raise max_retries" in text) is advice
    assert "ipv4" not in text and "Connection refused" in info.value.cause  # gRPC's own text kept apart
