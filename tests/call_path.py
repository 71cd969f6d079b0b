"""Follow a call through the package's files: which files a call passes through to reach a given
function (the path a reader follows), across the blocking client's thread switch.

:class:`CallPath` is a profile function (``sys.setprofile`` and ``threading.setprofile``). At every
call into the package it takes the chain of callers: the calling thread's stack and, on another
thread, the stack of the thread that waits for it (the blocking caller, across the transport's
thread switch). An operation the transport is driving is a suspended generator, on no stack while
the transport carries out the effect it yielded: it is put into the chain at the transport's
``drive`` frame. The chain at the first call of ``target`` is the path; any file met twice on one
chain of real callers (``A -> B -> A``) is a return trip.
"""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import airflow_provider_liftbridge

PACKAGE = str(Path(airflow_provider_liftbridge.__file__).parent) + os.sep


def _package_frames(frame: types.FrameType | None) -> list[types.FrameType]:
    """The package's frames on the stack ending at ``frame``, outermost first."""
    found = []
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            found.append(frame)
        frame = frame.f_back
    found.reverse()
    return found


def _operation_frames(op: Any) -> list[types.FrameType]:
    """The frames of a suspended operation: the generator and those it delegates to."""
    found = []
    while isinstance(op, types.GeneratorType) and not op.gi_running:
        if op.gi_frame is not None:
            found.append(op.gi_frame)
        op = op.gi_yieldfrom
    return found


def _files(frames: list[types.FrameType]) -> list[str]:
    """The files of ``frames`` relative to the package, repeats in a row folded."""
    files: list[str] = []
    for frame in frames:
        name = frame.f_code.co_filename[len(PACKAGE) :]
        if not files or files[-1] != name:
            files.append(name)
    return files


def _name(frame: types.FrameType) -> tuple[str, str]:
    return frame.f_code.co_filename[len(PACKAGE) :], frame.f_code.co_name


class CallPath:
    """Records the path to the first call of ``target`` (a function name in ``target_file``)
    and every return trip inside calls of ``within`` (``(file, function)``; ``None``: anywhere);
    made for one call on ``main`` (the current thread)."""

    def __init__(self, target_file: str, target: str, within: tuple[str, str] | None = None) -> None:
        self.target = (target_file, target)
        self.within = within
        self.main = threading.get_ident()
        #: ``(file, function)`` of each frame on the path, outermost first (empty until reached).
        self.path: list[tuple[str, str]] = []
        #: Where the path crossed threads: ``(last file on the waiting thread, first on the other)``.
        self.switch: tuple[str, str] | None = None
        #: Chains of callers' files on which a file came back after another.
        self.return_trips: list[list[str]] = []

    def _chain(self, frame: types.FrameType) -> tuple[list[types.FrameType], list[types.FrameType]]:
        """The real callers of ``frame``: those on the waiting main thread, and those here."""
        here = _package_frames(frame)
        if threading.get_ident() == self.main:
            return [], here
        return _package_frames(sys._current_frames().get(self.main)), here

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        waiting, here = self._chain(frame)
        files = _files(waiting + here)
        if len(set(files)) < len(files) and (self.within is None or any(map(self._is_within, waiting + here))):
            self.return_trips.append(files)
        name = _name(frame)
        if name != self.target or self.path:
            return
        path: list[types.FrameType] = []
        for f in waiting + here:
            path.append(f)
            if f.f_code.co_name == "drive" and "/transport/" in f.f_code.co_filename:
                path += _operation_frames(f.f_locals.get("op"))
        self.path = [_name(f) for f in path]
        if waiting:
            self.switch = (_files(waiting)[-1], _files(here)[0])

    def _is_within(self, frame: types.FrameType) -> bool:
        return _name(frame) == self.within

    @property
    def files(self) -> list[str]:
        """The files of the path, in the order a reader meets them, each once."""
        seen: list[str] = []
        for file, _ in self.path:
            if file not in seen:
                seen.append(file)
        return seen


@contextmanager
def follow(target_file: str, target: str, within: tuple[str, str] | None = None) -> Iterator[CallPath]:
    """Record the path of calls made inside the ``with`` block (threads started inside it too)."""
    tracer = CallPath(target_file, target, within)
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    try:
        yield tracer
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
