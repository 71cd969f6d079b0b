"""The dev server itself, on the caller's event loop: :class:`ServerCore`.

It runs the NATS child (or uses an external NATS), the store, the NATS ingest and one gRPC
listener per broker, on the ``h2`` transport or ``grpc.aio``; the CLI runs it on the main thread,
:class:`~.server.DevServer` on a background thread. The cluster fault hooks (stop, kill, stall,
resume, restart) act on it.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import grpc
from grpc import aio

from .cluster import Cluster
from .config import ServerConfig
from .cursors_stream import ensure_cursors_stream, open_cursors
from .errors import NatsServerStartError, PortInUseError, ServerStateError
from .groups import ConsumerGroups
from .grpc_h2 import H2GrpcServer, TransportStats, method_table
from .model import BrokerSlot, RestartHold, broker_id
from .nats_ingest import NatsIngest
from .natsproc import NatsServerProcess, check_port_free
from .service import SERVICE, ApiService
from .state import Store

#: How often the streams' cleaners are checked for being due (a shorter ``cleanerInterval`` acts as this).
_RETENTION_TICK = 0.5
_GRPC_OPTIONS = [
    # Without this, a second server could silently share a port that is in use.
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


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
        self.brokers = [BrokerSlot(i, broker_id(i), config.host, p) for i, p in enumerate(config.ports)]
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

    @property
    def groups(self) -> ConsumerGroups:
        if self._groups is None:
            raise ServerStateError("the dev server is not running; call start() first")
        return self._groups

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

    async def _open_store(self, hold: RestartHold | None = None) -> None:
        """Read the data directory and serve every broker (a cluster with streams starts in the restart
        window, held at the start of phase ``hold`` if given)."""
        assert self._ingest is not None
        for b in self.brokers:
            b.live, b.stalled = True, False
        store = self._store = Store(
            self.config.data_dir, self.brokers, fsync=self.config.fsync, timings=self.config.timings
        )
        store.listener = self._ingest
        self._ingest.on_disconnect = store.cluster.nats_lost if store.cluster is not None else None
        cfg = self.config
        if self._groups is None:
            self._groups = ConsumerGroups(store, cfg.groups_consumer_timeout, cfg.groups_coordinator_timeout)
        else:
            self._groups.store = store  # groups live in Liftbridge's replicated metadata: a restart keeps them
        if store.cluster is not None and store.streams:
            store.cluster.begin_restart_window(hold)
        for stream in store.streams.values():
            for part in stream.partitions:
                if not part.paused:
                    await self._ingest.partition_opened(part)
        # After the restart-window check: a new cluster whose only stream is this one has not restarted.
        await ensure_cursors_stream(store, cfg.cursors_partitions if cfg.cursors else 0)
        await open_cursors(store)
        for b in self.brokers:
            await self._serve(b)
        if store.cluster is not None:
            store.cluster.start()

    async def _serve(self, broker: BrokerSlot) -> None:
        assert self._store is not None and self._ingest is not None
        handlers = ApiService(self._store, self._ingest, broker, self._groups).method_handlers()
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
                self._store.run_cleaners()

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

    async def cut_broker_from_nats(self, index: int, kind: str = "cut") -> None:
        """Cut broker ``index`` off from NATS, and so from its peers, while its clients still reach
        it (cluster mode; isolation.py): a minority broker that takes nothing it is sent. ``kind``
        (:data:`~.model.KINDS`): both ways, one way (``"cut-in"``, ``"cut-out"``), or a link
        that is only ``"slow"`` or ``"lossy"``.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        :raises ValueError: an unknown ``kind``.
        """
        self._cluster("cut a broker off").broker_isolated(self.brokers[index], "nats", kind)

    async def cut_broker_from_peers(self, index: int, kind: str = "cut") -> None:
        """Cut broker ``index`` off from its peers only (its NATS node cut from the others; cluster
        mode; isolation.py): a minority leader that appends what it is sent and commits none of it.
        ``kind`` as for :meth:`cut_broker_from_nats`.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        :raises ValueError: an unknown ``kind``.
        """
        self._cluster("cut a broker off").broker_isolated(self.brokers[index], "peers", kind)

    async def heal_broker(self, index: int) -> None:
        """Heal the cut of broker ``index`` (nothing when it is not cut off): it learns the metadata,
        cuts back what a new leader never had, and follows.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._cluster("heal a broker").broker_rejoined(self.brokers[index])

    async def replace_history(self, stream: str, partition: int, index: int, keep_to: int) -> int:
        """A test hook, a model of Liftbridge's wrong truncation: broker ``index``, a follower of
        the partition, cuts its log after ``keep_to`` (committed records included) and leads it at
        once; the other replicas follow (cluster mode; see ``Cluster.history_replaced``). Returns how
        many records its log lost.

        :raises IndexError: no such broker.
        :raises ValueError: no such partition, or the broker is not a running follower of it.
        :raises ServerStateError: a single-broker server.
        """
        cluster = self._cluster("replace a partition's history")
        part = self.store.get_partition(stream, partition)
        if part is None:
            raise ValueError(f"no partition {partition} of stream {stream!r}")
        return cluster.history_replaced(part, self.brokers[index], keep_to)

    def metadata_leader(self) -> int:
        """Index of the broker that is the metadata (Raft) leader.

        :raises ServerStateError: a single-broker server.
        """
        return self._cluster("read the metadata leader").metadata.index

    async def move_metadata_leader(self, index: int) -> None:
        """Make broker ``index`` the metadata (Raft) leader at once.

        :raises IndexError: no such broker.
        :raises ServerStateError: a single-broker server.
        """
        self._cluster("move the metadata leader").metadata.move_to(index)

    async def restart_cluster(self, down: float = 0.0, hold: RestartHold | None = None) -> None:
        """Stop every broker at once (calls end, nothing unwritten survives), wait ``down`` seconds,
        and start them all from the data directory; they go through the restart window (held at the
        start of phase ``hold`` until :meth:`release_restart_window`, if given).

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
        await self._open_store(hold)

    async def release_restart_window(self) -> None:
        """Let a restart window held by ``restart_cluster(hold=...)`` run on."""
        self._cluster("release the restart window").release_restart_window()

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
