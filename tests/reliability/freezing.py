"""Freezing one broker of the cluster a frozen-broker scenario runs on (issue 24 point 1).

- On the dev cluster the server's own hook does it (``stall_broker`` / ``resume_broker``, a model
  of SIGSTOP / SIGCONT; docs/devserver.md, "Fault hooks").
- On an external cluster (``LIFTBRIDGE_TEST_BROKERS``) two shell command templates do it, given
  as ``--freeze-cmd`` / ``--thaw-cmd`` or ``LIFTBRIDGE_TEST_FREEZE_CMD`` /
  ``LIFTBRIDGE_TEST_THAW_CMD``. Placeholders name the broker: ``{index}`` (its position in
  ``LIFTBRIDGE_TEST_BROKERS``, from 0), ``{id}`` (its id in FetchMetadata), ``{address}``,
  ``{host}``, ``{port}`` (as listed in ``LIFTBRIDGE_TEST_BROKERS``). Other braces are left alone,
  so shell and awk syntax pass through. Examples::

      --freeze-cmd 'docker pause liftbridge-{index}'      --thaw-cmd 'docker unpause liftbridge-{index}'
      --freeze-cmd 'ssh {host} sudo systemctl kill -s STOP liftbridge'   (thaw: -s CONT)
      --freeze-cmd 'kill -STOP $(cat /run/liftbridge/{id}.pid)'          (thaw: kill -CONT ...)

  A command runs with ``sh -c``; a non-zero exit or a run longer than :data:`COMMAND_TIMEOUT`
  fails the scenario with the command and its output. The metadata leader cannot be asked through
  the API (``liftbridge-semantics.md``): ``--metadata-leader`` / ``LIFTBRIDGE_TEST_METADATA_LEADER``
  names it (index, id or address), or ``--metadata-leader-cmd`` /
  ``LIFTBRIDGE_TEST_METADATA_LEADER_CMD`` is a shell command printing that, run before each
  scenario and tried again while it fails, for up to :data:`LEADER_CMD_WITHIN` s (leadership often
  moves after the metadata leader was frozen: read it from the brokers' logs, "Server became
  metadata leader"); without either, the scenarios that freeze the metadata leader are skipped.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from airflow_provider_liftbridge.client.types import BrokerInfo
from airflow_provider_liftbridge.devserver import DevServer

#: Seconds a freeze or thaw command may take.
COMMAND_TIMEOUT = 30.0
#: The placeholders a command template may use.
PLACEHOLDERS = ("index", "id", "address", "host", "port")


@dataclass(frozen=True)
class Broker:
    """One broker of an external cluster: its position in ``LIFTBRIDGE_TEST_BROKERS``, its id in
    metadata, and its address as listed there."""

    index: int
    id: str
    address: str

    def fields(self) -> dict[str, str]:
        host, _, port = self.address.rpartition(":")
        return {"index": str(self.index), "id": self.id, "address": self.address, "host": host, "port": port}


def expand(template: str, broker: Broker) -> str:
    """``template`` with each ``{placeholder}`` of :data:`PLACEHOLDERS` replaced by ``broker``'s value."""
    for name, value in broker.fields().items():
        template = template.replace("{" + name + "}", value)
    return template


def run_command(template: str, broker: Broker, what: str) -> None:
    """Run ``template`` for ``broker`` with ``sh -c``.

    :raises RuntimeError: the command exited non-zero or ran longer than :data:`COMMAND_TIMEOUT`
        (the message holds the command and its output).
    """
    command = expand(template, broker)
    try:
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"the {what} command for broker {broker.id} ran over {COMMAND_TIMEOUT:g} s: {command!r}"
        ) from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"the {what} command for broker {broker.id} ({broker.address}) exited with {done.returncode}: "
            f"{command!r}; stderr: {done.stderr.strip()!r}; fix --{what}-cmd (or LIFTBRIDGE_TEST_{what.upper()}_CMD)"
        )


def match_brokers(addresses: Sequence[str], listed: Sequence[BrokerInfo]) -> list[Broker]:
    """The brokers of ``addresses`` (``LIFTBRIDGE_TEST_BROKERS``, in order) with their ids from
    ``listed`` (FetchMetadata's brokers): matched by ``host:port``, else by a port only one of them has.

    :raises LookupError: an address matches no listed broker (the message lists what metadata says).
    """
    by_address = {b.address: b.id for b in listed}
    by_port: dict[str, list[str]] = {}
    for b in listed:
        by_port.setdefault(str(b.port), []).append(b.id)
    out = []
    for index, address in enumerate(addresses):
        found = by_address.get(address)
        if found is None and len(by_port.get(address.rpartition(":")[2], [])) == 1:
            found = by_port[address.rpartition(":")[2]][0]
        if found is None:
            known = ", ".join(f"{b.id}={b.address}" for b in listed)
            raise LookupError(
                f"LIFTBRIDGE_TEST_BROKERS lists {address}, which matches no broker the cluster reports ({known}); "
                "list the brokers as they advertise themselves"
            )
        out.append(Broker(index, found, address))
    return out


def find_broker(value: str, brokers: Sequence[Broker]) -> int:
    """Index of the broker ``value`` names (an index, an id or an address).

    :raises LookupError: no broker is named so.
    """
    for b in brokers:
        if value in (str(b.index), b.id, b.address):
            return b.index
    raise LookupError(
        f"--metadata-leader {value!r} names no broker of LIFTBRIDGE_TEST_BROKERS; give an index "
        f"(0..{len(brokers) - 1}), an id ({', '.join(b.id for b in brokers)}) or an address"
    )


class FreezableCluster(Protocol):
    """A cluster one of whose brokers a scenario can freeze and thaw; brokers by index, the client's
    order being the index order."""

    @property
    def addresses(self) -> list[str]: ...

    @property
    def broker_ids(self) -> list[str]: ...

    @property
    def metadata_leader(self) -> int | None:
        """Index of the metadata leader, ``None`` if unknown."""
        ...

    @property
    def external(self) -> bool: ...

    def freeze(self, index: int) -> None: ...

    def thaw(self, index: int) -> None: ...


class DevFreezable:
    """The dev cluster's own freeze hook."""

    external = False

    def __init__(self, server: DevServer) -> None:
        self.server = server

    @property
    def addresses(self) -> list[str]:
        return list(self.server.addresses)

    @property
    def broker_ids(self) -> list[str]:
        return list(self.server.broker_ids)

    @property
    def metadata_leader(self) -> int | None:
        return self.server.metadata_leader

    def freeze(self, index: int) -> None:
        self.server.stall_broker(index)

    def thaw(self, index: int) -> None:
        self.server.resume_broker(index)


#: How long ``--metadata-leader-cmd`` is tried again before the run that needed it gives up: a
#: cluster after a long cut can take that long to elect a metadata leader the logs name.
LEADER_CMD_WITHIN = 120.0


class MetadataLeaderUnknown(RuntimeError):
    """``--metadata-leader-cmd`` failed, or named no broker, on every try for its bound."""


@dataclass(frozen=True)
class ExternalFreezable:
    """An external cluster frozen and thawed by command templates (see the module docstring); its
    metadata leader is ``leader``, or what ``leader_cmd`` prints when asked (tried again for
    ``leader_within`` s while it fails)."""

    brokers: list[Broker]
    freeze_cmd: str
    thaw_cmd: str
    leader: int | None = None
    leader_cmd: str = ""
    leader_within: float = LEADER_CMD_WITHIN
    external = True

    @property
    def metadata_leader(self) -> int | None:
        """Index of the metadata leader (``None``: unknown).

        :raises MetadataLeaderUnknown: ``leader_cmd`` exited non-zero, ran over
            :data:`COMMAND_TIMEOUT` or named no broker on every try for ``leader_within`` s (the
            message holds the last try's exit status and stderr, or what it printed).
        """
        if not self.leader_cmd:
            return self.leader
        deadline = time.monotonic() + self.leader_within
        tries = 0
        while True:
            tries += 1
            try:
                done = subprocess.run(
                    ["sh", "-c", self.leader_cmd], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
                )
                if done.returncode == 0:
                    return find_broker(done.stdout.strip(), self.brokers)
                failure = f"exited with {done.returncode}; stderr: {done.stderr.strip()!r}"
            except subprocess.TimeoutExpired:
                failure = f"ran over {COMMAND_TIMEOUT:g} s"
            except LookupError as exc:
                failure = str(exc)
            if time.monotonic() >= deadline:
                raise MetadataLeaderUnknown(
                    f"--metadata-leader-cmd {self.leader_cmd!r} failed {tries} time(s) in "
                    f"{self.leader_within:g} s; last: {failure}"
                )
            time.sleep(min(2.0, max(deadline - time.monotonic(), 0.0)))

    @property
    def addresses(self) -> list[str]:
        return [b.address for b in self.brokers]

    @property
    def broker_ids(self) -> list[str]:
        return [b.id for b in self.brokers]

    def freeze(self, index: int) -> None:
        run_command(self.freeze_cmd, self.brokers[index], "freeze")

    def thaw(self, index: int) -> None:
        run_command(self.thaw_cmd, self.brokers[index], "thaw")
