"""The Spec of a kernel declared by its text (CMake's `morello_add_kernel(... SPEC ...)`,
`morello generate --spec`): the full text form, or the command line's matmul shorthand with
its options in the same string, e.g. ``matmul 1x288x288 --layout-b col``.

The shorthand means exactly what `morello synth` makes of the same words (same options, same
defaults, same error messages), so a kernel built by CMake is byte-identical to the one the
command line prints.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from typing import NoReturn

from morello_build.errors import SpecError
from morello_build.ir.text import parse_dims

#: `matmul` followed by words, no parenthesis (the text form is `Matmul(...)`).
_SHORTHAND = re.compile(r"\s*matmul\s+[^()]*", re.IGNORECASE)


@dataclass(frozen=True)
class SpecArg:
    """A kernel's Spec text (the full form) and the threads it may use."""

    text: str
    threads: int = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SpecError(message)


def _parser() -> argparse.ArgumentParser:
    # The options of `morello synth` that shape the Spec (cli._add_spec_args).
    p = _Parser(prog="matmul", add_help=False)
    p.add_argument("shape")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--layout-b", choices=("row", "col"), default="row")
    p.add_argument("--accumulate", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    return p


def is_shorthand(text: str) -> bool:
    return _SHORTHAND.fullmatch(text) is not None


def expand_spec(text: str) -> SpecArg:
    """The full Spec text of `text` (returned unchanged unless it is the matmul shorthand).

    Raises `SpecError` with the message the command line gives for the same words.
    """
    if not is_shorthand(text):
        return SpecArg(text)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise SpecError(f"malformed matmul shorthand {text!r}: {exc}") from None
    args = _parser().parse_args(words[1:])
    from morello_build.integration.config import MAX_THREADS

    if not 1 <= args.threads <= MAX_THREADS:  # as the command line and declarations
        raise SpecError(
            f"--threads: expected an integer from 1 to {MAX_THREADS}, got {args.threads}"
        )
    dims = parse_dims(args.shape)
    if len(dims) == 3:
        dims = (1, *dims)
    if len(dims) != 4:
        raise SpecError(f"matmul shape must be MxKxN or BxMxKxN, got {args.shape!r}")
    from morello_build.api import matmul_spec_text

    spec = matmul_spec_text(
        *dims,
        dtype=args.dtype,
        layouts=("row", args.layout_b, "row"),
        accumulate=args.accumulate,
        threads=args.threads,
    )
    return SpecArg(spec, args.threads)
