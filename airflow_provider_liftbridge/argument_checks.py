"""``ArgumentChecks``: how the provider's operators and sensors run their argument checks, and
when (the checks themselves, one validator per option, are :mod:`airflow_provider_liftbridge.validation`).

A class declares its parameters' validators in ``argument_checks``; they run on the literal values
once the outermost ``__init__`` returns (every attribute of every class set, so the DAG fails when
it is parsed) and on every value once templates are rendered. An unknown keyword is refused with the
closest parameter's name (:func:`suggest_parameter`), before Airflow's own, vaguer check.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from airflow_provider_liftbridge.exceptions import LiftbridgeUnknownArgumentError
from airflow_provider_liftbridge.validation import Check, import_function, waits_for_rendering

__all__ = ["SYNONYMS", "ArgumentChecks", "suggest_parameter"]


# -- unknown keywords -----------------------------------------------------------------------------

#: What DAG authors coming from other providers or clients write, and what it is called here.
SYNONYMS: dict[str, str] = {
    "max_batch_size": "batch_size",
    "window_size": "batch_size",
    "fail_if_not_exists": "fail_if_missing",
    "fail_if_not_exist": "fail_if_missing",
    "ignore_if_exists": "fail_if_exists",
    "topic": "stream",
    "stream_name": "stream",
    "conn_id": "liftbridge_conn_id",
    "liftbridge_conn": "liftbridge_conn_id",
    "ack": "ack_policy",
    "acks": "ack_policy",
    "timeout_seconds": "options",
    "num_partitions": "partitions",
    "offset": "target_offset",
    "start_position": "start_at",
    "start_offset": "start_at",
}


#: Instance attribute counting the ``__init__`` calls under way (the outermost one validates).
_BUILDING = "_argument_checks_building"


def _checked_when_built(init: Callable[..., None]) -> Callable[..., None]:
    """``init``, followed by :meth:`ArgumentChecks.check_literal_arguments` when it is the
    outermost ``__init__`` of the object (a subclass's ``__init__`` calls its base's inside)."""

    @functools.wraps(init)
    def init_then_check(self: ArgumentChecks, *args: Any, **kwargs: Any) -> None:
        depth = self.__dict__.get(_BUILDING, 0)
        object.__setattr__(self, _BUILDING, depth + 1)  # Airflow's __setattr__ is not for this
        try:
            init(self, *args, **kwargs)
        finally:
            if depth:
                object.__setattr__(self, _BUILDING, depth)
            else:
                object.__delattr__(self, _BUILDING)
        if not depth:
            self.check_literal_arguments()

    init_then_check._checks_when_built = True  # type: ignore[attr-defined]
    return init_then_check


def suggest_parameter(unknown: str, own: Iterable[str], inherited: Iterable[str] = ()) -> str | None:
    """The parameter ``unknown`` most likely meant: a known synonym, else the closest of the
    class's ``own`` parameters, else the closest ``inherited`` one (Airflow's); ``None`` if none is close."""
    own, inherited = list(own), list(inherited)
    meant = SYNONYMS.get(unknown)
    if meant in own or meant in inherited:
        return meant
    for names in (own, inherited):
        close = difflib.get_close_matches(unknown, names, n=1, cutoff=0.6)
        if close:
            return close[0]
    return None


class ArgumentChecks:
    """Mixin of the provider's operators and sensors: validators declared per class, run on the
    literal values once the object is built and on every value once templates are rendered.

    A class lists its parameters' validators in ``argument_checks`` (merged along the class
    hierarchy) and calls :meth:`reject_unknown_arguments` before ``BaseOperator.__init__``.
    Validation is a step of its own: when the outermost ``__init__`` (the most derived class's)
    returns, every attribute of every class is set, and :meth:`check_literal_arguments` runs (each
    ``__init__`` of a subclass is wrapped for that, in :meth:`__init_subclass__`, under Airflow's
    ``apply_defaults``). :meth:`render_template_fields` runs every validator again on the rendered
    values, and :meth:`check_combination` (override it) checks what depends on several parameters
    at both moments.
    """

    #: Parameter name -> validator, for this class's own parameters.
    argument_checks: ClassVar[Mapping[str, Check]] = {}
    #: This class's parameters that name a function (a callable or a dotted path; their validator,
    #: :func:`check_function` or :func:`check_function_path`, checks the shape): imported by
    #: :meth:`import_functions` when the task runs, never when the DAG is parsed.
    function_arguments: ClassVar[tuple[str, ...]] = ()
    #: Keywords this class (or a base) took once and no longer takes -> what to write instead
    #: (merged along the class hierarchy); refused by :meth:`reject_unknown_arguments` with that.
    removed_arguments: ClassVar[Mapping[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__")
        if init is not None and not getattr(init, "_checks_when_built", False):
            cls.__init__ = _checked_when_built(init)  # type: ignore[misc]

    @classmethod
    def all_argument_checks(cls) -> dict[str, Check]:
        """The validators of this class and its bases (a subclass's entry wins)."""
        merged: dict[str, Check] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("argument_checks", {}))
        return merged

    @classmethod
    def all_removed_arguments(cls) -> dict[str, str]:
        """The removed keywords of this class and its bases, each with what to write instead."""
        merged: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            merged.update(vars(klass).get("removed_arguments", {}))
        return merged

    def _run_checks(self, checks: Mapping[str, Check], *, rendered: bool) -> None:
        for name, check in checks.items():
            value = getattr(self, name, None)
            if rendered or not waits_for_rendering(value):
                check(value, name)
        self.check_combination(rendered=rendered)

    def check_literal_arguments(self, owner: type | None = None) -> None:
        """Run the validators of ``owner``'s own parameters (default: all) on the values that are
        known now; a value that waits for rendering is checked after rendering. Runs by itself,
        with every validator, once the object is built (see the class).

        :raises LiftbridgeArgumentError: a value is invalid (the DAG fails to parse).
        """
        checks = vars(owner).get("argument_checks", {}) if owner is not None else self.all_argument_checks()
        self._run_checks(checks, rendered=False)

    def check_rendered_arguments(self) -> None:
        """Run every validator on the rendered values.

        :raises LiftbridgeArgumentError: a value is invalid (the task fails before any I/O).
        """
        self._run_checks(self.all_argument_checks(), rendered=True)

    def import_functions(self) -> None:
        """Import the function of every parameter in ``function_arguments`` (of this class and its
        bases) that is set, in this process (the worker): call it first in ``execute()``, so a
        module missing there fails the try before anything is read, written or committed.

        :raises LiftbridgeArgumentError: names the parameter, the path, the cause and that the
            module must be importable on the worker.
        """
        for klass in reversed(type(self).__mro__):
            for name in vars(klass).get("function_arguments", ()):
                value = getattr(self, name, None)
                if value is not None:
                    import_function(value, name)

    def check_combination(self, *, rendered: bool) -> None:
        """Check what depends on several parameters (a value waiting for rendering is skipped
        before rendering: use :func:`waits_for_rendering`). Default: nothing. It runs once the
        object is built (every attribute of every class is set) and after rendering."""

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render the templated fields (Airflow), then validate every argument."""
        super().render_template_fields(context, jinja_env)  # type: ignore[misc]
        self.check_rendered_arguments()

    @classmethod
    def accepted_parameters(cls) -> tuple[list[str], list[str]]:
        """``(own, inherited)``: the keywords this class's Liftbridge constructors take, and those of
        the Airflow classes it builds on."""
        own: list[str] = []
        inherited: list[str] = []
        for klass in cls.__mro__:
            init = vars(klass).get("__init__")
            if init is None or klass is object:
                continue
            try:
                params = inspect.signature(init).parameters.values()
            except (TypeError, ValueError):
                continue
            names = [p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"]
            (own if klass.__module__.startswith("airflow_provider_liftbridge") else inherited).extend(names)
        return own, inherited

    def reject_unknown_arguments(self, kwargs: Mapping[str, Any]) -> None:
        """Fail on keywords no class of this operator takes, naming the closest parameter (Airflow's
        own check, which runs after this, says only "Invalid arguments were passed").

        :raises LiftbridgeUnknownArgumentError: an unknown keyword (also a ``TypeError``).
        """
        own, inherited = self.accepted_parameters()
        known = set(own) | set(inherited) | {"_airflow_mapped_validation_only", "_airflow_from_mapped"}
        unknown = [name for name in kwargs if name not in known]
        if not unknown:
            return
        removed = self.all_removed_arguments()
        gone = [name for name in unknown if name in removed]
        if gone:
            raise LiftbridgeUnknownArgumentError(
                f"{type(self).__name__} (task_id {kwargs.get('task_id', '?')!r}) no longer takes "
                + "; ".join(f"{name}={kwargs[name]!r}: write {removed[name]}" for name in gone)
                + " (see CHANGELOG.md)"
            )
        hints = []
        for name in unknown:
            meant = suggest_parameter(name, own, inherited)
            hints.append(f"{name!r} (did you mean {meant!r}?)" if meant else repr(name))
        raise LiftbridgeUnknownArgumentError(
            f"{type(self).__name__} (task_id {kwargs.get('task_id', '?')!r}) takes no parameter "
            f"{', '.join(hints)}; its own parameters are {', '.join(sorted(set(own)))}"
        )
