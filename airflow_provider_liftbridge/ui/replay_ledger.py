"""Which dead letters were replayed: the view's ledger of replay claims (docs/ui.md, "Actions").

A replay first **claims** the letters no earlier replay claimed, by appending one record to
:data:`LEDGER_STREAM` (one partition, written with ack policy ``ALL``): the dead-letter stream and
its creation time (a stream deleted and created again starts its offsets anew), a producer id new
to this claim, and the letters as offset ranges per partition. Then it reads the ledger up to its
own record: **a letter belongs to the first claim of it in the ledger's order**, so of two
requests that claimed one letter at the same time, in one api-server or two, exactly one puts it
back. The claim's owner publishes its letters with the exactly-once publisher under the claim's
producer id, then appends a **done** record.

A crash between the claim and the done record leaves the claim open. A later replay of any of its
letters finishes it once it is :data:`STALE_AFTER` old (a younger one may still be running: its
letters count as being replayed): it publishes the claim's letters again under the claim's
producer id, and the exactly-once publisher skips those already in the source partition (the
scan start it stored before its first record, ``docs/exactly-once.md``). So a letter goes back
at most once, and a claimed letter does go back.

Imports no Airflow.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from itertools import groupby
from typing import Any

from airflow_provider_liftbridge.client import LiftbridgeClient, StreamExistsError
from airflow_provider_liftbridge.client.stream_options import BOOKKEEPING_SEGMENT_BYTES
from airflow_provider_liftbridge.client.types import AckPolicy

__all__ = ["LEDGER_STREAM", "STALE_AFTER", "Claim", "Ledger", "append", "read_ledger"]

#: The ledger stream (and its subject).
LEDGER_STREAM = "airflow-liftbridge-replayed-letters"
#: Its retention: kept for years and up to this many records (two per replay request, a few
#: hundred bytes each however many letters: letters are offset ranges). A record removed would
#: let its letters be replayed again, so this is far beyond any dead-letter stream's retention.
LEDGER_MAX_MESSAGES = 1_000_000
LEDGER_MAX_AGE = timedelta(days=3650)
#: An open claim younger than this may still be running; older, a later replay finishes it.
STALE_AFTER = 600.0

Letter = tuple[int, int]


def _ranges(letters: Iterable[Letter]) -> dict[str, list[list[int]]]:
    """Sorted letters as inclusive offset ranges per partition (``{"0": [[0, 999]]}``)."""
    out: dict[str, list[list[int]]] = {}
    for p, group in groupby(sorted(set(letters)), key=lambda letter: letter[0]):
        runs = out.setdefault(str(p), [])
        for _, o in group:
            if runs and runs[-1][1] == o - 1:
                runs[-1][1] = o
            else:
                runs.append([o, o])
    return out


@dataclass
class Claim:
    """One replay's claim: its producer id, when it was made (epoch seconds), its letters, and,
    once the ledger is read, the letters it won (claimed by no earlier claim) and whether it is done."""

    producer: str
    at: float
    letters: frozenset[Letter]
    won: frozenset[Letter] = frozenset()
    done: bool = False
    offset: int = -1


@dataclass
class Ledger:
    """The claims of one dead-letter stream (one creation of it), in the ledger's order."""

    stream: str
    created: int
    claims: list[Claim] = field(default_factory=list)
    owner: dict[Letter, Claim] = field(default_factory=dict)
    end: int = -1  # the ledger's offset read up to

    def add(self, record: Mapping[str, Any], offset: int) -> None:
        """Take one ledger record (of any stream; others are left out)."""
        if record.get("stream") != self.stream or record.get("created") != self.created:
            return
        if record.get("kind") == "done":
            for claim in self.claims:
                if claim.producer == record.get("producer"):
                    claim.done = True
            return
        runs = [(int(p), first, last) for p, pairs in record.get("letters", {}).items() for first, last in pairs]
        letters = frozenset((p, o) for p, first, last in runs for o in range(first, last + 1))
        claim = Claim(str(record["producer"]), float(record.get("at", 0)), letters, offset=offset)
        claim.won = frozenset(letter for letter in letters if letter not in self.owner)
        for letter in claim.won:
            self.owner[letter] = claim
        self.claims.append(claim)

    def claim_of(self, producer: str) -> Claim | None:
        return next((c for c in self.claims if c.producer == producer), None)


def _records(client: LiftbridgeClient, first: int, last: int) -> Iterator[tuple[int, dict[str, Any]]]:
    messages = client.subscribe(LEDGER_STREAM, partition=0, start_at=first, stop_at=last)
    try:
        for message in messages:
            try:
                record = json.loads(message.value)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield message.offset, record
    finally:
        messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription


def read_ledger(client: LiftbridgeClient, stream: str, created: int, ledger: Ledger | None = None) -> Ledger:
    """The claims of ``stream`` (created at ``created``, ns), read from the whole ledger; or, given
    ``ledger``, what was appended to the ledger after it was read.

    :raises LiftbridgeError: the ledger could not be read.
    """
    ledger = ledger or Ledger(stream, created)
    info = client.fetch_metadata([LEDGER_STREAM]).streams.get(LEDGER_STREAM)
    if info is None:
        return ledger
    hw = client.fetch_partition_metadata(LEDGER_STREAM, 0).high_watermark
    if hw > ledger.end:
        for offset, record in _records(client, ledger.end + 1, hw):
            ledger.add(record, offset)
        ledger.end = hw
    return ledger


def _create(client: LiftbridgeClient) -> None:
    if LEDGER_STREAM in client.fetch_metadata([LEDGER_STREAM]).streams:
        return
    try:
        client.create_stream(
            LEDGER_STREAM,
            LEDGER_STREAM,
            segment_max_bytes=BOOKKEEPING_SEGMENT_BYTES,
            retention_max_messages=LEDGER_MAX_MESSAGES,
            retention_max_age=LEDGER_MAX_AGE,
        )
    except StreamExistsError:
        pass  # another request created it meanwhile


def append(client: LiftbridgeClient, ledger: Ledger, kind: str, producer: str, letters: Iterable[Letter] = ()) -> int:
    """Append a ``claim`` (with ``letters``) or ``done`` record of ``producer`` to the ledger (created
    if missing), acknowledged by every replica in sync; its offset.

    :raises LiftbridgeError: not acknowledged (a claim that was stored all the same is finished
        by a later replay, see the module docstring).
    """
    _create(client)
    record: dict[str, Any] = {"kind": kind, "stream": ledger.stream, "created": ledger.created, "producer": producer}
    if kind == "claim":
        record |= {"at": round(time.time(), 3), "letters": _ranges(letters)}
    ack = client.publish(
        LEDGER_STREAM, json.dumps(record).encode(), key=ledger.stream.encode(), ack_policy=AckPolicy.ALL
    )
    assert ack is not None
    return int(ack.offset)


def new_producer(stream: str) -> str:
    """A producer id new to one claim."""
    return f"liftbridge-view/replay/{stream}/{uuid.uuid4().hex}"
