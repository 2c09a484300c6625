"""Importing and running the user's own code: hand schedules (`module:function`).

A schedule is arbitrary Python that runs at build time, as a build backend's code does.
Two rules follow. What it raises is the user's error: one line saying which schedule
failed and how (`UserCodeError`), then the traceback of their frames only, never ours.
And a directory added for it (the declaration file's, or the current one) is on `sys.path`
only while its module is imported, after everything morello-build itself needs was
imported, so a `subprocess.py` or `platformdirs.py` there can shadow nothing of ours.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from morello_build.errors import MorelloError, UserCodeError

__all__ = ["SCHEDULE_REF", "import_schedule", "schedule_import_path", "user_failure"]

#: `module:function`, dotted module names allowed (the declarations' `schedule` too).
SCHEDULE_REF = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z"
)
#: Frames under these directories are ours or importlib's, never the user's.
_NOT_USER_DIRS = tuple(
    str(Path(f).resolve().parent) + "/" for f in (__file__, importlib.__file__) if f
)


def _user_traceback(exc: BaseException) -> str:
    """The traceback of `exc` restricted to the user's frames (none of ours, none of
    importlib's), with the exception line; empty when none of the frames is theirs."""
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not str(Path(f.filename).resolve()).startswith(_NOT_USER_DIRS)
        and not f.filename.startswith("<frozen importlib")
    ]
    if not frames:
        return ""
    lines = ["schedule traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip("\n")


def user_failure(ref: str, what: str, exc: BaseException) -> UserCodeError:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 200 else text[:200] + "..."
    how = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return UserCodeError(f"schedule {ref!r}: {what} {how}", _user_traceback(exc))


@contextlib.contextmanager
def schedule_import_path(directory: str | None) -> Iterator[None]:
    """`directory` first on `sys.path` for the duration of a schedule's import only; what
    morello-build itself imports is imported before, so a file there (`subprocess.py`,
    `platformdirs.py`) can shadow nothing of ours."""
    if directory is None:
        yield
        return
    import morello_build.harness.verify  # noqa: F401  (subprocess, tempfile, the compilers)
    import morello_build.schedule  # noqa: F401  (and with it numpy, filelock, platformdirs)

    sys.path.insert(0, directory)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        if sys.path and sys.path[0] == directory:
            del sys.path[0]
        else:
            with contextlib.suppress(ValueError):
                sys.path.remove(directory)


def import_schedule(ref: str, path: str | None = None) -> Callable[..., Any]:
    """Import a hand schedule given as `module:function`; `path` (e.g. the declaration
    file's directory) is searched first while importing it, and only then.

    Importing runs the user's code: whatever it raises is their error (`UserCodeError`,
    with their frames of the traceback), never a traceback of ours.
    """
    if not isinstance(ref, str) or not SCHEDULE_REF.match(ref):
        raise MorelloError(f"schedule {ref!r}: expected 'module:function'")
    mod_name, _, fn_name = ref.partition(":")
    with schedule_import_path(path):
        try:
            mod = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing == mod_name or mod_name.startswith(missing + "."):
                raise MorelloError(f"schedule {ref!r}: cannot import {mod_name}: {exc}") from None
            raise user_failure(ref, f"importing {mod_name} raised", exc) from None
        except SyntaxError as exc:
            where = f" ({exc.filename}, line {exc.lineno})" if exc.filename else ""
            raise MorelloError(
                f"schedule {ref!r}: cannot import {mod_name}: {type(exc).__name__}: "
                f"{exc.msg}{where}"
            ) from None
        except (Exception, SystemExit) as exc:  # their module's top level failed
            raise user_failure(ref, f"importing {mod_name} raised", exc) from None
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise MorelloError(f"schedule {ref!r}: {mod_name} has no function {fn_name!r}")
    return fn
