"""ADR 8 rule 5 done once for publishers writing side by side (``defer_check=True``, the tasks of
a Spark job): each leaves what lies between its acknowledged records unread, and
``check_unread`` reads only the offsets none of them was acknowledged for.

On the scripted partition of ``test_exactly_once_neighbours.py`` (another writer between every
run of 100 records) and on the dev server with two real publishers. A duplicate of a producer's
own sequence number between its records must still fail; its siblings' records must not be read.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import PRODUCER_HEADER, SEQ_HEADER, ConcurrentProducerError
from airflow_provider_liftbridge.client.exactly_once.between import Unread, check_unread, residual, runs_of
from airflow_provider_liftbridge.client.exactly_once.publisher import ExactlyOncePublisher
from airflow_provider_liftbridge.client.publishing.options import PublishOptions

from .scripted import scripted_client
from .test_exactly_once_neighbours import Busy, Interleaved, record
from .test_exactly_once_scripted import TIMEOUT, Clock, _ours, _publisher


def _deferred(intruder: Any = None) -> tuple[Clock, Busy, ExactlyOncePublisher, LiftbridgeClient]:
    clock = Clock()
    part = Busy(clock, busy=False)
    client = scripted_client(part.answer, timeout=TIMEOUT)
    sender = Interleaved(part, 100, intruder=intruder)
    return clock, part, _publisher(client, sender, clock, defer_check=True), client  # type: ignore[arg-type]


def _offsets_of(part: Busy, producer: bytes) -> list[int]:
    return [o for o, m in enumerate(part.log) if m.headers.get(PRODUCER_HEADER) == producer]


def _sibling(part: Busy) -> Unread:
    """The other writer as a sibling publisher: acknowledged for every record it wrote."""
    return Unread("other", acked={0: runs_of(_offsets_of(part, b"other"))})


def test_a_deferred_call_leaves_the_offsets_between_its_records_to_the_caller() -> None:
    clock, part, publisher, _ = _deferred()

    result = publisher.publish([b"r%d" % i for i in range(1000)])

    assert (result.written, result.skipped) == (1000, 0)
    assert part.reads == []  # nothing read back: no verification read at the end of the call
    unread = publisher.unread()
    mine = _offsets_of(part, b"p")
    assert unread.acked == {0: runs_of(mine)}
    assert unread.gaps == {0: runs_of(o for o in range(min(mine), max(mine)) if o not in mine)}
    assert Unread.from_json(unread.to_json()) == unread


def test_offsets_a_sibling_was_acknowledged_for_are_not_read() -> None:
    clock, part, publisher, client = _deferred()
    publisher.publish([b"r%d" % i for i in range(1000)])

    assert check_unread(client, "s", [publisher.unread(), _sibling(part)]) == 0
    assert part.reads == []
    # Without the sibling's acks its records are read (as rule 5 read them in each call before).
    between = len(_offsets_of(part, b"other"))
    assert check_unread(client, "s", [publisher.unread()]) == between
    assert clock.now == 0.0  # everything committed: no wait


def test_a_duplicate_of_its_own_between_its_records_still_fails() -> None:
    # A zombie try of the same producer stores sequence number 0 again between two runs; the
    # other writer's records stand for siblings, acknowledged.
    clock, part, publisher, client = _deferred(lambda i: record(b"p", 0) if i == 4 else record(b"other", i))

    result = publisher.publish([b"r%d" % i for i in range(300)])  # deferred: the call itself succeeds

    assert result.written == 300 and _ours(part)[0] == 2
    with pytest.raises(ConcurrentProducerError, match=r"sequence number 0\).*neither wrote nor read"):
        check_unread(client, "s", [publisher.unread(), _sibling(part)])
    zombie = [o for o in _offsets_of(part, b"p") if int(part.log[o].headers[SEQ_HEADER]) == 0][1]
    assert part.reads == [(zombie, zombie)]  # only the offset no one was acknowledged for


def test_a_record_of_a_producer_in_a_siblings_gap_only_is_not_its_duplicate() -> None:
    # Offsets 10..12 lie between q's records only: p's record there (p read it, e.g. an earlier try
    # of p found by p's resume) is not a copy p failed to see.
    unread = [Unread("p", gaps={}, acked={0: [(0, 9)]}), Unread("q", gaps={0: [(10, 12)]}, acked={0: [(13, 20)]})]
    assert residual(unread) == {0: {"q": [(10, 12)]}}


@pytest.mark.parametrize(
    ("gaps", "acked", "expected"),
    [
        ([(5, 9)], [(0, 4), (5, 20)], {}),
        ([(5, 9)], [(6, 7)], {0: {"x": [(5, 5), (8, 9)]}}),
        ([(5, 9), (30, 40)], [(0, 5), (9, 35)], {0: {"x": [(6, 8), (36, 40)]}}),
        ([(5, 9)], [], {0: {"x": [(5, 9)]}}),
    ],
)
def test_residual(gaps: list[tuple[int, int]], acked: list[tuple[int, int]], expected: dict[int, Any]) -> None:
    assert residual([Unread("x", gaps={0: gaps}), Unread("y", acked={0: acked})]) == expected


# -- on the dev server ---------------------------------------------------------------------------


@pytest.fixture
def client(lb_address: str) -> LiftbridgeClient:
    with LiftbridgeClient(lb_address, timeout=5.0) as c:
        yield c


def _eo(client: LiftbridgeClient, stream: str, producer: str) -> ExactlyOncePublisher:
    return ExactlyOncePublisher(client, stream, producer, options=PublishOptions(partition=0), defer_check=True)


def test_two_publishers_side_by_side_check_nothing_when_only_they_wrote(
    client: LiftbridgeClient, lb_address: str, stream_name: str
) -> None:
    client.create_stream(stream_name, stream_name)
    unread: dict[str, Unread] = {}

    def write(name: str) -> None:
        with LiftbridgeClient(lb_address, timeout=5.0) as own:
            publisher = _eo(own, stream_name, name)
            for group in range(20):  # small calls, so the two interleave
                publisher.publish([b"%s-%d" % (name.encode(), group * 50 + i) for i in range(50)])
            unread[name] = publisher.unread()

    threads = [threading.Thread(target=write, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert check_unread(client, stream_name, list(unread.values())) == 0
    stored = Counter(m.value for m in client.subscribe(stream_name, start_at=0, stop_at=1999))
    assert len(stored) == 2000 and set(stored.values()) == {1}


def test_a_zombie_copy_between_a_publishers_calls_fails_the_check(client: LiftbridgeClient, stream_name: str) -> None:
    client.create_stream(stream_name, stream_name)
    a, b = _eo(client, stream_name, "a"), _eo(client, stream_name, "b")
    a.publish([b"a%d" % i for i in range(10)])
    b.publish([b"b%d" % i for i in range(5)])  # a sibling between a's calls
    # A zombie try of "a" stores its record 3 again (both headers, as the publisher writes them).
    client.publish(stream_name, b"a3", headers={PRODUCER_HEADER: b"a", SEQ_HEADER: b"3"})
    a.publish([b"a%d" % i for i in range(10, 20)])  # deferred: the call itself succeeds

    assert a.unread().gaps == {0: [(10, 15)]}
    with pytest.raises(ConcurrentProducerError, match=r"offset 15 .*sequence number 3"):
        check_unread(client, stream_name, [a.unread(), b.unread()])
