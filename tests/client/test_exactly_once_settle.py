"""A resumption's wait for its partitions (``TailReader.settle``) ends only when every partition reads
settled in the same round: a partition found settled early is read again while the others are
waited for.

Seed 59968 of the real-cluster campaign (docs/reliability.md): a resumption found partition 0
settled at once, then waited 13 s for partitions 1 and 2. Meanwhile the first send's records for
partition 0, held in the leader's NATS connection during a cut, reached the leader; the resumption
sent them again, and 1,365 records were stored twice. Here the dev server stands in for the late
delivery: while another partition is still moving, a record of the producer that the caller is
about to send again lands in a partition that had already read settled. The wait must find it.
"""

from __future__ import annotations

import time

from airflow_provider_liftbridge.client import LiftbridgeClient
from airflow_provider_liftbridge.client.exactly_once import PRODUCER_HEADER, SEQ_HEADER
from airflow_provider_liftbridge.client.exactly_once.state import PartitionState, ProducerState
from airflow_provider_liftbridge.client.exactly_once.tail import TailReader, Timer, Waits

PRODUCER = "settle-59968"
#: The record the caller would send again (its ack was lost); its first copy lands late.
LATE_SEQ = 7
#: Rounds during which another producer keeps partition 1 moving (so it is still waited for).
MOVING_ROUNDS = 6
#: The round after which the late copy lands in partition 0 (settled two rounds in).
LATE_AFTER = 3


def test_a_record_landing_in_a_partition_found_settled_while_another_is_waited_for_is_found(
    lb_address: str, stream_name: str
) -> None:
    with LiftbridgeClient(lb_address) as client:
        client.create_stream(stream_name, stream_name, partitions=2)
        state = ProducerState(PRODUCER)
        for p in (0, 1):
            state.parts[p] = PartitionState(scan_start=0, scanned_to=-1, next_offset=0)
        rounds = 0

        def sleep(seconds: float) -> None:
            # Runs between two rounds of readings, so each write lands between two readings.
            nonlocal rounds
            rounds += 1
            if rounds <= MOVING_ROUNDS:
                client.publish(stream_name, b"other producer", partition=1)
            if rounds == LATE_AFTER:
                headers = {PRODUCER_HEADER: PRODUCER.encode(), SEQ_HEADER: str(LATE_SEQ).encode()}
                client.publish(stream_name, b"late copy", partition=0, headers=headers)
            time.sleep(seconds)

        # No bound is reached here: partition 1 stands still once the writes stop, and the wait's
        # bounds (timeout, tail_wait) are far above the few rounds this takes.
        reader = TailReader(client, stream_name, state, Waits(settle=0.05, timeout=600.0), Timer(sleep=sleep))
        found = reader.settle([0, 1], {LATE_SEQ})

        assert rounds > MOVING_ROUNDS  # partition 1 was still waited for after the late copy landed
        assert found[0] == {LATE_SEQ: 0}  # before the fix: {} (partition 0 was never read again)
        assert LATE_SEQ in state.seen
