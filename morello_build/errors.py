"""Exceptions of morello-build.

Every error the package raises on purpose derives from `MorelloError`, so the CLI and the
build step can turn any of them into one clear message instead of a traceback.
"""

from __future__ import annotations


class MorelloError(Exception):
    """An expected failure with a message meant for the user.

    ``str(exc)`` is the one-line message; ``detail`` (usually empty) holds lines printed
    after it, e.g. the traceback of the user's own code that failed.
    """

    detail: str = ""


class SpecError(MorelloError):
    """A malformed or unsupported Spec, dtype, layout or memory level."""


class NoImplementation(MorelloError):
    """The search found no program for a Spec under its memory limits."""


class UserCodeError(MorelloError):
    """The user's own code (a hand schedule) failed: the message says which and how; the
    ``detail`` is the traceback of their frames only (what failed is theirs, not ours)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def first_line(exc: BaseException) -> str:
    """The one line an error is reported with: its message's first line, else its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
