"""``liftbridge-devserver``: run the dev server from the command line (see docs/devserver.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from .clock import set_reception_clock
from .config import DEFAULT_CURSORS_PARTITIONS, GRPC_TRANSPORTS, TRANSPORT_ENV, ServerConfig
from .core import ServerCore
from .errors import DevServerError
from .model import ClusterTimings
from .process import READY_PREFIX

_DEFAULTS = ClusterTimings()
#: Fault commands of ``--control stdin``: name -> (ServerCore method, takes a broker index).
CONTROL_COMMANDS = {
    "stall": ("stall_broker", True),
    "resume": ("resume_broker", True),
    "kill": ("kill_broker", True),
    "start": ("start_broker", True),
    "stop": ("stop_broker", True),
    "restart": ("restart_cluster", False),
    "metadata-leader": ("move_metadata_leader", True),
    "cut-nats": ("cut_broker_from_nats", True),
    "cut-peers": ("cut_broker_from_peers", True),
    "heal": ("heal_broker", True),
}

#: The fault commands that cut a broker off: ``cut-nats I [KIND]`` (model.KINDS, default cut).
CUT_COMMANDS = ("cut-nats", "cut-peers")

PROG = "liftbridge-devserver"


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog=PROG, description="A Liftbridge-compatible server for local work and tests.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument(
        "--port",
        type=int,
        default=9292,
        help="gRPC port of broker 0; broker i uses port+i (default: %(default)s; 0 = free ports)",
    )
    p.add_argument("--ports", help="comma-separated gRPC ports, one per broker (overrides --port)")
    p.add_argument("--brokers", type=int, default=1, help="number of brokers in the cluster (default: %(default)s)")
    p.add_argument("--data-dir", type=Path, help="data directory (default: a temporary directory removed on exit)")
    nats = p.add_mutually_exclusive_group()
    nats.add_argument(
        "--nats-port",
        type=int,
        default=4222,
        help="port of the nats-server child (default: %(default)s; 0 = a free port)",
    )
    nats.add_argument("--nats-url", help="use this running NATS server instead of starting nats-server")
    p.add_argument("--fsync", action="store_true", help="fsync every log write (survives power loss; slower)")
    p.add_argument(
        "--grpc-transport",
        choices=GRPC_TRANSPORTS,
        default=None,
        help="how gRPC is served: h2 (asyncio + the h2 library, coalesced writes) or aio (grpc.aio); "
        f"default: ${TRANSPORT_ENV} or h2",
    )
    p.add_argument("--tls-cert", help="PEM certificate of the gRPC ports: serve TLS only (needs --tls-key)")
    p.add_argument("--tls-key", help="PEM private key of --tls-cert")
    p.add_argument("--tls-client-ca", help="PEM CA bundle: require client certificates it signed (mutual TLS)")
    cluster = p.add_argument_group("cluster mode (--brokers > 1)")
    cluster.add_argument(
        "--replica-max-lag-time",
        type=float,
        default=_DEFAULTS.replica_max_lag_time,
        metavar="SECONDS",
        help="a follower that has not fetched or caught up for this long leaves the ISR (default: %(default)s)",
    )
    cluster.add_argument(
        "--replica-max-leader-timeout",
        type=float,
        default=_DEFAULTS.replica_max_leader_timeout,
        metavar="SECONDS",
        help="a dead or stalled leader is replaced after this long (default: %(default)s)",
    )
    cluster.add_argument(
        "--min-insync-replicas",
        type=int,
        default=_DEFAULTS.min_insync_replicas,
        metavar="N",
        help="below this ISR size nothing commits, unless a stream sets minIsr (default: %(default)s)",
    )
    cluster.add_argument(
        "--restart-window",
        default=_DEFAULTS.restart_window(),
        metavar="NO_STREAMS,NO_LEADERS,HW_UNKNOWN",
        help="seconds after a full-cluster restart until metadata lists streams, partitions have leaders, "
        "and high watermarks are known (default: %(default)s, as observed on Liftbridge)",
    )
    cluster.add_argument(
        "--metadata-election-timeout",
        type=float,
        default=_DEFAULTS.metadata_election_timeout,
        metavar="SECONDS",
        help="a stalled or dead metadata leader is replaced after this long; metadata changes wait "
        "meanwhile (default: %(default)s)",
    )
    cluster.add_argument(
        "--metadata-cache-max-age",
        type=float,
        default=_DEFAULTS.metadata_cache_max_age,
        metavar="SECONDS",
        help="FetchMetadata asks every broker (and waits for a stalled one) unless its broker list is "
        "younger than this (default: %(default)s)",
    )
    cluster.add_argument(
        "--replica-max-idle-wait",
        type=float,
        default=_DEFAULTS.replica_max_idle_wait,
        metavar="SECONDS",
        help="after the NATS connection is lost, followers fetch again only this long after; commits "
        "stall meanwhile (default: %(default)s)",
    )
    cluster.add_argument(
        "--hw-checkpoint-interval",
        type=float,
        default=_DEFAULTS.hw_checkpoint_interval,
        metavar="SECONDS",
        help="every broker checkpoints its replicas' high watermarks this often; a killed broker comes "
        "back with them (default: %(default)s, Liftbridge's)",
    )
    cluster.add_argument(
        "--stream-propagation",
        type=float,
        default=_DEFAULTS.stream_propagation,
        metavar="SECONDS",
        help="a new stream reaches the brokers other than the metadata leader and its partition leaders "
        "this long after creation (default: %(default)s)",
    )
    cluster.add_argument(
        "--control",
        choices=("stdin",),
        help="read fault commands from stdin, one per line: stall I, resume I, kill I, start I, stop I, "
        "metadata-leader I, cut-nats I, cut-peers I, heal I (a broker cut off from NATS / from its peers "
        "while clients still reach it, and healed), restart [DOWN_SECONDS], clock STREAM TIME|real "
        "(the reception clock of a stream's "
        "new messages), replace-history STREAM PARTITION I KEEP_TO (a test hook: broker I cuts its log after "
        "KEEP_TO and leads); each is answered on stdout with 'ok COMMAND' or "
        "'error COMMAND: REASON'; 'metadata-leader' alone is answered 'ok metadata-leader: I'; "
        "the server stops when stdin closes",
    )
    p.add_argument(
        "--groups-consumer-timeout",
        type=float,
        default=15.0,
        help="seconds a consumer-group member may go without fetching assignments (default: %(default)s)",
    )
    p.add_argument(
        "--groups-coordinator-timeout",
        type=float,
        default=15.0,
        help="seconds within which group members' coordinator reports count together (default: %(default)s)",
    )
    p.add_argument(
        "--no-cursors",
        dest="cursors",
        action="store_false",
        help="answer SetCursor/FetchCursor as a stock Liftbridge with cursors off (cursors.stream.partitions: 0)",
    )
    p.add_argument(
        "--cursors-partitions",
        type=int,
        default=DEFAULT_CURSORS_PARTITIONS,
        help="partitions of the internal __cursors stream on a new data directory "
        "(Liftbridge's cursors.stream.partitions; default: %(default)s)",
    )
    p.add_argument(
        "--log-level", default="WARNING", help="Python log level for the server's own logs (default: %(default)s)"
    )
    return p


def _timings(args: argparse.Namespace) -> ClusterTimings:
    try:
        phases = [float(x) for x in args.restart_window.split(",")]
        if len(phases) != 3:
            raise ValueError("three values are needed")
        return ClusterTimings(
            replica_max_lag_time=args.replica_max_lag_time,
            replica_max_leader_timeout=args.replica_max_leader_timeout,
            min_insync_replicas=args.min_insync_replicas,
            restart_no_streams=phases[0],
            restart_no_leaders=phases[1],
            restart_hw_unknown=phases[2],
            metadata_election_timeout=args.metadata_election_timeout,
            metadata_cache_max_age=args.metadata_cache_max_age,
            stream_propagation=args.stream_propagation,
            replica_max_idle_wait=args.replica_max_idle_wait,
            hw_checkpoint_interval=args.hw_checkpoint_interval,
        )
    except ValueError as exc:
        raise DevServerError(f"bad cluster timings ({exc}); see --help for --restart-window and the others") from exc


async def run_control(core: ServerCore, line: str) -> str:
    """Run one fault command of the control channel on ``core``; return the reply line."""
    words = line.split()
    if not words:
        return ""
    name, args = words[0], words[1:]
    try:
        if name == "metadata-leader" and not args:  # a question, not a fault: which broker leads
            return f"ok metadata-leader: {core.metadata_leader()}"
        if name == "replace-history":  # a test hook: a model of Liftbridge's wrong truncation
            if len(args) != 4:
                raise ValueError("give a stream, a partition, a broker index and the last offset to keep")
            cut = await core.replace_history(args[0], int(args[1]), int(args[2]), int(args[3]))
            return f"ok {line.strip()}: {cut}"
        if name == "clock":  # a test hook, not a fault: one stream's reception clock (clock.py)
            if len(args) != 2:
                raise ValueError("give a stream and an ISO 8601 time with a time zone, or 'real'")
            set_reception_clock(args[0], None if args[1] == "real" else dt.datetime.fromisoformat(args[1]))
            return f"ok {line.strip()}"
        if name not in CONTROL_COMMANDS:
            raise ValueError(f"unknown command; use one of {', '.join(CONTROL_COMMANDS)}")
        method, takes_index = CONTROL_COMMANDS[name]
        if takes_index:
            kinds = 1 if name in CUT_COMMANDS else 0  # a cut may name its kind after the index
            if not 1 <= len(args) <= 1 + kinds:
                raise ValueError("give one broker index" + (" and, optionally, the kind of cut" if kinds else ""))
            index = int(args[0])
            if not 0 <= index < len(core.brokers):
                raise ValueError(f"no broker {index}; brokers are 0 to {len(core.brokers) - 1}")
            await getattr(core, method)(index, *args[1:])
        else:
            await getattr(core, method)(*(float(a) for a in args[:1]))
    except (ValueError, DevServerError) as exc:
        return f"error {line.strip()}: {exc}"
    return f"ok {line.strip()}"


async def _control_loop(core: ServerCore, closed: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while line := (await reader.readline()).decode():
        reply = await run_control(core, line)
        if reply:
            print(reply, flush=True)
    # The controller is gone (its process ended without stopping us): a server left behind would
    # keep its ports and its share of the CPU.
    closed()


def _ports(args: argparse.Namespace) -> list[int]:
    if args.brokers < 1:
        raise DevServerError(f"--brokers must be at least 1, got {args.brokers}")
    if args.ports:
        try:
            ports = [int(p) for p in args.ports.split(",")]
        except ValueError as exc:
            raise DevServerError(f"--ports must be comma-separated integers, got {args.ports!r}") from exc
        if len(ports) != args.brokers:
            raise DevServerError(f"--ports lists {len(ports)} ports for {args.brokers} brokers; give one per broker")
        return ports
    return [args.port + i if args.port else 0 for i in range(args.brokers)]


async def _serve(config: ServerConfig, temporary: bool, control: str | None) -> None:
    core = ServerCore(config)
    await core.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    data = f"{config.data_dir}{' (temporary)' if temporary else ''}"
    tls = " tls=on" if config.tls else ""
    print(f"{READY_PREFIX} grpc={','.join(core.addresses)} nats={core.nats_url} data_dir={data}{tls}", flush=True)
    control_task = loop.create_task(_control_loop(core, stop.set)) if control == "stdin" else None
    try:
        await stop.wait()
    finally:
        if control_task is not None:
            control_task.cancel()
        await core.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; return the exit code (errors print one line, exit 1)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    temporary = args.data_dir is None
    data_dir = Path(tempfile.mkdtemp(prefix="liftbridge-devserver-")) if temporary else args.data_dir
    try:
        config = ServerConfig(
            data_dir=data_dir,
            host=args.host,
            ports=_ports(args),
            nats_url=args.nats_url,
            nats_port=args.nats_port,
            fsync=args.fsync,
            grpc_transport=args.grpc_transport,
            tls_cert_file=args.tls_cert,
            tls_key_file=args.tls_key,
            tls_client_ca_file=args.tls_client_ca,
            groups_consumer_timeout=args.groups_consumer_timeout,
            groups_coordinator_timeout=args.groups_coordinator_timeout,
            timings=_timings(args),
            cursors=args.cursors,
            cursors_partitions=args.cursors_partitions,
        )
        asyncio.run(_serve(config, temporary, args.control))
    except DevServerError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a Ctrl-C during start-up
        return 130
    finally:
        if temporary:
            with contextlib.suppress(OSError):
                shutil.rmtree(data_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
