"""``liftbridge-devserver``: run the dev server from the command line (see docs/devserver.md)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .errors import DevServerError
from .server import GRPC_TRANSPORTS, READY_PREFIX, TRANSPORT_ENV, ServerConfig, ServerCore

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
        "--log-level", default="WARNING", help="Python log level for the server's own logs (default: %(default)s)"
    )
    return p


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


async def _serve(config: ServerConfig, temporary: bool) -> None:
    core = ServerCore(config)
    await core.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    data = f"{config.data_dir}{' (temporary)' if temporary else ''}"
    tls = " tls=on" if config.tls else ""
    print(f"{READY_PREFIX} grpc={','.join(core.addresses)} nats={core.nats_url} data_dir={data}{tls}", flush=True)
    try:
        await stop.wait()
    finally:
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
        )
        asyncio.run(_serve(config, temporary))
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
