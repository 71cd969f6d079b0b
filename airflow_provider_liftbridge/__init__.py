"""Apache Airflow provider for Liftbridge, the durable stream log on NATS.

Rooms: ``codec`` (NATS envelope), ``client`` (sync + asyncio client), ``hooks``,
``operators``, ``sensors``, ``triggers``, ``spark`` and ``devserver``.
"""

import os

__version__ = "0.1.0"

# gRPC's core fork support (on by default) restarts its poller thread in the child of every
# fork; when Python's subprocess then closes the child's descriptors before exec, that thread
# can kill the child (grpc/grpc#43055, grpcio >= 1.81). A process that holds a live client and
# starts a subprocess with ``preexec_fn`` -- PySpark's JVM gateway does -- lost about 1 child in
# 30 here. This package never forks with live channels, so it turns that support off, unless the
# environment already chose; it takes effect only if grpc is not imported yet (docs/airflow.md).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
