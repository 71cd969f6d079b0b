"""Running the dev server: the async core, the in-process :class:`DevServer` and the :class:`DevServerProcess` wrapper.

:class:`ServerCore` is the server itself (NATS child or external NATS, the store,
the NATS ingest and one gRPC listener per broker, on the ``h2`` transport or ``grpc.aio``) on the caller's event
loop; the CLI runs it on the main thread. :class:`DevServer` runs a core on a
background thread's event loop for tests and local scripts. :class:`DevServerProcess`
runs the CLI as a child process so it can be SIGKILLed and restarted.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import selectors
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from grpc import aio

from .errors import DevServerError, NatsServerStartError, PortInUseError, ServerStateError, TlsConfigError
from .groups import DEFAULT_GROUP_TIMEOUT, ConsumerGroups
from .grpc_h2 import H2GrpcServer, TransportStats, method_table, server_ssl_context
from .nats_ingest import NatsIngest
from .natsproc import NatsServerProcess, NatsServerSecurity, check_port_free
from .replication import Cluster, ClusterTimings
from .service import SERVICE, ApiService
from .state import BrokerSlot, Store

log = logging.getLogger(__name__)

READY_PREFIX = "liftbridge-devserver ready"
_RETENTION_TICK = 0.5
_GRPC_OPTIONS = [
    # Without this, a second server could silently share a port that is in use.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


#: The gRPC transports the dev server can serve its API with (see docs/devserver.md, ADR 5).
GRPC_TRANSPORTS = ("h2", "aio")
#: Environment variable that changes the default transport (for running a test suite on ``aio``).
TRANSPORT_ENV = "LIFTBRIDGE_DEVSERVER_GRPC_TRANSPORT"


def default_transport() -> str:
    """The transport used when none is given: ``$LIFTBRIDGE_DEVSERVER_GRPC_TRANSPORT``, else ``h2``."""
    return os.environ.get(TRANSPORT_ENV) or "h2"


@dataclass
class ServerConfig:
    """What a dev server listens on and where it keeps its data.

    :param data_dir: directory of the logs and metadata (created if missing).
    :param host: address the gRPC brokers (and a NATS child) listen on.
    :param ports: one gRPC port per broker; 0 picks a free port.
    :param nats_url: use this NATS server instead of starting a child.
    :param nats_port: port of the NATS child; 0 picks a free port.
    :param fsync: fsync every log write (default: page cache only, which survives a process kill).
    :param grpc_transport: ``"h2"`` (asyncio + the ``h2`` library, coalesced writes) or ``"aio"``
        (``grpc.aio``); ``None`` means :func:`default_transport`.
    :param tls_cert_file: PEM certificate (chain) of the gRPC ports; with ``tls_key_file``, serves TLS only.
    :param tls_key_file: PEM private key of that certificate.
    :param tls_client_ca_file: PEM CA bundle; when given, clients must present a certificate it signed (mTLS).
    :param groups_consumer_timeout: seconds a consumer-group member may go without fetching its
        assignments before it is removed (Liftbridge's ``groups.consumer.timeout``).
    :param groups_coordinator_timeout: seconds within which a majority of a group's members must report
        its coordinator for a failover (Liftbridge's ``groups.coordinator.timeout``).
    :param timings: cluster-mode time-outs, minimum ISR and restart window (more than one broker);
        ``None`` means Liftbridge's defaults (:class:`~.replication.ClusterTimings`).
    :param cursors: serve SetCursor/FetchCursor; ``False`` answers them as a stock Liftbridge with
        ``cursors.stream.partitions: 0`` does (INTERNAL "Cursors stream does not exist").
    :param nats_security: TLS and authentication of the NATS child, and (its ``client``) how the
        dev server connects to NATS (also to an external ``nats_url``).
    :raises ValueError: an unknown transport.
    :raises TlsConfigError: a certificate without a key (or the reverse), or a client CA without them.
    """

    data_dir: Path
    host: str = "127.0.0.1"
    ports: list[int] = field(default_factory=lambda: [0])
    nats_url: str | None = None
    nats_port: int = 0
    fsync: bool = False
    grpc_transport: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    groups_consumer_timeout: float = DEFAULT_GROUP_TIMEOUT
    groups_coordinator_timeout: float = DEFAULT_GROUP_TIMEOUT
    timings: ClusterTimings | None = None
    cursors: bool = True
    nats_security: NatsServerSecurity | None = None

    def __post_init__(self) -> None:
        if self.grpc_transport is None:
            self.grpc_transport = default_transport()
        if self.grpc_transport not in GRPC_TRANSPORTS:
            raise ValueError(
                f"unknown gRPC transport {self.grpc_transport!r}; choose one of {', '.join(GRPC_TRANSPORTS)}"
            )
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise TlsConfigError("TLS needs both a certificate file and its key file; give both or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise TlsConfigError("a client CA (mutual TLS) needs the server's certificate and key files too")

    @property
    def tls(self) -> bool:
        """Whether the gRPC ports serve TLS."""
        return bool(self.tls_cert_file)

    def ssl_context(self) -> ssl.SSLContext:
        """The server TLS context (ALPN ``h2``), checked by loading every file.

        :raises TlsConfigError: a file is missing or unreadable, or the key does not match the certificate.
        """
        assert self.tls_cert_file and self.tls_key_file
        try:
            return server_ssl_context(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(
                f"cannot use the TLS files (cert {self.tls_cert_file}, key {self.tls_key_file}, "
                f"client CA {self.tls_client_ca_file}): {exc}; check the paths and that the key matches the certificate"
            ) from exc


class _GrpcFront:
    """One broker's gRPC listener, whichever transport serves it (only the I/O differs)."""

    async def start(self, host: str, port: int) -> int:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def stats(self) -> TransportStats | None:
        """Transport statistics, when the transport keeps them."""
        return None


class _H2Front(_GrpcFront):
    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler], tls: ssl.SSLContext | None) -> None:
        self._server = H2GrpcServer(method_table(SERVICE, handlers), tls)

    async def start(self, host: str, port: int) -> int:
        try:
            return await self._server.start(host, port)
        except OSError as exc:
            raise PortInUseError(f"gRPC port {port} on {host} cannot be bound ({exc}); choose another port") from exc

    async def stop(self) -> None:
        await self._server.stop(None)

    def stats(self) -> TransportStats:
        return self._server.stats()


class _AioFront(_GrpcFront):
    def __init__(self, handlers: dict[str, grpc.RpcMethodHandler], config: ServerConfig) -> None:
        self._server = aio.server(options=_GRPC_OPTIONS)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self._config = config

    async def start(self, host: str, port: int) -> int:
        cfg = self._config
        try:
            if cfg.tls:
                assert cfg.tls_cert_file and cfg.tls_key_file
                creds = grpc.ssl_server_credentials(
                    [(Path(cfg.tls_key_file).read_bytes(), Path(cfg.tls_cert_file).read_bytes())],
                    root_certificates=Path(cfg.tls_client_ca_file).read_bytes() if cfg.tls_client_ca_file else None,
                    require_client_auth=bool(cfg.tls_client_ca_file),
                )
                bound = self._server.add_secure_port(f"{host}:{port}", creds)
            else:
                bound = self._server.add_insecure_port(f"{host}:{port}")
        except RuntimeError as exc:
            raise PortInUseError(f"gRPC port {port} on {host} cannot be bound; choose another port") from exc
        await self._server.start()
        return int(bound)

    async def stop(self) -> None:
        await self._server.stop(None)


class ServerCore:
    """The dev server on the running event loop. Start with :meth:`start`, end with :meth:`stop`."""

    def __init__(self, config: ServerConfig) -> None:
        if not config.ports:
            raise ValueError("a dev server needs at least one broker (ports is empty)")
        self.config = config
        self.brokers = [BrokerSlot(i, f"broker-{i}", config.host, p) for i, p in enumerate(config.ports)]
        self.nats_url = config.nats_url or ""
        self._nats_proc: NatsServerProcess | None = None
        self._store: Store | None = None
        self._ingest: NatsIngest | None = None
        self._servers: dict[int, _GrpcFront] = {}
        # Loaded once: a bad certificate fails start() before anything else is started.
        self._ssl: ssl.SSLContext | None = config.ssl_context() if config.tls else None
        self._retention_task: asyncio.Task[None] | None = None
        self._groups: ConsumerGroups | None = None

    @property
    def store(self) -> Store:
        if self._store is None:
            raise ServerStateError("the dev server is not running; call start() first")
        return self._store

    @property
    def addresses(self) -> list[str]:
        return [f"{b.host}:{b.port}" for b in self.brokers]

    async def start(self) -> None:
        """Start NATS (unless external), open the data directory, and serve every broker.

        :raises NatsServerNotFoundError, NatsServerStartError, PortInUseError, DataDirError: see their docs.
        """
        cfg = self.config
        try:
            for b in self.brokers:
                check_port_free(cfg.host, b.port, f"gRPC (broker {b.index})")
            if not cfg.nats_url:
                self._nats_proc = NatsServerProcess(cfg.host, cfg.nats_port, security=cfg.nats_security)
                self.nats_url = self._nats_proc.start()
                self._nats_proc.supervise()  # a dead child is restarted on the same port
            self._ingest = NatsIngest(self.nats_url, security=cfg.nats_security.client if cfg.nats_security else None)
            try:
                await self._ingest.connect()
            except Exception as exc:
                raise NatsServerStartError(f"cannot connect to NATS at {self.nats_url}: {exc}") from exc
            await self._open_store()
            self._retention_task = asyncio.get_running_loop().create_task(self._retention_loop())
        except BaseException:
            await self.stop()
            raise

    async def _open_store(self) -> None:
        """Read the data directory and serve every broker (a cluster with streams starts in the restart window)."""
        assert self._ingest is not None
        for b in self.brokers:
            b.live, b.stalled = True, False
        store = self._store = Store(
            self.config.data_dir, self.brokers, fsync=self.config.fsync, timings=self.config.timings
        )
        store.enforce_age_retention()
        store.listener = self._ingest
        cfg = self.config
        if self._groups is None:
            self._groups = ConsumerGroups(store, cfg.groups_consumer_timeout, cfg.groups_coordinator_timeout)
        else:
            self._groups.store = store  # groups live in Liftbridge's replicated metadata: a restart keeps them
        if store.cluster is not None and store.streams:
            store.cluster.begin_restart_window()
        for stream in store.streams.values():
            for part in stream.partitions:
                if not part.paused:
                    await self._ingest.partition_opened(part)
        for b in self.brokers:
            await self._serve(b)
        if store.cluster is not None:
            store.cluster.start()

    async def _serve(self, broker: BrokerSlot) -> None:
        assert self._store is not None and self._ingest is not None
        handlers = ApiService(
            self._store, self._ingest, broker, self._groups, cursors=self.config.cursors
        ).method_handlers()
        front: _GrpcFront
        if self.config.grpc_transport == "h2":
            front = _H2Front(handlers, self._ssl)
        else:
            front = _AioFront(handlers, self.config)
        try:
            broker.port = await front.start(broker.host, broker.port)
        except PortInUseError as exc:
            raise PortInUseError(f"broker {broker.index}: {exc}") from exc
        self._servers[broker.index] = front
        broker.live = True

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(_RETENTION_TICK)
            if self._store is not None:
                self._store.enforce_age_retention()

    def grpc_stats(self, index: int = 0) -> TransportStats | None:
        """Connections, unfinished calls and buffered response bytes of broker ``index``'s gRPC listener
        (``None`` on the ``aio`` transport, or when the broker is stopped)."""
        front = self._servers.get(index)
        return front.stats() if front is not None else None

    async def stop_broker(self, index: int) -> None:
        """Stop broker ``index`` cleanly (its calls end at once); its leaderships move to live
        replicas at once (in cluster mode after the successor caught up) and it leaves the ISRs.

        :raises IndexError: no such broker.
        """
        broker = self.brokers[index]
        await self._halt(broker)
        cluster = self.store.cluster
        if cluster is not None:
            cluster.broker_stopped(broker, controlled=True)
        else:
            self.store.reconcile_leaders()

    async def kill_broker(self, index: int) -> None:
        """Kill broker ``index`` without notice (cluster mode): its calls end at once, nothing moves
        at once. Followers it led elect a new leader after ``replica_max_leader_timeout``; it leaves
        the ISRs of other leaders after ``replica_max_lag_time``.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server (use ``DevServerProcess.kill``).
        """
        cluster = self._cluster("kill a broker")
        broker = self.brokers[index]
        await self._halt(broker)
        cluster.broker_stopped(broker, controlled=False)

    async def _halt(self, broker: BrokerSlot) -> None:
        server = self._servers.pop(broker.index, None)
        broker.live = False
        if server is not None:
            await server.stop()
        if self.store.cluster is not None and broker.stalled:
            self.store.cluster.broker_resumed(broker)  # a dead process is no longer stopped

    async def start_broker(self, index: int) -> None:
        """Serve broker ``index`` again on the same port. In cluster mode its replicas first cut off
        what a new leader never had, catch up and rejoin the ISR; it does not take leadership back.

        :raises IndexError: no such broker.
        :raises PortInUseError: the port was taken meanwhile.
        """
        broker = self.brokers[index]
        if index in self._servers:
            return
        await self._serve(broker)
        cluster = self.store.cluster
        if cluster is not None:
            cluster.broker_started(broker)
        else:
            self.store.reconcile_leaders()

    async def stall_broker(self, index: int) -> None:
        """Freeze broker ``index`` like a SIGSTOPped process (cluster mode): it stops fetching as a
        follower and serving its followers, and calls to it wait until :meth:`resume_broker`.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._cluster("stall a broker").broker_stalled(self.brokers[index])

    async def resume_broker(self, index: int) -> None:
        """Let a stalled broker run again (SIGCONT): calls go on, its followers fetch again.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._cluster("resume a broker").broker_resumed(self.brokers[index])

    async def restart_cluster(self, down: float = 0.0) -> None:
        """Stop every broker at once (calls end, nothing unwritten survives), wait ``down`` seconds,
        and start them all from the data directory; they go through the restart window.

        :raises ServerStateError: a single-broker server (use ``DevServerProcess.kill`` and ``start``).
        """
        self._cluster("restart the cluster")
        store, ingest = self.store, self._ingest
        assert ingest is not None
        servers, self._servers = list(self._servers.values()), {}
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
        for b in self.brokers:
            b.live = False
        for stream in store.streams.values():
            for part in stream.partitions:
                part.deleted = True  # these objects are gone with the processes; the data is on disk
                await ingest.partition_closed(part)
                part.deleted = False
        store.close()
        self._store = None
        await asyncio.sleep(down)
        await self._open_store()

    def _cluster(self, what: str) -> Cluster:
        cluster = self.store.cluster
        if cluster is None:
            raise ServerStateError(f"cannot {what}: this dev server has one broker; start it with brokers > 1")
        return cluster

    async def stop(self) -> None:
        """Stop serving, flush and close the logs, disconnect from NATS and stop the NATS child."""
        if self._retention_task is not None:
            self._retention_task.cancel()
            self._retention_task = None
        if self._groups is not None:
            self._groups.close()
        servers, self._servers = list(self._servers.values()), {}
        await asyncio.gather(*(s.stop() for s in servers), return_exceptions=True)
        for b in self.brokers:
            b.live = False
        if self._store is not None:
            self._store.close()
        if self._ingest is not None:
            await self._ingest.close()
            self._ingest = None
        self._store = None
        if self._nats_proc is not None:
            self._nats_proc.stop()
            self._nats_proc = None


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
    - :meth:`restart_cluster`: every broker down, then up through the restart window.
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

    def restart_cluster(self, down: float = 0.0) -> None:
        """Restart every broker at once after ``down`` seconds, from the data directory, through the
        restart window (``timings.restart_*``: metadata without streams, then no leaders and Publish
        "no such stream", then high watermarks -1 while nothing commits), on the same ports.

        :raises ServerStateError: a single-broker server.
        """
        self._run(self._running_core().restart_cluster(down), timeout=30.0 + down)


def _opt_path(path: str | os.PathLike[str] | None) -> str | None:
    return os.fspath(path) if path is not None else None


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        with contextlib.suppress(Exception):
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def parse_ready_line(line: str) -> tuple[list[str], str]:
    """Read the broker addresses and the NATS URL from the CLI's ready line.

    :raises DevServerError: ``line`` is not a ready line.
    """
    if not line.startswith(READY_PREFIX):
        raise DevServerError(f"not a dev-server ready line: {line!r}")
    fields = dict(tok.split("=", 1) for tok in line[len(READY_PREFIX) :].split() if "=" in tok)
    try:
        return fields["grpc"].split(","), fields["nats"]
    except KeyError as exc:
        raise DevServerError(f"ready line lacks {exc}: {line!r}") from exc


class DevServerProcess:
    """The dev server as a child process (``python -m airflow_provider_liftbridge.devserver``).

    The first :meth:`start` picks free ports; later starts reuse them and the same data
    directory, so a :meth:`kill` (SIGKILL, which also takes the NATS child down) followed by
    :meth:`start` is a crash and restart.

    :param data_dir: data directory (kept across restarts; not removed).
    :param brokers: number of brokers.
    :param host: listen address.
    :param nats_url: an external NATS server instead of a child.
    :param fsync: pass ``--fsync``.
    :param startup_timeout: seconds to wait for the ready line.
    :param grpc_transport: ``--grpc-transport`` (default: the child's default, normally ``h2``).
    :param tls_cert_file: ``--tls-cert``.
    :param tls_key_file: ``--tls-key``.
    :param tls_client_ca_file: ``--tls-client-ca``.
    :param timings: cluster mode's time-outs, minimum ISR and restart window (the ``--replica-*``,
        ``--min-insync-replicas`` and ``--restart-window`` options); default: Liftbridge's.

    The child reads fault commands on its stdin (``--control stdin``), so the cluster fault hooks of
    :class:`DevServer` work on it too: :meth:`stall_broker`, :meth:`resume_broker`,
    :meth:`kill_broker`, :meth:`start_broker`, :meth:`stop_broker`, :meth:`restart_cluster`.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        brokers: int = 1,
        host: str = "127.0.0.1",
        nats_url: str | None = None,
        *,
        fsync: bool = False,
        startup_timeout: float = 30.0,
        grpc_transport: str | None = None,
        tls_cert_file: str | os.PathLike[str] | None = None,
        tls_key_file: str | os.PathLike[str] | None = None,
        tls_client_ca_file: str | os.PathLike[str] | None = None,
        timings: ClusterTimings | None = None,
    ) -> None:
        if grpc_transport is not None and grpc_transport not in GRPC_TRANSPORTS:
            raise ValueError(f"unknown gRPC transport {grpc_transport!r}; choose one of {', '.join(GRPC_TRANSPORTS)}")
        self.grpc_transport = grpc_transport
        self._extra_args: list[str] = []
        for flag, value in (
            ("--tls-cert", tls_cert_file),
            ("--tls-key", tls_key_file),
            ("--tls-client-ca", tls_client_ca_file),
        ):
            if value is not None:
                self._extra_args += [flag, os.fspath(value)]
        if timings is not None:
            self._extra_args += [
                "--replica-max-lag-time",
                str(timings.replica_max_lag_time),
                "--replica-max-leader-timeout",
                str(timings.replica_max_leader_timeout),
                "--min-insync-replicas",
                str(timings.min_insync_replicas),
                "--restart-window",
                timings.restart_window(),
            ]
        self.data_dir = Path(data_dir)
        self.brokers = brokers
        self.host = host
        self._external_nats = nats_url
        self.fsync = fsync
        self.startup_timeout = startup_timeout
        self._ports: list[int] = [0] * brokers
        self._nats_port = 0
        self._addresses: list[str] = []
        self._nats_url = nats_url or ""
        self._proc: subprocess.Popen[str] | None = None
        #: The child's last ready line (addresses, NATS URL, data directory, ``tls=on``).
        self.ready_line = ""
        self._stderr_path = Path(tempfile.mkstemp(prefix="liftbridge-devserver-", suffix=".log")[1])

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    @property
    def address(self) -> str:
        if not self._addresses:
            raise ServerStateError("the dev server process has not been started")
        return self._addresses[0]

    @property
    def nats_url(self) -> str:
        return self._nats_url

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def stderr_log(self) -> Path:
        """File that receives the child's log output."""
        return self._stderr_path

    def start(self) -> DevServerProcess:
        """Start (or restart) the child and wait for its ready line.

        :raises DevServerError: the child exited or printed no ready line in time (its log is in the message).
        """
        if self._proc is not None and self._proc.poll() is None:
            raise ServerStateError("the dev server process is already running")
        args = [
            sys.executable,
            "-m",
            "airflow_provider_liftbridge.devserver",
            "--host",
            self.host,
            "--data-dir",
            str(self.data_dir),
            "--brokers",
            str(self.brokers),
            "--ports",
            ",".join(map(str, self._ports)),
        ]
        if self._external_nats:
            args += ["--nats-url", self._external_nats]
        else:
            args += ["--nats-port", str(self._nats_port)]
        if self.fsync:
            args.append("--fsync")
        if self.grpc_transport is not None:
            args += ["--grpc-transport", self.grpc_transport]
        args += self._extra_args
        args += ["--control", "stdin"]
        with open(self._stderr_path, "ab") as err:
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.PIPE, text=True)
        line = self.ready_line = self._read_ready_line(self._proc)
        self._addresses, self._nats_url = parse_ready_line(line)
        self._ports = [int(a.rsplit(":", 1)[1]) for a in self._addresses]
        if not self._external_nats:
            self._nats_port = int(self._nats_url.rsplit(":", 1)[1])
        return self

    def _read_ready_line(self, proc: subprocess.Popen[str]) -> str:
        assert proc.stdout is not None
        deadline = time.monotonic() + self.startup_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=0.1):
                    line = proc.stdout.readline()
                    if line.startswith(READY_PREFIX):
                        return line.strip()
                    if not line and proc.poll() is not None:
                        break
                elif proc.poll() is not None:
                    break
        self._terminate(proc, signal.SIGKILL)
        tail = self._stderr_path.read_text(errors="replace")[-1500:]
        raise DevServerError(f"the dev server process did not become ready (exit code {proc.returncode}): {tail}")

    # -- cluster fault hooks (see DevServer) -------------------------------------
    def stall_broker(self, index: int) -> None:
        """Freeze broker ``index`` like SIGSTOP (see :meth:`DevServer.stall_broker`).

        :raises DevServerError: the child refused the command (single broker, no such broker) or is not running.
        """
        self._command(f"stall {index}")

    def resume_broker(self, index: int) -> None:
        """Let a stalled broker run again (see :meth:`DevServer.resume_broker`)."""
        self._command(f"resume {index}")

    def kill_broker(self, index: int) -> None:
        """Kill one broker like SIGKILL (see :meth:`DevServer.kill_broker`); :meth:`start_broker` brings it back."""
        self._command(f"kill {index}")

    def start_broker(self, index: int) -> None:
        """Serve a stopped or killed broker again (see :meth:`DevServer.start_broker`)."""
        self._command(f"start {index}")

    def stop_broker(self, index: int) -> None:
        """Stop one broker cleanly (see :meth:`DevServer.stop_broker`)."""
        self._command(f"stop {index}")

    def restart_cluster(self, down: float = 0.0) -> None:
        """Restart every broker inside the child process through the restart window (see
        :meth:`DevServer.restart_cluster`; :meth:`kill` then :meth:`start` restarts the process instead)."""
        self._command(f"restart {down}", timeout=30.0 + down)

    def _command(self, line: str, timeout: float = 30.0) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None or proc.stdin is None or proc.stdout is None:
            raise ServerStateError("the dev server process is not running; call start() first")
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(timeout=0.1):
                    if proc.poll() is not None:
                        break
                    continue
                reply = proc.stdout.readline().strip()
                if reply == f"ok {line}":
                    return
                if reply.startswith(f"error {line}"):
                    raise DevServerError(f"the dev server refused {line!r}: {reply.split(': ', 1)[-1]}")
                if not reply and proc.poll() is not None:
                    break
        raise DevServerError(f"no answer from the dev server process to {line!r} within {timeout:.0f}s")

    def kill(self) -> None:
        """SIGKILL the server (no clean shutdown; its NATS child dies with it) and wait until its ports are free."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc, signal.SIGKILL)
        self._wait_ports_free()

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the server cleanly (SIGTERM; SIGKILL after ``timeout``). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._terminate(proc, signal.SIGTERM, timeout)
            self._wait_ports_free()

    def _terminate(self, proc: subprocess.Popen[str], sig: int, timeout: float = 10.0) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdout, proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def _wait_ports_free(self, timeout: float = 10.0) -> None:
        ports = [p for p in self._ports if p]
        if not self._external_nats and self._nats_port:
            ports.append(self._nats_port)
        deadline = time.monotonic() + timeout
        for port in ports:
            while time.monotonic() < deadline:
                with socket.socket() as sock:
                    if sock.connect_ex((self.host, port)) != 0:
                        break
                time.sleep(0.02)

    def close(self) -> None:
        """Stop the child and remove its log file."""
        self.stop()
        self._stderr_path.unlink(missing_ok=True)

    def __enter__(self) -> DevServerProcess:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
