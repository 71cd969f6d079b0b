"""The view's two actions (docs/ui.md, "Actions"): replay dead letters to their source stream, and
move a pipeline's cursor. Both check everything they can before they change anything, so a bad
offset, a letter that is not a dead letter or a stream deleted meanwhile changes nothing.

**Replay, each letter at most once.** A replay publishes each selected letter's value, key and own
headers (the ``dead-letter-*`` headers left out, :data:`REPLAYED_FROM_HEADER` added) to its source
stream and partition. Whatever the selection and whoever sends it, a letter goes back once: the
replay claims the letters no earlier replay claimed in the view's ledger stream, the first claim
of a letter wins, and the winner publishes with the client's exactly-once publisher
(``client/exactly_once``) under its claim's producer id, so a crash midway is finished by a later
replay without a duplicate (:mod:`.replay_ledger`). Replays of one dead-letter stream in one
api-server run one after the other (:data:`_RUNNING`); in two api-servers the ledger's order
decides. A selection is pinned to offsets: "all" is every letter up to the high watermarks the
dialog showed (:func:`plan_replay` answers them).

**Cursor move.** A pipeline's position cursor holds the offset of the last message processed; the
next run plans from the one after it (``client/reading/plan.py``). Moving to offset ``n`` stores
``n - 1`` and voids the stored plan's run tag, so the next try of any run plans afresh from ``n``.

Imports Airflow nowhere: the routes (:mod:`.actions_api`) check the user and write the audit log.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from airflow_provider_liftbridge.client import (
    LiftbridgeClient,
    LiftbridgeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionPausedError,
)
from airflow_provider_liftbridge.client.exactly_once import PRODUCER_HEADER, SEQ_HEADER, ExactlyOncePublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions
from airflow_provider_liftbridge.client.reading.dead_letter import (
    DEAD_LETTER_HEADERS,
    SOURCE_PARTITION_HEADER,
    SOURCE_STREAM_HEADER,
)
from airflow_provider_liftbridge.client.reading.plan import NO_PLAN, first_offset_at, plan_cursor_ids
from airflow_provider_liftbridge.client.reading.registry import PipelineEntry, read_pipelines
from airflow_provider_liftbridge.client.types import AckPolicy, Message, Record

from .replay_ledger import STALE_AFTER, Claim, Ledger, new_producer, read_ledger
from .replay_ledger import append as ledger_append
from .search_input import SearchInputError, parse_offset, parse_time

__all__ = [
    "MAX_REPLAY",
    "MAX_REPLAY_BYTES",
    "PausedLettersError",
    "REPLAYED_FROM_HEADER",
    "ReplaySelection",
    "move_cursor",
    "parse_target",
    "plan_replay",
    "replay",
    "selection_from",
]

#: At most this many letters per replay request (all of them are read before anything is sent).
MAX_REPLAY = 10_000
#: At most this many bytes of letters (values, keys, headers) per replay request.
MAX_REPLAY_BYTES = 64 * 1024 * 1024
#: Added to every replayed message: ``<dead-letter stream>/<partition>/<offset>`` of its letter.
REPLAYED_FROM_HEADER = "dead-letter-replayed-from"
#: A plan run tag no run has (run tags are non-negative): the next try of any run plans afresh.
VOID_TAG = -1
#: Letters named in an answer's ``skipped`` / ``in_progress`` lists, at most (the counts are whole).
MAX_LISTED = 50
#: Seconds a replay waits for another writer of the same claim (a replay finishing a claim whose
#: own replay turns out to be alive) before it is refused.
ZOMBIE_WAIT = 60.0

#: Headers a replayed message does not carry: the dead letter's own, the ones Liftbridge adds to
#: every message, and an earlier exactly-once producer's (the replay numbers it as its own).
_NOT_REPLAYED = frozenset({*DEAD_LETTER_HEADERS, "subject", "reply", PRODUCER_HEADER, SEQ_HEADER})

_RUNNING: dict[str, threading.Lock] = defaultdict(threading.Lock)  # per dead-letter stream
_RUNNING_GUARD = threading.Lock()


# -- the selection --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplaySelection:
    """Which letters of a dead-letter stream to replay: per partition, the offsets named, or every
    letter up to (and with) an offset.

    :param stream: the dead-letter stream.
    :param letters: ``(partition, offset)`` of each letter named, sorted.
    :param through: ``(partition, last offset)``: every letter of the partition up to it, sorted.
    """

    stream: str
    letters: tuple[tuple[int, int], ...] = ()
    through: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        """The selection in a few words (for the audit log)."""
        if self.through:
            return "all up to " + ", ".join(f"{p}:{o}" for p, o in self.through)
        return f"{len(self.letters)} selected"


def selection_from(stream: str, body: Mapping[str, Any]) -> ReplaySelection:
    """The selection of a request body: ``{"letters": ["0:17", ...]}`` or ``{"through": {"0": 999}}``.

    :raises SearchInputError: neither or both, or a letter or offset that is not ``partition:offset``
        / a whole number (the text says what to type).
    """
    letters, through = body.get("letters"), body.get("through")
    if (letters is None) == (through is None):
        raise SearchInputError("letters", 'name the letters ("letters": ["0:17", ...]) or all of them ("through")')
    if letters is not None:
        if not isinstance(letters, list) or not letters:
            raise SearchInputError("letters", 'letters must be a non-empty list of "partition:offset", e.g. ["0:17"]')
        named = set()
        for text in letters:
            parts = str(text).split(":")
            if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
                raise SearchInputError(
                    "letters", f'a letter is "partition:offset" with whole numbers, e.g. "0:17"; got {text!r}'
                )
            named.add((int(parts[0]), int(parts[1])))
        if len(named) > MAX_REPLAY:
            raise SearchInputError("letters", f"at most {MAX_REPLAY:,} letters per replay; select fewer")
        return ReplaySelection(stream, letters=tuple(sorted(named)))
    if not isinstance(through, dict) or not through:
        raise SearchInputError("through", 'through must map each partition to its last offset, e.g. {"0": 999}')
    pinned = []
    for partition, last in through.items():
        p = parse_offset(str(partition), "through (partition)")
        o = parse_offset(str(last), "through (offset)", low=-1)
        assert p is not None and o is not None
        pinned.append((p, o))
    return ReplaySelection(stream, through=tuple(sorted(pinned)))


# -- reading the letters --------------------------------------------------------------------------
def _hws(client: LiftbridgeClient, stream: str, what: str) -> dict[int, int]:
    """The stream's partitions and their high watermarks.

    :raises NoSuchStreamError: it does not exist (deleted meanwhile): the text says nothing changed.
    """
    info = client.fetch_metadata([stream]).streams.get(stream)
    if info is None:
        raise NoSuchStreamError(f"{what} {stream!r} does not exist (deleted meanwhile?): nothing was changed")
    return {p: part.high_watermark for p, part in info.partitions.items()}


def _runs(offsets: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Sorted offsets as inclusive runs of consecutive ones."""
    for _, run in groupby(enumerate(offsets), key=lambda x: x[1] - x[0]):
        found = [o for _, o in run]
        yield found[0], found[-1]


def _letters(client: LiftbridgeClient, selection: ReplaySelection) -> list[Message]:
    """The selected letters, by partition and offset.

    :raises SearchInputError: a letter past a partition's end or no longer kept, or too many.
    :raises NoSuchStreamError: the dead-letter stream is gone.
    """
    hws = _hws(client, selection.stream, "dead-letter stream")
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)  # per partition, inclusive offset ranges
    for p, group in groupby(selection.letters, key=lambda letter: letter[0]):
        spans[p] += _runs([o for _, o in group])
    for p, last in selection.through:
        if last >= 0:
            spans[p].append((0, last))
    for p, ranges in spans.items():
        if p not in hws:
            raise SearchInputError("letters", f"the dead-letter stream has no partition {p} (it has {sorted(hws)})")
        end = max(last for _, last in ranges)
        if end > hws[p]:
            raise SearchInputError(
                "letters",
                f"partition {p} holds letters up to offset {hws[p]}; offset {end} does not exist: reload the letters",
            )
    found: list[Message] = []
    size = 0
    for p in sorted(spans):
        for first, last in spans[p]:
            got = _read(client, selection.stream, p, first, last)
            if selection.letters and len(got) != last - first + 1:
                kept = {m.offset for m in got}
                gone = [o for o in range(first, last + 1) if o not in kept]
                raise SearchInputError(
                    "letters", f"letter {p}:{gone[0]} is no longer kept (retention removed it): reload the letters"
                )
            for m in got:
                size += len(m.value) + len(m.key or b"") + sum(len(k) + len(v) for k, v in m.headers.items())
                if len(found) >= MAX_REPLAY or size > MAX_REPLAY_BYTES:
                    raise SearchInputError(
                        "letters",
                        f"a replay takes at most {MAX_REPLAY:,} letters or {MAX_REPLAY_BYTES // 2**20} MiB;"
                        " select fewer",
                    )
                found.append(m)
    return found


class PausedLettersError(LiftbridgeError):
    """A dead-letter partition is paused: its letters cannot be read, so nothing is replayed (the
    text says how to resume it). The API answers 409 with this text alone."""


def _read(client: LiftbridgeClient, stream: str, partition: int, first: int, last: int) -> list[Message]:
    """The letters ``first`` to ``last`` of a dead-letter partition.

    :raises PausedLettersError: the partition is paused (the view does not resume it on its own).
    """
    try:
        messages: Iterator[Message] = client.subscribe(stream, partition=partition, start_at=first, stop_at=last)
        try:
            return [m for m in messages if first <= m.offset <= last]
        finally:
            messages.close()  # type: ignore[attr-defined]  # a generator: ends the subscription
    except PartitionPausedError:
        raise PausedLettersError(
            f"dead-letter stream {stream!r} partition {partition} is paused (by an operator, or by the stream's"
            " auto-pause when idle), so its letters cannot be read and nothing was replayed. Resume it, then"
            f" replay again: subscribe to it asking to resume (Python: client.subscribe({stream!r},"
            f" partition={partition}, resume=True); go-liftbridge: the Resume() option). Publishing to it would"
            " resume it too, but adds a message that is no letter"
        ) from None


def _target(letter: Message) -> tuple[str, int]:
    """Where a letter came from: its source stream and partition.

    :raises SearchInputError: it lacks the dead-letter headers (not written by a reading operator).
    """
    stream = letter.headers.get(SOURCE_STREAM_HEADER, b"").decode("utf-8", "replace")
    partition = letter.headers.get(SOURCE_PARTITION_HEADER, b"").decode("ascii", "replace")
    if not stream or not partition.isdigit():
        raise SearchInputError(
            "letters",
            f"letter {letter.partition}:{letter.offset} has no {SOURCE_STREAM_HEADER} / {SOURCE_PARTITION_HEADER}"
            " header: it was not written by a reading operator, so it has no source to go back to; leave it out",
        )
    return stream, int(partition)


def _grouped(client: LiftbridgeClient, selection: ReplaySelection) -> dict[str, list[Message]]:
    """The letters by source stream (in selection order), every source checked to exist.

    :raises NoSuchStreamError: / :raises NoSuchPartitionError: a source is gone (nothing sent).
    """
    by_stream: dict[str, list[Message]] = defaultdict(list)
    for letter in _letters(client, selection):
        by_stream[_target(letter)[0]].append(letter)
    for stream, letters in by_stream.items():
        parts = _hws(client, stream, "source stream")
        for letter in letters:
            partition = _target(letter)[1]
            if partition not in parts:
                raise NoSuchPartitionError(
                    f"source stream {stream!r} has no partition {partition} any more (letter"
                    f" {letter.partition}:{letter.offset} came from it): nothing was replayed"
                )
    return dict(sorted(by_stream.items()))


def plan_replay(client: LiftbridgeClient, stream: str, letters: list[str] | None) -> dict[str, Any]:
    """What a replay would do, for the dialog: the selection pinned (``through`` for all letters),
    the letters per source stream. Changes nothing.

    :raises SearchInputError: / :raises NoSuchStreamError: as :func:`replay`.
    """
    if letters:
        selection = selection_from(stream, {"letters": letters})
    else:
        hws = _hws(client, stream, "dead-letter stream")
        selection = ReplaySelection(stream, through=tuple(sorted((p, hw) for p, hw in hws.items() if hw >= 0)))
    grouped = _grouped(client, selection) if selection.letters or selection.through else {}
    selected = {(m.partition, m.offset) for letters in grouped.values() for m in letters}
    earlier = _earlier(_ledger_of(client, stream), selected, time.time()) if selected else {}
    skipped = set().union(*earlier.values()) if earlier else set()
    return {
        "stream": stream,
        "count": len(selected),
        "targets": {s: len(v) for s, v in grouped.items()},
        "letters": [f"{p}:{o}" for p, o in selection.letters] or None,
        "through": {str(p): o for p, o in selection.through} or None,
        # Put back by an earlier replay (or being put back): a replay skips them.
        "already_replayed": len(skipped),
        "skipped": _listed(skipped),
    }


def _record(letter: Message, source: str, partition: int) -> Record:
    headers = {k: v for k, v in letter.headers.items() if k not in _NOT_REPLAYED}
    headers[REPLAYED_FROM_HEADER] = f"{source}/{letter.partition}/{letter.offset}".encode()
    return Record(letter.value, key=letter.key, headers=headers, partition=partition)


def _publish(
    client: LiftbridgeClient, stream: str, producer: str, letters: Sequence[Message]
) -> dict[str, dict[str, int]]:
    """Publish ``letters`` (in this order) to their sources under ``producer``, exactly once; per
    source stream, the records written and skipped (found there: put back by an earlier attempt)."""
    by_stream: dict[str, list[Message]] = defaultdict(list)
    for letter in letters:
        by_stream[_target(letter)[0]].append(letter)
    options = PublishOptions(ack_policy=AckPolicy.ALL)
    targets: dict[str, dict[str, int]] = {}
    for source, group in sorted(by_stream.items()):
        records = [_record(m, stream, _target(m)[1]) for m in group]
        with ExactlyOncePublisher(client, source, producer, options=options, zombie_wait=ZOMBIE_WAIT) as publisher:
            result = publisher.publish(records)
        targets[source] = {"written": result.written, "skipped": result.skipped}
    return targets


def _finish(client: LiftbridgeClient, stream: str, ledger: Ledger, claim: Claim) -> int:
    """Finish an open claim a crashed replay left (its letters it won, under its producer id, in
    the order it used); the letters written now.

    :raises SearchInputError: a letter of it is no longer kept (it cannot be finished as it began).
    """
    won = sorted(claim.won)
    try:
        letters = _letters(client, ReplaySelection(stream, letters=tuple(won)))
    except SearchInputError as exc:
        raise SearchInputError(
            "letters",
            f"a replay claimed letters {_listed(won)[0]} to {_listed(won)[-1]} and died before it ended; it cannot be"
            f" finished ({exc}): leave its letters out of the selection",
        ) from None
    targets = _publish(client, stream, claim.producer, letters)
    ledger_append(client, ledger, "done", claim.producer)
    claim.done = True
    return sum(t["written"] for t in targets.values())


def _listed(letters: Iterable[tuple[int, int]]) -> list[str]:
    return [f"{p}:{o}" for p, o in sorted(letters)][:MAX_LISTED]


def _ledger_of(client: LiftbridgeClient, stream: str) -> Ledger:
    info = client.fetch_metadata([stream]).streams.get(stream)
    if info is None:
        raise NoSuchStreamError(
            f"dead-letter stream {stream!r} does not exist (deleted meanwhile?): nothing was changed"
        )
    return read_ledger(client, stream, info.creation_timestamp)


def _earlier(ledger: Ledger, selected: Iterable[tuple[int, int]], now: float) -> dict[str, set[tuple[int, int]]]:
    """The selected letters an earlier replay claimed: ``done`` (put back), ``stale`` (its replay
    crashed: to finish) and ``running`` (its replay may still be at work)."""
    found: dict[str, set[tuple[int, int]]] = {"done": set(), "stale": set(), "running": set()}
    for letter in selected:
        claim = ledger.owner.get(letter)
        if claim is not None:
            kind = "done" if claim.done else "stale" if now - claim.at >= STALE_AFTER else "running"
            found[kind].add(letter)
    return found


def replay(client: LiftbridgeClient, selection: ReplaySelection) -> dict[str, Any]:
    """Put each selected letter back into its source stream and partition unless a replay (of any
    selection, by anyone) claimed it before (see :mod:`.replay_ledger`): claimed now and written,
    or skipped as put back earlier (or being put back by a replay still at work).

    :raises SearchInputError: a letter that does not exist, is no longer kept, lacks the
        dead-letter headers, or too many; nothing was sent.
    :raises NoSuchStreamError: / :raises NoSuchPartitionError: the dead-letter stream or a source
        is gone; nothing was sent.
    :raises LiftbridgeError: publishing failed midway (the claim stays open: a replay of its
        letters after :data:`.replay_ledger.STALE_AFTER` finishes it).
    """
    with _RUNNING_GUARD:
        lock = _RUNNING[selection.stream]
    with lock:  # replays of one dead-letter stream in this api-server: one after the other
        grouped = _grouped(client, selection)
        by_letter = {(m.partition, m.offset): m for letters in grouped.values() for m in letters}
        ledger = _ledger_of(client, selection.stream)
        earlier = _earlier(ledger, by_letter, time.time())
        finished = 0
        for claim in {id(ledger.owner[x]): ledger.owner[x] for x in earlier["stale"]}.values():
            finished += _finish(client, selection.stream, ledger, claim)
        fresh = sorted(x for x in by_letter if x not in ledger.owner)
        targets: dict[str, dict[str, int]] = {}
        producer = None
        if fresh:
            producer = new_producer(selection.stream)
            ledger_append(client, ledger, "claim", producer, fresh)
            read_ledger(client, selection.stream, ledger.created, ledger)  # up to our claim: who came first
            mine = ledger.claim_of(producer)
            won = sorted(mine.won) if mine is not None else []
            targets = _publish(client, selection.stream, producer, [by_letter[x] for x in won])
            ledger_append(client, ledger, "done", producer)
            if mine is not None:
                mine.done = True
        # After our claim: every letter has its first claim (ours, or one that beat us to it).
        ours = {x for x in by_letter if producer is not None and ledger.owner[x].producer == producer}
        before = _earlier(ledger, set(by_letter) - ours, time.time())
    return {
        "stream": selection.stream,
        "selection": selection.describe(),
        "count": len(by_letter),
        "replayed": sum(t["written"] for t in targets.values()),
        "already_replayed": len(by_letter) - len(ours),
        "skipped": _listed(set(by_letter) - ours),
        "in_progress": _listed(before["running"]),
        "finished_for_earlier": finished,
        "targets": targets,
        "producer_id": producer,
    }


# -- moving a cursor ------------------------------------------------------------------------------
def find_pipeline(client: LiftbridgeClient, dag_id: str, task_id: str, map_index: int = -1) -> PipelineEntry:
    """The registry's newest entry of the task.

    :raises NoSuchStreamError: no such pipeline in the registry.
    """
    found = [e for e in read_pipelines(client) if (e.dag_id, e.task_id, e.map_index) == (dag_id, task_id, map_index)]
    if not found:
        raise NoSuchStreamError(
            f"no pipeline {dag_id}.{task_id} in the registry (it records itself when it plans a run)"
        )
    return max(found, key=lambda e: e.recorded_at)


def parse_target(offset: str | None, time: str | None) -> tuple[int | None, dt.datetime | None]:
    """Where to move a cursor to: an offset or a time, exactly one.

    :raises SearchInputError: neither or both, or one that does not parse (the text says what to type).
    """
    at_offset, at_time = parse_offset(offset, "offset"), parse_time(time, "time")
    if (at_offset is None) == (at_time is None):
        raise SearchInputError("offset", "type an offset (a whole number, e.g. 1200) or pick a time, not both")
    return at_offset, at_time


def move_cursor(
    client: LiftbridgeClient,
    entry: PipelineEntry,
    *,
    partitions: Sequence[int] | None,
    at_offset: int | None,
    at_time: dt.datetime | None,
) -> dict[str, Any]:
    """Move the pipeline's position so its next run reads from ``at_offset`` (the same in each
    partition) or from the first message at or after ``at_time``, in ``partitions`` (default:
    all); give one of the two (:func:`parse_target`).

    :raises SearchInputError: an offset past a partition's next offset, a partition the stream
        lacks, a pipeline reading by interval, a group with members (nothing moved).
    :raises NoSuchStreamError: the stream is gone (nothing moved).
    """
    if entry.mode == "DataInterval":
        raise SearchInputError(
            "offset",
            f"{entry.dag_id}.{entry.task_id} reads by data interval: it has no position to move"
            " (clear its runs instead)",
        )
    if entry.group_id:
        if client.fetch_group_metadata([entry.group_id]).get(entry.group_id) is not None:
            raise SearchInputError(
                "offset",
                f"consumer group {entry.group_id!r} has members: they would commit over the move; stop them first",
            )
        if at_offset == 0:
            raise SearchInputError(
                "offset",
                "a consumer group cannot be moved to offset 0 (no position: its members would start at their"
                " auto_offset); type 1 or more, or a time",
            )
    hws = _hws(client, entry.stream, "stream")
    chosen = sorted(set(partitions)) if partitions else sorted(hws)
    for p in chosen:
        if p not in hws:
            raise SearchInputError("partition", f"stream {entry.stream!r} has no partition {p}; it has {sorted(hws)}")
    targets: dict[int, int] = {}
    for p in chosen:
        if at_offset is not None:
            if at_offset > hws[p] + 1:
                raise SearchInputError(
                    "offset",
                    f"partition {p} ends at offset {hws[p]}: type at most {hws[p] + 1} (read only messages"
                    " to come), or pick a time",
                )
            targets[p] = at_offset
        else:
            assert at_time is not None
            targets[p] = first_offset_at(client, entry.stream, p, at_time, hws[p]) if hws[p] >= 0 else 0
    end_cursor, tag_cursor = plan_cursor_ids(entry.position_cursor, entry.plan_key)
    moved = []
    for p, target in targets.items():
        before = client.fetch_cursor(entry.position_cursor, entry.stream, p)
        if target == 0 and client.fetch_cursor(end_cursor, entry.stream, p) == NO_PLAN:
            # No position and no plan would start where the task's start_at says: an (empty) plan
            # makes the planner start at offset 0 (see RangePlanner._plan_partition).
            client.set_cursor(end_cursor, entry.stream, p, 0)
        client.set_cursor(entry.position_cursor, entry.stream, p, target - 1)
        client.set_cursor(tag_cursor, entry.stream, p, VOID_TAG)
        moved.append({"partition": p, "from": before + 1 if before >= 0 else None, "to": target})
    return {
        "pipeline": f"{entry.dag_id}.{entry.task_id}",
        "stream": entry.stream,
        "cursor": entry.position_cursor,
        "at": at_time.isoformat() if at_time else None,
        "moved": moved,
    }
