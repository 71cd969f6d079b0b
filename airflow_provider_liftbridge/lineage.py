"""OpenLineage for the Liftbridge operators and sensors: which streams and files a task reads and writes.

Airflow's OpenLineage provider (``apache-airflow-providers-openlineage``, the ``openlineage`` extra)
calls ``get_openlineage_facets_on_start`` / ``get_openlineage_facets_on_complete`` on every operator
that has them. :class:`LiftbridgeLineageMixin` implements both from one method per class,
:meth:`~LiftbridgeLineageMixin.lineage_datasets`, so each operator only says what it reads and writes.

Naming (as OpenLineage names Kafka topics): a stream is the dataset ``name=<stream>`` in the namespace
``liftbridge://<host>:<port>`` of the connection's first broker; a file is ``namespace="file"``,
``name=<absolute path>``, and an object-store file ``namespace="<scheme>://<bucket>"``, ``name=<key>``.

Without the OpenLineage provider nothing here is imported at module level that could fail: the
methods return ``None`` and Airflow never calls them anyway.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .extras import needs_extra

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset

__all__ = ["LiftbridgeLineageMixin", "file_dataset", "openlineage_available", "stream_dataset", "stream_namespace"]

#: What :meth:`LiftbridgeLineageMixin.lineage_datasets` returns: (inputs, outputs).
Datasets = tuple[list["Dataset"], list["Dataset"]]


def openlineage_available() -> bool:
    """Whether the OpenLineage provider can be imported (the ``openlineage`` extra is installed)."""
    try:
        import airflow.providers.openlineage.extractors  # noqa: F401
        import openlineage.client.event_v2  # noqa: F401
    except ImportError:
        return False
    return True


def stream_namespace(brokers: Sequence[str]) -> str:
    """``liftbridge://host:port`` of the first broker (brokers are ``host:port`` strings).

    :raises ValueError: no brokers.
    """
    if not brokers:
        raise ValueError("a Liftbridge dataset namespace needs at least one broker (host:port)")
    return f"liftbridge://{brokers[0]}"


def stream_dataset(brokers: Sequence[str], stream: str) -> Dataset:
    """The OpenLineage dataset of a stream.

    :raises MissingExtraError: the OpenLineage client is not installed (the ``openlineage`` extra).
    """
    with needs_extra("openlineage", "OpenLineage datasets"):
        from openlineage.client.event_v2 import Dataset

    return Dataset(namespace=stream_namespace(brokers), name=stream)


def file_dataset(path: Any) -> Dataset:
    """The OpenLineage dataset of a file: a local path, a URL (``s3a://bucket/key``) or an
    ``ObjectStoragePath``.

    :raises MissingExtraError: the OpenLineage client is not installed (the ``openlineage`` extra).
    """
    with needs_extra("openlineage", "OpenLineage datasets"):
        from openlineage.client.event_v2 import Dataset

    if isinstance(path, str):
        url = urlsplit(path)
        if url.scheme in ("", "file", "local"):
            return Dataset(namespace="file", name=os.path.abspath(url.path))
        return Dataset(namespace=f"{url.scheme}://{url.netloc}", name=url.path.lstrip("/"))
    protocol = str(getattr(path, "protocol", "") or "file")
    if protocol in ("file", "local"):
        return Dataset(namespace="file", name=str(getattr(path, "path", path)))
    bucket, key = str(getattr(path, "bucket", "")), str(getattr(path, "key", ""))
    return Dataset(namespace=f"{protocol}://{bucket}", name=key)


def _operator_lineage(inputs: Iterable[Dataset], outputs: Iterable[Dataset]) -> OperatorLineage:
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=list(inputs), outputs=list(outputs))


class LiftbridgeLineageMixin:
    """OpenLineage methods for an operator or sensor with a ``hook`` (a ``LiftbridgeHook``).

    Subclasses implement :meth:`lineage_datasets`; ``complete`` tells whether the task has run (so
    what it resolved while running can be used).
    """

    hook: Any

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """``(inputs, outputs)`` of this task as OpenLineage datasets."""
        raise NotImplementedError

    def lineage_stream(self, stream: str) -> Dataset:
        """The dataset of ``stream`` on this task's connection."""
        return stream_dataset(self.hook.settings.brokers, stream)

    def get_openlineage_facets_on_start(self) -> OperatorLineage | None:
        """Called by the OpenLineage provider when the task starts (``None`` without the provider)."""
        if not openlineage_available():
            return None
        return _operator_lineage(*self.lineage_datasets(complete=False))

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> OperatorLineage | None:
        """Called by the OpenLineage provider when the task succeeded (``None`` without the provider)."""
        if not openlineage_available():
            return None
        return _operator_lineage(*self.lineage_datasets(complete=True))
