"""The Spec of a kernel declared by its text (CMake's `morello_add_kernel(... SPEC ...)`,
`morello generate --spec`): the full text form, or the command line's shorthand with
its options in the same string, e.g. ``matmul 1x288x288 --layout-b col`` or
``softmax 32x2048 --dtype bf16`` (an operation on rows: ``ROWSxN``, x in f32 or bf16, out f32;
`ROW_SHORTHANDS`).

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
from morello_build.integration.op_names import ROW_SHORTHANDS
from morello_build.ir.spec import ROW_KINDS
from morello_build.ir.text import parse_dims

SHORTHAND_OPS = ("matmul", *ROW_SHORTHANDS)

#: An operation name followed by words, no parenthesis (the text form is `Matmul(...)`).
_SHORTHAND = re.compile(rf"\s*({'|'.join(SHORTHAND_OPS)})\s+[^()]*", re.IGNORECASE)


@dataclass(frozen=True)
class SpecArg:
    """A kernel's Spec text (the full form) and the threads it may use."""

    text: str
    threads: int = 1


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise SpecError(message)


def _parser(op: str) -> argparse.ArgumentParser:
    # The options of `morello synth` that shape the Spec (cli._add_spec_args).
    p = _Parser(prog=op, add_help=False)
    p.add_argument("shape")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--layout-b", choices=("row", "col"), default="row")
    p.add_argument("--accumulate", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    return p


def parse_inputs(text: str) -> dict[str, tuple[int, ...]]:
    """``x=64x768,w=768x3072,b=3072`` -> {name: shape}, in the order written."""
    out: dict[str, tuple[int, ...]] = {}
    for item in text.split(","):
        name, eq, shape = item.strip().partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise SpecError(
                f"--inputs: malformed item {item.strip()!r}; expected NAME=SHAPE, "
                "e.g. x=64x768,w=768x3072,b=3072"
            )
        if name in out:
            raise SpecError(f"--inputs: input {name!r} is declared twice")
        out[name] = parse_dims(shape, f"--inputs {name}")
    return out


def is_shorthand(text: str) -> bool:
    return _SHORTHAND.fullmatch(text) is not None


def expand_spec(text: str) -> SpecArg:
    """The full Spec text of `text` (returned unchanged unless it is a shorthand).

    Raises `SpecError` with the message the command line gives for the same words.
    """
    if not is_shorthand(text):
        return SpecArg(text)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise SpecError(f"malformed shorthand {text!r}: {exc}") from None
    op = words[0].lower()
    args = _parser(op).parse_args(words[1:])
    from morello_build.integration.config import MAX_THREADS

    if not 1 <= args.threads <= MAX_THREADS:  # as the command line and declarations
        raise SpecError(
            f"--threads: expected an integer from 1 to {MAX_THREADS}, got {args.threads}"
        )
    spec = shorthand_spec(op, args.shape, args.dtype, args.layout_b, args.accumulate, args.threads)
    return SpecArg(spec, args.threads)


def shorthand_spec(
    op: str, shape: str, dtype: str, layout_b: str, accumulate: bool, threads: int
) -> str:
    """The Spec text of shorthand `op` (`SHORTHAND_OPS`) over `shape` with these options."""
    from morello_build.api import matmul_spec_text, row_spec_text

    op = op.lower()
    dims = parse_dims(shape)
    if op != "matmul":
        if layout_b != "row" or accumulate:
            raise SpecError(f"--layout-b and --accumulate apply to matmul only, not {op}")
        if len(dims) != 2:
            raise SpecError(f"{op} shape must be ROWSxN, got {shape!r}")
        return row_spec_text(ROW_SHORTHANDS[op], *dims, dtype=dtype, threads=threads)
    if len(dims) == 3:
        dims = (1, *dims)
    if len(dims) != 4:
        raise SpecError(f"matmul shape must be MxKxN or BxMxKxN, got {shape!r}")
    return matmul_spec_text(
        *dims, dtype=dtype, layouts=("row", layout_b, "row"), accumulate=accumulate, threads=threads
    )


assert all(k in ROW_KINDS for k in ROW_SHORTHANDS.values())
