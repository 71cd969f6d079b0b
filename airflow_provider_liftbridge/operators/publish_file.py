"""``LiftbridgePublishFileOperator``: publish the rows of files (local or object storage)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from airflow.sdk import Context, ObjectStoragePath

from airflow_provider_liftbridge.client import BatchPublisher, LiftbridgeClient, PublishSummary, Record
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeFileError
from airflow_provider_liftbridge.lineage import Datasets, file_dataset
from airflow_provider_liftbridge.validation import bad_argument, check_optional_name

from .file_formats import FileFormat, check_file_format, detect_format, read_rows
from .publishing_base import LiftbridgePublishingOperator
from .records import build_record

__all__ = ["LiftbridgePublishFileOperator"]

_GLOB_CHARS = frozenset("*?[")
#: Headers every published row carries, naming where it came from.
FILE_HEADER = "file"
RECORD_HEADER = "record"
#: Progress is logged every this many rows.
PROGRESS_EVERY = 10_000
#: Its reading options, now fields of ``format=FileFormat(...)``.
_FORMAT_FIELDS = ("encoding", "csv_delimiter", "csv_header", "skip_empty_lines", "max_whole_file_bytes")


def _has_glob(text: str) -> bool:
    return any(ch in text for ch in _GLOB_CHARS)


def expand_paths(paths: str | Sequence[str], conn_id: str | None) -> list[ObjectStoragePath]:
    """Resolve file paths and glob patterns (``dir/*.csv``, ``s3://bucket/day=*/part-*.parquet``)
    into files, in order: each entry in turn, the matches of a pattern sorted by name.

    :raises LiftbridgeFileError: a path does not exist, is a directory, or a pattern matches nothing.
    """
    entries = [paths] if isinstance(paths, str) else list(paths)
    if not entries:
        raise LiftbridgeArgumentError("path is empty: give a file, a list of files or a glob pattern")
    files: list[ObjectStoragePath] = []
    for entry in entries:
        entry = str(entry)
        if _has_glob(entry):
            # Split at the last separator before the first wildcard: glob the rest from there.
            first = min(entry.index(ch) for ch in _GLOB_CHARS if ch in entry)
            cut = entry.rfind("/", 0, first)
            base, pattern = (entry[: cut + 1], entry[cut + 1 :]) if cut >= 0 else ("./", entry)
            matches = sorted(
                (p for p in ObjectStoragePath(base, conn_id=conn_id).glob(pattern) if p.is_file()), key=str
            )
            if not matches:
                raise LiftbridgeFileError(f"no file matches {entry!r}")
            files.extend(matches)
            continue
        path = ObjectStoragePath(entry, conn_id=conn_id)
        if not path.exists():
            raise LiftbridgeFileError(f"{entry!r} does not exist")
        if path.is_dir():
            raise LiftbridgeFileError(f"{entry!r} is a directory; give a pattern such as {entry.rstrip('/') + '/*'!r}")
        files.append(path)
    return files


def check_paths(value: Any, name: str = "path") -> list[str]:
    """A file, a glob pattern, or a non-empty list of them (strings).

    :raises LiftbridgeArgumentError: empty, or not strings.
    """
    entries = [value] if isinstance(value, str) else value
    if (
        not isinstance(entries, list | tuple)
        or not entries
        or not all(isinstance(e, str | ObjectStoragePath) and str(e) for e in entries)
    ):
        raise bad_argument(
            name, value, "a file, a glob pattern or a list of them is required", f"e.g. {name}='/data/orders/*.jsonl'"
        )
    return [str(e) for e in entries]


class LiftbridgePublishFileOperator(LiftbridgePublishingOperator):
    """Publish files row by row (or whole), in bounded memory, and fail unless every row is
    acknowledged.

    Files are read through Airflow's ``ObjectStoragePath``: local paths, ``file://`` URLs and any
    object store it supports (``s3://``, ``gs://``, ... with ``storage_conn_id``). Rows are read
    lazily and published ``batch_size`` at a time, so a multi-gigabyte file never sits in memory.
    Progress is logged every 10,000 rows.

    Formats (``format="auto"`` picks one by suffix, unknown suffixes read as ``lines``; a
    :class:`~airflow_provider_liftbridge.operators.file_formats.FileFormat` value gives a format
    with its reading options, e.g. ``format=FileFormat("csv", csv_delimiter=";")``):

    - ``lines``: each line is a message (line ends removed);
    - ``jsonl``: each line must be JSON; published as written; ``key_field`` reads the key from it;
    - ``csv``: each row is published as a JSON object keyed by the header (or a JSON array);
    - ``parquet``: each row is published as a JSON object, read one row group batch at a time;
    - ``whole``: the whole file is one message (up to ``max_whole_file_bytes``).

    Every message carries the headers ``file`` (the file's path) and ``record`` (its row number in
    the file, from 0) besides ``headers``.

    :param stream: the stream to publish to. (templated)
    :param path: a file, a list of files, or glob patterns. (templated)
    :param format: one of ``auto``, ``lines``, ``jsonl``, ``csv``, ``parquet``, ``whole`` (templated),
        or a ``FileFormat`` (the format and its reading options: ``encoding``, ``csv_delimiter``,
        ``csv_header``, ``skip_empty_lines``, ``max_whole_file_bytes``).
    :param storage_conn_id: Airflow connection of the object store, if it needs one. (templated)
    :param key_field: the field (JSON/CSV/Parquet) whose value is a row's key. (templated)
    :param key: / :param headers: / :param partition: / :param partitioner: / :param batch_size: /
        :param options: / :param exactly_once: / :param producer_id: / :param liftbridge_conn_id:
        the publishing options of
        :class:`~airflow_provider_liftbridge.operators.publishing_base.LiftbridgePublishingOperator`
        (``batch_size`` also bounds the rows read ahead); with ``exactly_once`` rows are numbered
        across all files in path order, so the files and their order must not change between tries.
    :return: the publish summary of all files plus ``"files"``: one entry per file with
        ``path``, ``format``, ``count`` and ``partitions`` (same shape as the summary's).
    :raises LiftbridgeFileError: a file is missing or malformed (the message names file and row).
    :raises LiftbridgePublishNotAcknowledgedError: a row was not acknowledged or was refused.
    """

    template_fields: Sequence[str] = (
        "stream",
        "path",
        "format",
        "storage_conn_id",
        "key",
        "key_field",
        "headers",
        "partition",
        "liftbridge_conn_id",
        "producer_id",
    )

    argument_checks = {
        "path": check_paths,
        "format": check_file_format,
        "storage_conn_id": check_optional_name,
        "key_field": check_optional_name,
    }
    removed_arguments = {
        "progress_every": "nothing: progress is logged every 10,000 rows",
        **{name: f"format=FileFormat(<format>, {name}=...)" for name in _FORMAT_FIELDS},
    }

    def __init__(
        self,
        *,
        stream: str,
        path: str | Sequence[str],
        format: str | FileFormat = "auto",
        storage_conn_id: str | None = None,
        key_field: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)  # the publishing options: see the base class
        self.path = path
        self.format = format
        self.storage_conn_id = storage_conn_id
        self.key_field = key_field

    def _records(self, path: ObjectStoragePath, fmt: str, handle: Any) -> Iterator[Record]:
        name = str(path)
        options = check_file_format(self.format).read_options(max(1, self._batch_size))
        for number, (value, fields) in enumerate(read_rows(handle, name, fmt, options)):
            key = self.key
            if self.key_field:
                if fields is None:
                    raise LiftbridgeFileError(
                        f"{name}: key_field={self.key_field!r}, but {fmt!r} rows have no fields; "
                        "use jsonl, csv or parquet, or drop key_field"
                    )
                if self.key_field not in fields:
                    raise LiftbridgeFileError(
                        f"{name}: key_field={self.key_field!r} is not a field of record {number}; its fields are "
                        f"{sorted(map(str, fields))}: set key_field to one of them"
                    )
                key = fields[self.key_field]
            yield build_record(
                value,
                key=key,
                headers=self.headers,
                extra_headers={FILE_HEADER: name, RECORD_HEADER: str(number)},
            )

    def _publish_file(
        self, publisher: BatchPublisher, path: ObjectStoragePath, done_before: int
    ) -> tuple[str, PublishSummary]:
        fmt = detect_format(path.name, check_file_format(self.format).name)
        self.log.info("Publishing %s as %s to stream %r", path, fmt, self.stream)
        next_log = [PROGRESS_EVERY]
        started = time.monotonic()

        def progress(summary: PublishSummary) -> None:
            if summary.count >= next_log[0]:
                rate = summary.count / max(time.monotonic() - started, 1e-9)
                self.log.info(
                    "%s: %d record(s) published (%d in all), %.0f records/s",
                    path.name,
                    summary.count,
                    done_before + summary.count,
                    rate,
                )
                next_log[0] = (summary.count // PROGRESS_EVERY + 1) * PROGRESS_EVERY

        try:
            with path.open("rb") as handle:
                summary = self.send_records(publisher, self._records(path, fmt, handle), on_progress=progress)
        except (OSError, UnicodeDecodeError) as exc:
            raise LiftbridgeFileError(f"cannot read {path}: {exc}") from exc
        self.log.info("%s: %d record(s) published and acknowledged: %d", path.name, summary.count, summary.acknowledged)
        if summary.count == 0:
            self.log.warning("%s holds no records: nothing was published from it", path)
        return fmt, summary

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the files (globs expanded), writes the stream."""
        files = expand_paths(self.path, self.storage_conn_id)
        return [file_dataset(p) for p in files], [self.lineage_stream(self.stream)]

    def run(self, client: LiftbridgeClient, context: Context) -> dict[str, Any]:
        files = expand_paths(self.path, self.storage_conn_id)
        self.log.info("%d file(s) to publish to stream %r", len(files), self.stream)
        total: PublishSummary | None = None
        per_file: list[dict[str, Any]] = []
        with self.open_publisher(client) as publisher:
            for path in files:
                fmt, summary = self._publish_file(publisher, path, total.count if total else 0)
                entry = summary.to_dict()
                per_file.append(
                    {"path": str(path), "format": fmt, "count": entry["count"], "partitions": entry["partitions"]}
                )
                if total is None:
                    total = PublishSummary(self.stream, summary.ack_policy)
                total.merge(summary)
        assert total is not None  # expand_paths never returns an empty list
        if total.count == 0:
            self.log.warning("There were no records to publish: the %d file(s) are empty", len(files))
        return total.to_dict() | {"files": per_file} | self.write_stats(publisher)
