"""What ``python -m torch_brickdev profile`` runs: a script, or ``-m`` and a module, with its
arguments, run in this process as ``python script.py`` / ``python -m module`` would run it
(``__name__ == "__main__"``, ``sys.argv``, ``sys.path[0]``, an absolute ``__file__``), and its
exception passed on so that the process ends as python's would have (the traceback from the
target's own code, the exit status, a KeyboardInterrupt's SIGINT, ``sys.exit``'s message).
Plain Python (no torch).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.machinery
import importlib.util
import io
import os
import runpy
import sys
import traceback
import types
from dataclasses import dataclass
from typing import Collection, Iterator, List, NoReturn, Optional, Sequence, Tuple

from ..terminal import printable

__all__ = ["Target", "TargetError", "end_as_python_would", "ended_early", "split_command"]


class TargetError(ValueError):
    """A target that cannot be run: nothing named, no such script or module."""


def split_command(arguments: Sequence[str], value_options: Collection[str]
                  ) -> Tuple[List[str], List[str]]:
    """The profile command's own options, and the target with its arguments, split as python
    splits its command line: the first argument that is neither an option nor an option's value
    (``value_options``: the options followed by one) starts the target, ``-m`` (or ``-mNAME``)
    included; ``--`` ends the options. Everything after belongs to the target, as given."""
    i = 0
    while i < len(arguments):
        arg = arguments[i]
        if arg == "--":
            return list(arguments[:i]), list(arguments[i + 1:])
        if arg.startswith("-m") or not arg.startswith("-") or arg == "-":
            return list(arguments[:i]), list(arguments[i:])
        i += 2 if arg in value_options else 1
    return list(arguments), []


@dataclass(frozen=True)
class Target:
    """A script (its path as given) or a module (its dotted name), and its arguments."""

    script: Optional[str]
    module: Optional[str]
    args: Tuple[str, ...]

    @classmethod
    def parse(cls, command: Sequence[str]) -> "Target":
        """``command``: ``script args...``, ``-m module args...`` or ``-mmodule args...``."""
        if not command:
            raise TargetError("expected a script, or -m and a module, after profile's options "
                              "(python -m torch_brickdev profile [options] script.py [args])")
        first = command[0]
        if not first.startswith("-m"):
            return cls(first, None, tuple(command[1:]))
        name, args = (first[2:], command[1:]) if first != "-m" else (
            command[1] if len(command) > 1 else "", command[2:])
        if not name:
            raise TargetError("-m expects a module name, as for python -m (e.g. -m pkg.train)")
        return cls(None, name, tuple(args))

    @property
    def label(self) -> str:
        """The target as messages name it: ``train.py`` or ``-m pkg.train``."""
        return printable(self.script if self.script is not None else f"-m {self.module}", 200)

    def metadata(self) -> dict:
        """The report's record of what ran: ``script`` (or ``module``) and ``argv``."""
        key, name = ("script", self.script) if self.script is not None else ("module", self.module)
        return {key: name, "argv": list(self.args)}

    def check(self) -> None:
        """Raises TargetError when there is nothing to run: no such file, no such module."""
        if self.script is not None:
            if not os.path.isfile(self.script):
                raise TargetError(f"no such script: {printable(self.script, 200)} (expected a "
                                  "Python file)")
            return
        with self._as_python_would():
            try:
                found = importlib.util.find_spec(self.module) is not None
            except (ImportError, ValueError):  # a parent package missing; a relative name
                found = False
        if not found:
            raise TargetError(f"no module named {printable(self.module, 200)!r} (looked up as "
                              "python -m does: the current folder first, then sys.path)")

    def run(self) -> None:
        """Runs the target to its end here; its exceptions (SystemExit too) propagate."""
        with self._as_python_would():
            if self.script is not None:
                _exec_file(self.script)
            else:
                runpy.run_module(self.module, run_name="__main__", alter_sys=True)

    @contextlib.contextmanager
    def _as_python_would(self) -> Iterator[None]:
        """``sys.argv`` and ``sys.path[0]`` as python sets them for the target, for the duration.
        The first path entry is the one python made for this command line (the current folder of
        ``python -m torch_brickdev``); under ``-P`` (``sys.flags.safe_path``) there is none."""
        saved_argv, saved_path = sys.argv, list(sys.path)
        if self.script is not None:
            # argv[0] as given; the folder with symbolic links resolved, as python does
            sys.argv = [self.script, *self.args]
            entry = os.path.dirname(os.path.realpath(self.script))
        else:
            # "-m" while the module is looked up; run_module then puts its file there
            sys.argv = ["-m", *self.args]
            entry = os.getcwd()
        if not sys.flags.safe_path:
            sys.path[:1] = [entry]
        try:
            yield
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path


def _exec_file(path: str) -> None:
    """Runs a Python file as ``python path`` does: in a fresh ``__main__`` (in sys.modules while
    it runs) whose ``__file__``, like its code's file name, is the path made absolute as python
    makes it (the current folder joined, not normalized: ``/cwd/../s.py``). runpy.run_path cannot
    give both that ``__file__`` and ``sys.argv[0]`` as typed."""
    filename = os.path.join(os.getcwd(), path)  # an absolute path stays as it is
    with io.open_code(filename) as file:
        code = compile(file.read(), filename, "exec")  # bytes: the file's coding cookie applies
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=filename, __cached__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", filename))
    saved_main = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        sys.modules["__main__"] = saved_main


# The frames that run a target's code, below Target.run (``python -m torch_brickdev`` itself
# runs in a runpy frame too): the traceback python would show starts right after them.
_RUNNER_CODE = (_exec_file.__code__, runpy._run_code.__code__)


def _target_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """The part of a traceback from the target's own first frame on (None when the exception
    came before the target ran, e.g. its SyntaxError, which shows its place itself)."""
    while tb is not None and tb.tb_frame.f_code is not Target.run.__code__:
        tb = tb.tb_next
    while tb is not None:
        if tb.tb_frame.f_code in _RUNNER_CODE:
            return tb.tb_next
        tb = tb.tb_next
    return None


def ended_early(target: Target, error: BaseException) -> Optional[str]:
    """Why the target ended before its end, for the report; None when it ended itself
    (``sys.exit``, whatever its code)."""
    if isinstance(error, SystemExit):
        return None
    if isinstance(error, KeyboardInterrupt):
        return f"{target.label} was interrupted (KeyboardInterrupt)"
    raised = traceback.format_exception_only(error)[-1].strip()  # "pkg.Error: message"
    return f"{target.label} raised {printable(raised, 300)}"


def end_as_python_would(error: BaseException) -> NoReturn:
    """Raises the target's exception again, so that the process ends as python's would have:
    the interpreter prints it through ``sys.excepthook`` (the traceback cut to the target's own
    frames) and exits 1, a KeyboardInterrupt ends it by SIGINT (status 130 in a shell), a
    SystemExit exits with its code or prints its message."""
    hook = sys.excepthook  # the target's own, if it set one

    def target_traceback(kind, value, tb):
        if value is error:  # the exception's own traceback is the one printed
            tb = _target_frames(tb)
            value.with_traceback(tb)
        hook(kind, value, tb)

    sys.excepthook = target_traceback
    raise error
