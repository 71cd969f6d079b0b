"""The interoperability tier: clients this project did not write, driving a Liftbridge server.

gufo-liftbridge (PyPI) runs in a child process (``gufo_driver.py`` says why); where it lacks a call
the tests use raw stubs generated from upstream ``api.proto`` (``_proto``), as any other client
would, never this project's client. The single-node module runs against the session dev server,
or against an external Liftbridge with ``LIFTBRIDGE_TEST_BROKERS`` (a contract check of the real
server); the cluster module starts a dev-server cluster of its own.
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from airflow_provider_liftbridge._proto import api_pb2_grpc

DRIVER = Path(__file__).with_name("gufo_driver.py")
#: Longest a command may take before the test fails (the driver's own limit is 30 s).
ANSWER_TIMEOUT = 40.0


class Gufo:
    """A gufo-liftbridge client in a child process, seeded with ``brokers``."""

    def __init__(self, brokers: Sequence[str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, str(DRIVER), ",".join(brokers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def __call__(self, do: str, **args: Any) -> dict[str, Any]:
        """Run one command; its answer without ``ok``.

        :raises AssertionError: gufo raised (the error is in the message), or no answer came.
        """
        answer = self.ask(do, **args)
        assert answer.pop("ok"), f"gufo {do} {args} failed: {answer['error']}"
        return answer

    def ask(self, do: str, **args: Any) -> dict[str, Any]:
        """Run one command; its answer as is (``ok`` false and ``error`` when gufo raised)."""
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"do": do, **args}) + "\n")
        proc.stdin.flush()
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            if not sel.select(ANSWER_TIMEOUT):
                raise AssertionError(f"gufo gave no answer to {do} {args} within {ANSWER_TIMEOUT} s")
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the gufo driver died during {do} {args}:\n{err[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        proc = self._proc
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def gufo_at() -> Iterator[Any]:
    """Start gufo clients seeded with given brokers; all are closed after the test."""
    started: list[Gufo] = []

    def start(brokers: Sequence[str]) -> Gufo:
        started.append(Gufo(brokers))
        return started[-1]

    try:
        yield start
    finally:
        for g in started:
            g.close()


@pytest.fixture
def raw_at() -> Iterator[Any]:
    """Raw ``APIStub``s on given addresses (generated from upstream api.proto); channels closed after."""
    channels: list[grpc.Channel] = []

    def stub(address: str) -> api_pb2_grpc.APIStub:
        channels.append(grpc.insecure_channel(address))
        return api_pb2_grpc.APIStub(channels[-1])

    try:
        yield stub
    finally:
        for ch in channels:
            ch.close()
