"""``LiftbridgeStreamToFileOperator``: archive a stream (what arrived since the last run, a
consumer group's share, or a data interval: ``read``) to JSON lines, CSV or Parquet files, each
message exactly once across retries (see ``docs/consume.md``)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from airflow.sdk import Asset, Context, ObjectStoragePath

from airflow_provider_liftbridge.client import LiftbridgeClient, Message
from airflow_provider_liftbridge.client.reading import (
    BatchFailed,
    BatchHandler,
    DataIntervalReading,
    PartitionPlan,
    PartitionReport,
)
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError, LiftbridgeFileError
from airflow_provider_liftbridge.lineage import Datasets, file_dataset
from airflow_provider_liftbridge.validation import check_function, import_function

from .archive_files import NO_END, temporary_range
from .archive_formats import PARQUET, ArchiveFormat, check_format, write_options
from .archive_layout import ArchiveLayout, LayoutValueError
from .dead_letters import open_dead_letters
from .file_writers import (
    WRITE_FORMATS,
    ArchivedFile,
    ArchiveValueError,
    WriteOptions,
    partition_prefix,
    write_range,
)
from .partitions import partition_key_of, partition_of
from .reading_base import LiftbridgeReadingOperator

__all__ = ["LiftbridgeStreamToFileOperator"]

#: What follows a partition's prefix in the name of one of its files (see ``file_writers.file_name``).
_FILE_REST = re.compile(r"(\d{20})-(\d{20})(\.[a-z]+)")


def _later(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def _by_folder(batch: list[Message], folder_of: Callable[[Message], str] | None) -> list[tuple[str, list[Message]]]:
    """The batch's messages per folder, in the order folders first appear (one file each).

    :raises BatchFailed: a message cannot be placed (its value is not a JSON object); nothing of
        the batch counts.
    """
    if folder_of is None:
        return [("", batch)]
    groups: dict[str, list[Message]] = {}
    for message in batch:
        try:
            folder = folder_of(message)
        except LayoutValueError as bad:
            raise BatchFailed(0, message, str(bad)) from bad
        groups.setdefault(folder, []).append(message)
    return list(groups.items())


def _chunks(batch: list[Message], size: int) -> Iterator[list[Message]]:
    for start in range(0, len(batch), size):
        yield batch[start : start + size]


class LiftbridgeStreamToFileOperator(LiftbridgeReadingOperator):
    """Write what ``read`` says to read from a stream to files: each message in exactly one
    file, however often the task is retried or killed.

    The range read is planned once per DAG run, as for ``LiftbridgeConsumeOperator`` (``read``,
    ``partitions``: see :class:`~.reading_base.LiftbridgeReadingOperator`). Each batch of up to
    ``batch_size`` messages of one partition becomes one file, named by stream, partition, first and last offset
    (``orders-0-00000000000000001000-00000000000000001999.parquet``): written to a temporary
    dot-name, renamed into place when complete, and only then is the position committed. A retry
    resumes after the last committed file and cuts the same batches, so it writes the same names:
    a file the killed try completed but did not commit is overwritten, never doubled. Before it
    writes to a partition, a try also removes what a try that died left of its plan's remaining
    range: the partition's files that start in it, and temporary files (named by the offsets they
    may hold) that overlap it. Nothing outside the plan is touched.

    Exactly once holds per directory: archive a stream with one cursor (or group) per ``path``.

    With ``read=DataInterval(...)`` each run archives the messages of its data interval (see
    :class:`~.read_modes.DataInterval`); since a try cleans up only inside its own
    plan, runs of other intervals (a backfill beside the regular runs, any number at once) share
    the directory, and its folders, safely. With ``path_layout`` the files go to
    folders named by the message's time, the data interval or a JSON field
    (``dt={timestamp:%Y-%m-%d}/hour={timestamp:%H}``; syntax in ``docs/consume.md``), still named
    by partition and offset range inside each folder; a batch whose messages belong to several
    folders becomes one file per folder.

    :param path: the directory: a local path, a URL of any filesystem Airflow's
        ``ObjectStoragePath`` knows (``file://``, ``s3://``, ``gs://``, ...) or an
        ``ObjectStoragePath``. Created if missing; checked writable before anything is read.
        (templated)
    :param path_layout: the folder template under ``path`` (default: no folders). (templated)
    :param storage_conn_id: the Airflow connection of the object store, if it needs one. (templated)
    :param format: the file format: :class:`~.archive_formats.Parquet` (default; its
        ``compression``, ``json_schema``, ``row_group_rows``), :class:`~.archive_formats.Csv` or
        :class:`~.archive_formats.JsonLines`, or one's name (``"parquet"``, ``"csv"``,
        ``"jsonl"``: its defaults; templated).
    :param value_format: ``text`` (default), ``bytes`` or ``json`` (an object's fields become
        columns); see :mod:`~.file_writers` for the columns of each format.
    :param batch_size: messages per file; a batch, held in memory while its file is written
        (default 100,000).
    :param dead_letters: ``None`` (default): a message that cannot be written (not JSON with
        ``value_format="json"``, not UTF-8 text) fails the task, naming its offset, before the
        position passes it; a :class:`~.dead_letters.DeadLetterStream`: it goes to that stream
        with the reason in its headers, and the file goes on without it. (templated: its
        ``stream``)
    :param on_file: called (callable or dotted path) with each completed file's entry (the dict
        of the XCom's ``files``) and ``on_file_kwargs``, before the position moves past it; an
        exception fails the task there (the file is rewritten by the retry). A dotted path is
        imported on the worker when the task starts, not when the DAG is parsed.
    :param on_file_kwargs: keyword arguments of ``on_file``. (templated)
    :return: the reading summary (``stream``, ``cursor_id``/``group_id``, ``partitions``,
        ``processed``, ``dead_lettered``) and ``files``: every file of this run's plan, earlier
        tries' included, each ``{"path", "stream", "partition", "first_offset", "last_offset",
        "rows"}``, in partition and offset order. An ``Asset`` in ``outlets`` gets an event whose
        extra holds the paths (on a partitioned run also ``partition_key`` and ``path``; Airflow
        gives the event the run's partition key).
    :raises LiftbridgeFileError: the path cannot be written (before any position moves).
    :raises LiftbridgeAirflowError: a message cannot be written (naming stream, partition, offset).
    """

    template_fields: Sequence[str] = (
        *LiftbridgeReadingOperator.template_fields,
        "path",
        "path_layout",
        "storage_conn_id",
        "format",
        "on_file_kwargs",
    )
    ui_color = "#e8f6ee"
    function_arguments = ("on_file",)

    def __init__(
        self,
        *,
        path: str | ObjectStoragePath,
        path_layout: str | None = None,
        format: str | ArchiveFormat = PARQUET,
        value_format: str = "text",
        storage_conn_id: str | None = None,
        batch_size: int = 100_000,
        on_file: Callable[..., Any] | str | None = None,
        on_file_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.path = path
        self.path_layout = path_layout
        self.format = format
        self.value_format = value_format
        self.storage_conn_id = storage_conn_id
        self.on_file = on_file
        self.on_file_kwargs = on_file_kwargs
        self._files: list[ArchivedFile] = []
        self._plan_ends: dict[int, int] = {}
        super().__init__(batch_size=batch_size, **kwargs)

    # -- arguments ----------------------------------------------------------------------------
    def check_arguments(self, *, rendered: bool) -> None:
        """The reading arguments, and the archive's: format, value format, error handling.

        :raises LiftbridgeArgumentError: the argument at fault is named, with the fix.
        """
        super().check_arguments(rendered=rendered)
        if rendered or not _later(self.format):
            self._write_options()
        if not self.path:
            raise LiftbridgeArgumentError("path is empty: give the directory to archive to (a path or a URL)")
        if self.path_layout and (rendered or not _later(self.path_layout)):
            ArchiveLayout(self.path_layout)
        if self.on_file is not None:
            check_function(self.on_file, "on_file")  # its shape: it is imported on the worker, when the task runs
        if (rendered or not _later(self.on_file_kwargs)) and not isinstance(self.on_file_kwargs, Mapping | None):
            raise LiftbridgeArgumentError(f"on_file_kwargs must be a dict, got {type(self.on_file_kwargs).__name__}")

    def _write_options(self) -> WriteOptions:
        return write_options(self.format, self.value_format)

    # -- the directory ------------------------------------------------------------------------
    def directory(self) -> ObjectStoragePath:
        """The archive directory as an ``ObjectStoragePath`` (not checked)."""
        if isinstance(self.path, ObjectStoragePath):
            return self.path
        return ObjectStoragePath(str(self.path), conn_id=self.storage_conn_id)

    def _writable_directory(self) -> ObjectStoragePath:
        """The directory, created if missing, after writing and removing a probe file in it.

        :raises LiftbridgeFileError: it cannot be created or written (names the path and the fix).
        """
        directory = self.directory()
        probe = directory / f".liftbridge-probe-{uuid.uuid4().hex[:12]}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except (OSError, ValueError) as exc:
            raise LiftbridgeFileError(
                f"cannot write to the archive path {directory}: {type(exc).__name__}: {exc}; give a path the "
                "worker can write to (and storage_conn_id for an object store that needs credentials). Nothing "
                "was read and no position moved"
            ) from exc
        return directory

    def _found(self, directory: ObjectStoragePath, pattern: str) -> list[ObjectStoragePath]:
        """The files matching ``pattern`` in the directory, and in its folders with a layout."""
        return list(directory.rglob(pattern) if self.path_layout else directory.glob(pattern))

    def _clean_partition(self, directory: ObjectStoragePath, partition: int, next_offset: int, end: int) -> None:
        """Remove what a try that died may have left of the partition's offsets
        ``next_offset`` to before ``end`` (this try writes them again): files that start in that
        range (renamed into place, not committed) and temporary files whose range overlaps it.
        Files of other ranges are left alone, so runs of other intervals (or other plans) may
        write beside this one, in its folders or the same one."""
        prefix = partition_prefix(self.stream, partition)
        suffix = WRITE_FORMATS[check_format(self.format).name]
        for found in self._found(directory, prefix + "*") + self._found(directory, "." + prefix + "*"):
            name = found.name
            if name.startswith("."):
                span = temporary_range(self.stream, partition, name)
                stale = span is not None and span[0] < end and span[1] > next_offset
            else:
                match = _FILE_REST.fullmatch(name[len(prefix) :])
                stale = match is not None and match.group(3) == suffix and next_offset <= int(match.group(1)) < end
            if stale:
                self.log.info("Removing %s: from a try that did not commit it; rewritten now", found)
                found.unlink(missing_ok=True)

    def _files_before(
        self, directory: ObjectStoragePath, partition: int, first: int, before: int
    ) -> list[ArchivedFile]:
        """The partition's files holding offsets from ``first`` to before ``before`` (what earlier
        tries of this run wrote and committed), read from their names."""
        prefix = partition_prefix(self.stream, partition)
        suffix = WRITE_FORMATS[check_format(self.format).name]
        found = []
        for path in self._found(directory, prefix + "*"):
            match = _FILE_REST.fullmatch(path.name[len(prefix) :])
            if match and match.group(3) == suffix:
                low, high = int(match.group(1)), int(match.group(2))
                if low >= first and high < before:
                    found.append(ArchivedFile(str(path), self.stream, partition, low, high, -1))
        return sorted(found, key=lambda f: f.first_offset)

    # -- the batches --------------------------------------------------------------------------
    def make_handler(self, client: LiftbridgeClient, context: Context) -> BatchHandler:
        """Each batch (one partition's messages) becomes one file; the position moves after it.

        :raises LiftbridgeFileError: the directory cannot be written.
        :raises NoSuchStreamError: the dead-letter stream does not exist (and is not to be created).
        """
        directory = self._writable_directory()
        options = self._write_options()
        dead = open_dead_letters(client, self.dead_letters)
        on_file = import_function(self.on_file, "on_file") if self.on_file is not None else None
        on_file_kwargs = dict(self.on_file_kwargs or {})
        cleaned: set[int] = set()
        self._files = []
        self._directory = directory
        folder_of = self._folder_of(context)

        def handle(batch: list[Message]) -> int:
            partition = batch[0].partition
            end = self._plan_ends.get(partition, NO_END)
            if partition not in cleaned:
                self._clean_partition(directory, partition, batch[0].offset, end)
                cleaned.add(partition)
            rejected = 0

            def reject(message: Message, why: ArchiveValueError) -> None:
                nonlocal rejected
                assert dead is not None
                dead.send(message, why)
                rejected += 1

            for folder, messages in _by_folder(batch, folder_of):
                target = directory
                if folder:
                    target = directory / folder
                    target.mkdir(parents=True, exist_ok=True)
                try:
                    written = write_range(
                        target,
                        self.stream,
                        partition,
                        _chunks(messages, options.batch_rows),
                        options,
                        reject if dead else None,
                        end=end,
                    )
                except ArchiveValueError as bad:
                    failed = BatchFailed(0, bad.message, bad.problem)  # nothing of the batch counts
                    raise failed from bad
                if written is not None:
                    self._files.append(written)
                    self.log.info(
                        "Wrote %s: offsets %d..%d, %d row(s)",
                        written.path,
                        written.first_offset,
                        written.last_offset,
                        written.rows,
                    )
                    if on_file is not None:
                        on_file(written.to_dict(), **on_file_kwargs)
            return rejected

        return handle

    def planned(self, plans: list[PartitionPlan]) -> None:
        """Keep each partition's plan end: a try cleans up only inside its own plan's range, and
        names its temporary files by it."""
        self._plan_ends = {plan.partition: plan.end for plan in plans}

    def _folder_of(self, context: Context) -> Callable[[Message], str] | None:
        """The layout's folder of a message (``None``: no layout).

        :raises LiftbridgeArgumentError: the layout names the data interval or the partition and
            the run has none.
        """
        if not self.path_layout:
            return None
        layout = ArchiveLayout(str(self.path_layout))
        interval = None
        if layout.uses_interval:
            if isinstance(self.reading, DataIntervalReading):
                interval = (self.reading.interval.start, self.reading.interval.end)
            elif context.get("data_interval_start") is not None and context.get("data_interval_end") is not None:
                interval = (context["data_interval_start"], context["data_interval_end"])
        return layout.folder_of(interval, partition_of(context) if layout.uses_partition else None)

    def describe_failure(self, failed: BatchFailed) -> str:
        m = failed.message
        cause = failed.__cause__
        if isinstance(cause, LiftbridgeFileError) and not isinstance(cause, ArchiveValueError):
            return f"{cause}. The position stays before offset {m.offset} of partition {m.partition}"
        return (
            f"cannot archive stream {m.stream!r} partition {m.partition} offset {m.offset}: {failed}. The position "
            "stays before this message, so the next try starts there; give dead_letters=DeadLetterStream(...) to "
            "set such messages aside instead"
        )

    # -- the result ---------------------------------------------------------------------------
    def result(self, reports: dict[int, PartitionReport], mode: dict[str, Any]) -> dict[str, Any]:
        """The reading summary plus ``files``: this try's files, and the ones earlier tries of the
        run committed (found by name between the plan's start and this try's first offset)."""
        summary = super().result(reports, mode)
        files = list(self._files)
        for partition, report in reports.items():
            plan_start = report.plan_start
            if report.resumed and plan_start >= 0:
                resumed_at = report.first_offset if report.first_offset is not None else report.committed + 1
                files.extend(self._files_before(self._directory, partition, plan_start, resumed_at))
        files.sort(key=lambda f: (f.partition, f.first_offset))
        summary["files"] = [f.to_dict() for f in files]
        return summary

    def execute(self, context: Context) -> Any:
        summary = super().execute(context)
        paths = [f["path"] for f in summary["files"]]
        extra: dict[str, Any] = {"stream": self.stream, "files": paths}
        key = partition_key_of(context)
        if key is not None:  # Airflow gives the event the run's partition key; the extra says it too
            extra |= {"partition_key": key, "path": str(self.directory())}
        for outlet in self.outlets:
            if isinstance(outlet, Asset):
                context["outlet_events"][outlet].extra = extra
        return summary

    def lineage_datasets(self, *, complete: bool) -> Datasets:
        """OpenLineage: reads the stream, writes the directory (and the dead-letter stream, if any)."""
        inputs, _ = super().lineage_datasets(complete=complete)
        dead = self.dead_letter_target()
        return inputs, [file_dataset(self.directory()), *([self.lineage_stream(dead)] if dead else [])]
