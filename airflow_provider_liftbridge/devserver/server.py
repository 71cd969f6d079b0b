"""The dev server in this process: :class:`DevServer` runs a :class:`~.core.ServerCore` on a background
thread's event loop for tests and local scripts.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from .config import DEFAULT_CURSORS_PARTITIONS, ServerConfig
from .core import ServerCore
from .errors import DevServerError, ServerStateError
from .groups import DEFAULT_GROUP_TIMEOUT
from .grpc_h2 import TransportStats
from .model import ClusterTimings, RestartHold
from .natsproc import NatsServerSecurity


class DevServer:
    """A dev server in this process, on a background thread's event loop (see docs/devserver.md).

    :param brokers: number of gRPC brokers (cluster mode when > 1).
    :param data_dir: data directory; ``None`` means a temporary one removed by :meth:`stop`.
    :param host: listen address.
    :param nats_url: an external NATS server; ``None`` starts a ``nats-server`` child.
    :param ports: gRPC ports, one per broker (default: free ports).
    :param nats_port: port of the NATS child (default: a free port).
    :param fsync: fsync every log write.
    :param grpc_transport: ``"h2"`` or ``"aio"`` (default: :func:`default_transport`, normally ``h2``).
    :param tls_cert_file: serve TLS with this PEM certificate (needs ``tls_key_file``).
    :param tls_key_file: PEM private key of the certificate.
    :param tls_client_ca_file: require client certificates signed by this CA (mutual TLS).
    :param groups_consumer_timeout: consumer-group member timeout in seconds (Liftbridge default 15).
    :param groups_coordinator_timeout: consumer-group coordinator-report window in seconds (default 15).
    :param timings: cluster mode's time-outs, minimum ISR and restart window
        (:class:`ClusterTimings`; default: Liftbridge's, 15 s; ``ClusterTimings.fast()`` for tests).
    :param cursors: ``False`` runs with cursors off, as a stock Liftbridge does by default.
    :param cursors_partitions: partitions of the internal ``__cursors`` stream (default 1).
    :param nats_security: TLS and authentication of the NATS child (see :class:`NatsServerSecurity`).
    :raises ValueError: bad broker count, ports or transport.
    :raises TlsConfigError: incomplete TLS settings.

    With ``brokers > 1`` every broker keeps its own replica of the partitions it hosts, followers
    fetch from the leader, the high watermark is what the whole ISR has (``newest_offset`` can be
    ahead of it), acks with policy ALL wait for the ISR, and these fault hooks reproduce what breaks
    on a real cluster (see docs/devserver.md, "Cluster mode"):

    - :meth:`stall_broker` / :meth:`resume_broker`: SIGSTOP / SIGCONT of a broker;
    - :meth:`kill_broker`: SIGKILL of one broker (leadership moves after the leader timeout);
      :meth:`start_broker` brings it back;
    - :meth:`stop_broker`: a clean stop (leadership moves at once);
    - :meth:`restart_cluster`: every broker down, then up through the restart window;
    - :meth:`cut_broker_from_nats` / :meth:`cut_broker_from_peers` / :meth:`heal_broker`: a broker
      cut off from its peers while its clients still reach it (a minority leader);
    - :attr:`metadata_leader` / :meth:`move_metadata_leader`: which broker is the metadata leader
      (metadata changes wait while it is stalled or dead, until another is elected).
    """

    def __init__(
        self,
        brokers: int = 1,
        data_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        nats_url: str | None = None,
        *,
        ports: Sequence[int] | None = None,
        nats_port: int = 0,
        fsync: bool = False,
        grpc_transport: str | None = None,
        tls_cert_file: str | os.PathLike[str] | None = None,
        tls_key_file: str | os.PathLike[str] | None = None,
        tls_client_ca_file: str | os.PathLike[str] | None = None,
        groups_consumer_timeout: float = DEFAULT_GROUP_TIMEOUT,
        groups_coordinator_timeout: float = DEFAULT_GROUP_TIMEOUT,
        timings: ClusterTimings | None = None,
        cursors: bool = True,
        cursors_partitions: int = DEFAULT_CURSORS_PARTITIONS,
        nats_security: NatsServerSecurity | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError(f"brokers must be at least 1, got {brokers}")
        if ports is not None and len(ports) != brokers:
            raise ValueError(f"ports lists {len(ports)} ports for {brokers} brokers; give one per broker")
        config = ServerConfig(
            data_dir=Path(),
            host=host,
            ports=list(ports) if ports is not None else [0] * brokers,
            nats_url=nats_url,
            nats_port=nats_port,
            fsync=fsync,
            grpc_transport=grpc_transport,
            tls_cert_file=_opt_path(tls_cert_file),
            tls_key_file=_opt_path(tls_key_file),
            tls_client_ca_file=_opt_path(tls_client_ca_file),
            groups_consumer_timeout=groups_consumer_timeout,
            groups_coordinator_timeout=groups_coordinator_timeout,
            timings=timings,
            cursors=cursors,
            cursors_partitions=cursors_partitions,
            nats_security=nats_security,
        )
        self._tmp_dir = None if data_dir is not None else tempfile.mkdtemp(prefix="liftbridge-devserver-")
        self.data_dir = config.data_dir = Path(data_dir if data_dir is not None else self._tmp_dir)  # type: ignore[arg-type]
        self._config = config
        self._core: ServerCore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> DevServer:
        """Start serving; returns when every broker accepts calls.

        :raises DevServerError: any start-up failure (NATS missing, port in use, bad data dir).
        :raises ServerStateError: already started.
        """
        if self._thread is not None:
            raise ServerStateError("this DevServer is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        core = ServerCore(self._config)

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(core.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            self._loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                _cancel_all(loop)
                loop.close()

        # The NATS child is started from this thread and dies with it (PR_SET_PDEATHSIG), so the
        # thread lives exactly as long as the server.
        self._thread = threading.Thread(target=run, name="liftbridge-devserver", daemon=True)
        self._core = core
        self._thread.start()
        if not ready.wait(timeout):
            raise DevServerError(f"the dev server did not start within {timeout:.0f}s")
        if failure:
            self._thread.join()
            self._thread = None
            self._core = None
            self._remove_tmp()
            exc = failure[0]
            if isinstance(exc, DevServerError):
                raise exc
            raise DevServerError(f"the dev server failed to start: {exc}") from exc
        atexit.register(self.stop)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving and stop the NATS child; remove the temporary data directory. Idempotent."""
        thread, loop, core = self._thread, self._loop, self._core
        if thread is None or loop is None or core is None:
            return
        self._thread = self._loop = self._core = None
        atexit.unregister(self.stop)
        try:
            asyncio.run_coroutine_threadsafe(core.stop(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self._tmp_dir is not None:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        if self._loop is None:
            coro.close()
            raise ServerStateError("the dev server is not running; call start() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- addresses ------------------------------------------------------------
    def _running_core(self) -> ServerCore:
        if self._core is None:
            raise ServerStateError("the dev server is not running; call start() first")
        return self._core

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every broker, in broker order."""
        return self._running_core().addresses

    @property
    def address(self) -> str:
        """``host:port`` of broker 0."""
        return self.addresses[0]

    @property
    def nats_url(self) -> str:
        """URL of the NATS server the dev server uses."""
        return self._running_core().nats_url

    @property
    def broker_ids(self) -> list[str]:
        """Broker ids as FetchMetadata reports them, in broker order."""
        return [b.id for b in self._running_core().brokers]

    def grpc_stats(self, index: int = 0) -> TransportStats | None:
        """A snapshot of broker ``index``'s gRPC transport: connections, unfinished calls, response
        bytes buffered for clients (``None`` on the ``aio`` transport or a stopped broker).

        :raises ServerStateError: the server is not running.
        """
        core = self._running_core()

        async def snapshot() -> TransportStats | None:
            return core.grpc_stats(index)

        return self._run(snapshot())  # type: ignore[no-any-return]

    # -- cluster --------------------------------------------------------------
    def stop_broker(self, index: int) -> None:
        """Stop broker ``index``; its partitions' leadership moves to live brokers.

        :raises IndexError: no such broker.
        """
        self._run(self._running_core().stop_broker(index))

    def start_broker(self, index: int) -> None:
        """Start broker ``index`` again on its port (after :meth:`stop_broker` or :meth:`kill_broker`).
        Its replicas cut off what a new leader never had, catch up and rejoin the ISR before this returns.

        :raises IndexError: no such broker.
        """
        self._run(self._running_core().start_broker(index))

    def kill_broker(self, index: int) -> None:
        """Kill broker ``index`` like SIGKILL: its calls end, but its leaderships move only after
        ``timings.replica_max_leader_timeout`` (to an ISR member that runs), and it leaves other
        partitions' ISRs after ``timings.replica_max_lag_time``. :meth:`start_broker` brings it back.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().kill_broker(index))

    def stall_broker(self, index: int) -> None:
        """Freeze broker ``index`` like SIGSTOP: as a follower it stops fetching (the leader keeps
        appending, ``newest_offset`` moves, the high watermark and ALL acks wait until it leaves the
        ISR after ``replica_max_lag_time`` or resumes); as a leader it stops serving and is replaced
        after ``replica_max_leader_timeout``; calls to it wait. Undo with :meth:`resume_broker`.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().stall_broker(index))

    def resume_broker(self, index: int) -> None:
        """Let a stalled broker run again (SIGCONT); a former leader that lost its leadership cuts
        its uncommitted tail and follows the new leader.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().resume_broker(index))

    def cut_broker_from_nats(self, index: int, kind: str = "cut") -> None:
        """Cut broker ``index`` off from NATS, and so from its peers, while clients still reach its
        port: it answers from what it last knew, takes nothing it is sent, and commits nothing; its
        leaderships move after ``replica_max_leader_timeout`` (isolation.py). Undo with
        :meth:`heal_broker`. ``kind`` (:data:`~.model.KINDS`) makes the cut one way
        (``"cut-in"``: what it receives is lost; ``"cut-out"``: what it sends), or only ``"slow"``
        or ``"lossy"`` (docs/devserver.md, "A broker cut off").

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        :raises ValueError: an unknown ``kind``.
        """
        self._run(self._running_core().cut_broker_from_nats(index, kind))

    def cut_broker_from_peers(self, index: int, kind: str = "cut") -> None:
        """Cut broker ``index`` off from its peers only: as :meth:`cut_broker_from_nats`, but it
        appends what it is sent for the partitions it still leads (LEADER acks, never ALL acks).

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        :raises ValueError: an unknown ``kind``.
        """
        self._run(self._running_core().cut_broker_from_peers(index, kind))

    def heal_broker(self, index: int) -> None:
        """Heal a broker's cut: a former leader cuts back the tail the new leader never had and follows.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().heal_broker(index))

    def replace_history(self, stream: str, partition: int, index: int, keep_to: int) -> int:
        """A test hook, no upstream call: a model of Liftbridge v1.9.0-72's wrong truncation (issue
        59, seed 59919). Broker ``index``, a running follower of the partition, cuts its log after
        offset ``keep_to``, committed records included (Liftbridge's fallback to a lagging high
        watermark), and is elected leader at once; the other replicas follow its history. Returns
        how many records its log lost (docs/devserver.md, "A replaced history").

        :raises IndexError: no such broker.
        :raises ValueError: no such partition, or the broker is not a running follower of it.
        :raises ServerStateError: a single-broker server.
        """
        return int(self._run(self._running_core().replace_history(stream, partition, index, keep_to)))

    @property
    def metadata_leader(self) -> int:
        """Index of the broker that is the metadata (Raft) leader (broker 0 at start; another one
        after it was stalled or dead for ``timings.metadata_election_timeout``).

        :raises ServerStateError: a single-broker server.
        """
        return self._running_core().metadata_leader()

    def move_metadata_leader(self, index: int) -> None:
        """Make broker ``index`` the metadata leader at once (then stall it to hang metadata changes).

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().move_metadata_leader(index))

    # -- consumer groups' clock (a test hook) ------------------------------------
    def hold_group_clock(self) -> None:
        """Stop the consumer groups' clock: no member times out and no coordinator-report window
        closes until :meth:`step_group_clock` moves it (heartbeats still count, from the held time).
        Undo with :meth:`release_group_clock`. Every broker shares it; a restart keeps it held.

        :raises ServerStateError: the server is not running.
        """
        groups = self._running_core().groups

        async def hold() -> None:
            groups.hold_clock()

        self._run(hold())

    def step_group_clock(self, seconds: float) -> list[tuple[str, str]]:
        """Move the held group clock on by ``seconds``; the members whose deadline that passes are
        timed out before this returns (not under a coordinator that is down).

        :returns: ``(group id, consumer id)`` of each member timed out by this step.
        :raises RuntimeError: the clock is not held.
        :raises ServerStateError: the server is not running.
        """
        groups = self._running_core().groups

        async def step() -> list[tuple[str, str]]:
            return groups.step_clock(seconds)

        return self._run(step())  # type: ignore[no-any-return]

    def release_group_clock(self) -> None:
        """Let the group clock run again, on from the time it was held at.

        :raises ServerStateError: the server is not running.
        """
        groups = self._running_core().groups

        async def release() -> None:
            groups.release_clock()

        self._run(release())

    def restart_cluster(self, down: float = 0.0, hold: RestartHold | None = None) -> None:
        """Restart every broker at once after ``down`` seconds, from the data directory, through the
        restart window (``timings.restart_*``: metadata without streams, then no leaders and Publish
        "no such stream", then high watermarks -1 while nothing commits), on the same ports.

        With ``hold`` (a test hook) the window stays at the start of that phase when this returns,
        however slowly the test runs, until :meth:`release_restart_window` lets it run on from there:
        ``"no-leaders"`` (streams listed, no partition leader, NATS publishes dropped) or
        ``"no-commits"`` (leaders elected; they store what they are sent, commit nothing and read
        high watermarks of -1).

        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().restart_cluster(down, hold), timeout=30.0 + down)

    def release_restart_window(self) -> None:
        """Let a restart window held by ``restart_cluster(hold=...)`` run on.

        :raises ServerStateError: a single-broker server, or the server is not running.
        """
        self._run(self._running_core().release_restart_window())


def _opt_path(path: str | os.PathLike[str] | None) -> str | None:
    return os.fspath(path) if path is not None else None


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
