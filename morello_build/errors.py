"""Exceptions of morello-build.

Every error the package raises on purpose derives from `MorelloError`, so the CLI and the
build step can turn any of them into one clear message instead of a traceback.
"""

from __future__ import annotations


class MorelloError(Exception):
    """An expected failure with a message meant for the user."""


class SpecError(MorelloError):
    """A malformed or unsupported Spec, dtype, layout or memory level."""


class NoImplementation(MorelloError):
    """The search found no program for a Spec under its memory limits."""
