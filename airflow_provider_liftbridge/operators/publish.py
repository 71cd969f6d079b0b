"""``LiftbridgePublishOperator``: publish records given inline, from XCom, or made by a callable."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from airflow.sdk import Context

from airflow_provider_liftbridge.client import Record
from airflow_provider_liftbridge.exceptions import LiftbridgeArgumentError
from airflow_provider_liftbridge.validation import check_function_path, check_optional_name, import_function, optional

from .publishing_base import LiftbridgePublishingOperator
from .records import build_record

__all__ = ["LiftbridgePublishOperator"]


class LiftbridgePublishOperator(LiftbridgePublishingOperator):
    """Publish records to a stream and fail unless every one is acknowledged.

    Records come from exactly one of:

    - ``records``: a list given inline, rendered by Jinja, or an ``XComArg`` (``task.output``); a
      string is parsed as a JSON list (so ``"{{ ti.xcom_pull('t') | tojson }}"`` works);
    - ``records_callable``: the dotted path of a function returning an iterable of records,
      checked for its shape when the DAG is parsed and imported on the worker when the task starts
      (so the DAG serializes cleanly, and its module need not exist where DAGs are parsed).

    Each record is ``bytes`` (published as it is), ``str`` (UTF-8), a
    :class:`~airflow_provider_liftbridge.client.Record` (full control), or any other JSON value
    (published as compact JSON). ``None`` is refused (not published as ``null``).

    :param stream: the stream to publish to. (templated)
    :param records: the records, see above. (templated)
    :param records_callable: dotted path of a function returning records. (templated)
    :param records_callable_kwargs: its keyword arguments. (templated)
    :param key_field: for mapping records, the field whose value is the key. (templated)
    :param key: / :param headers: / :param partition: / :param partitioner: / :param batch_size: /
        :param options: / :param exactly_once: / :param producer_id: / :param liftbridge_conn_id:
        the publishing options of
        :class:`~airflow_provider_liftbridge.operators.publishing_base.LiftbridgePublishingOperator`;
        with ``exactly_once`` a record's sequence number is its position in ``records``.
    :return: the publish summary, ``{"stream", "count", "acknowledged", "ack_policy",
        "partitions": {"<n>": {"first_offset", "last_offset", "count"}}}``; with ``exactly_once``
        also ``"producer_id"``, ``"written"`` and ``"skipped"``.
    :raises LiftbridgePublishNotAcknowledgedError: a record was not acknowledged or was refused.
    :raises LiftbridgeArgumentError: no records source, or two of them, or a record cannot be encoded,
        or ``records_callable`` cannot be imported on the worker (before anything is published).
    """

    template_fields: Sequence[str] = (
        "stream",
        "records",
        "records_callable",
        "records_callable_kwargs",
        "key",
        "key_field",
        "headers",
        "partition",
        "liftbridge_conn_id",
        "producer_id",
    )
    template_fields_renderers = {"records": "json", "headers": "json"}
    argument_checks = {"key_field": check_optional_name, "records_callable": optional(check_function_path)}
    function_arguments = ("records_callable",)
    removed_arguments = {"records_callable_args": "records_callable_kwargs={...} (keyword arguments only)"}

    def __init__(
        self,
        *,
        stream: str,
        records: Any = None,
        records_callable: str | None = None,
        records_callable_kwargs: Mapping[str, Any] | None = None,
        key_field: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream=stream, **kwargs)  # the publishing options: see the base class
        if (records is None) == (records_callable is None):
            raise LiftbridgeArgumentError("give exactly one of records and records_callable")
        self.records = records
        self.records_callable = records_callable
        self.records_callable_kwargs = records_callable_kwargs
        self.key_field = key_field

    def source_records(self, context: Context) -> Iterator[Record]:
        """The records to publish, from ``records`` or ``records_callable``, built lazily.

        :raises LiftbridgeArgumentError: the source does not give a list/iterable of records, or a
            record cannot be encoded.
        """
        source = self._source()  # checked now, before anything is published
        return (self._record(number, item) for number, item in enumerate(source))

    def _record(self, number: int, item: Any) -> Record:
        if item is None:
            # JSON null would be published as b"null": almost always a list with a hole in it.
            raise LiftbridgeArgumentError(
                f"records[{number}] is None; give b'' for an empty value, or 'null' to publish JSON null"
            )
        return build_record(item, key=self.key, key_field=self.key_field, headers=self.headers)

    def _source(self) -> Iterable[Any]:
        """The user's values, from ``records`` or ``records_callable``.

        :raises LiftbridgeArgumentError: the source does not give a list/iterable of records.
        """
        if self.records_callable is not None:
            func = import_function(self.records_callable, "records_callable")
            produced = func(**(self.records_callable_kwargs or {}))
            if produced is None or isinstance(produced, str | bytes | Mapping):
                raise LiftbridgeArgumentError(
                    f"records_callable {self.records_callable!r} must return an iterable of records, "
                    f"got {type(produced).__name__}"
                )
            return produced  # type: ignore[no-any-return]
        records = self.records
        if isinstance(records, str):
            try:
                records = json.loads(records)
            except json.JSONDecodeError as exc:
                raise LiftbridgeArgumentError(f"records is a string but not a JSON list: {exc}") from None
        if isinstance(records, Mapping) or not isinstance(records, Iterable) or isinstance(records, bytes):
            raise LiftbridgeArgumentError(f"records must be a list of records, got {type(records).__name__}")
        return records
