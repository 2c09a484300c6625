"""Specs: what to compute (kind, shape, operands), independent of how.

A `LogicalSpec` is the memo identity of a sub-problem minus its memory limits; a `Spec`
adds the limits. Every constructor path canonicalizes, so two equal Specs always hash
equal and map to the same memo entry.

Kinds:
- ``matmul``: spec shape ``[b, m, k, n]``; operands lhs ``[b,m,k]``, rhs ``[b,k,n]``,
  out ``[b,m,n]``. ``accum`` means ``out += lhs @ rhs`` (else ``out = lhs @ rhs``).
- ``move``: copy / relayout / widening cast; spec shape = operand shape; operands src, dst.
- ``zero``: fill the single operand with zeros.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from morello_build.ir import layout as lay
from morello_build.ir.limits import Limits
from morello_build.ir.tensorspec import TensorSpec

MATMUL = "matmul"
MOVE = "move"
ZERO = "zero"
KINDS = (MATMUL, MOVE, ZERO)

IN, OUT, INOUT = "in", "out", "inout"


class LogicalSpec(NamedTuple):
    kind: str
    accum: bool
    shape: tuple[int, ...]  # the spec shape (matmul: b, m, k, n)
    operands: tuple[TensorSpec, ...]
    serial: bool  # True: must run on one thread (no parallel loops inside)

    @property
    def volume(self) -> int:
        return math.prod(self.shape)

    @property
    def output_index(self) -> int:
        return len(self.operands) - 1

    def roles(self) -> tuple[str, ...]:
        if self.kind == MATMUL:
            return (IN, IN, INOUT if self.accum else OUT)
        if self.kind == MOVE:
            return (IN, OUT)
        return (OUT,)

    def dim_maps(self) -> tuple[tuple[int, ...], ...]:
        """For each operand, which spec dim each of its dims is."""
        return dim_maps(self.kind, len(self.shape))

    def operand_shapes(self, spec_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
        return operand_shapes(self.kind, spec_shape)

    def flops(self) -> int:
        return 2 * self.volume if self.kind == MATMUL else 0

    def name(self) -> str:
        if self.kind == MATMUL:
            return "MatmulAccum" if self.accum else "Matmul"
        return "Move" if self.kind == MOVE else "Zero"

    def text(self) -> str:
        dims = "x".join(str(d) for d in self.shape)
        ops = ", ".join(o.text() for o in self.operands)
        serial = ", serial" if self.serial else ""
        return f"{self.name()}({dims}, {ops}{serial})"

    def __str__(self) -> str:
        return self.text()


class Spec(NamedTuple):
    logical: LogicalSpec
    limits: Limits

    def __str__(self) -> str:
        return self.logical.text()


_INTERNED: dict[LogicalSpec, LogicalSpec] = {}


def intern(spec: LogicalSpec) -> LogicalSpec:
    """The one shared instance equal to `spec`.

    The search keys its tables by the identity of interned Specs, which avoids re-hashing
    nested tuples (and enum members) millions of times per synthesis.
    """
    found = _INTERNED.get(spec)
    if found is None:
        _INTERNED[spec] = found = spec
    return found


def clear_interned() -> None:
    """Forget every interned Spec (`search.session` calls this when a search ends)."""
    _INTERNED.clear()


def interned_count() -> int:
    return len(_INTERNED)


_DIM_MAPS: dict[tuple[str, int], tuple[tuple[int, ...], ...]] = {}


def dim_maps(kind: str, rank: int) -> tuple[tuple[int, ...], ...]:
    key = (kind, rank)
    found = _DIM_MAPS.get(key)
    if found is None:
        ident = tuple(range(rank))
        if kind == MATMUL:
            found = ((0, 1, 2), (0, 2, 3), (0, 1, 3))
        elif kind == MOVE:
            found = (ident, ident)
        else:
            found = (ident,)
        _DIM_MAPS[key] = found
    return found


def operand_shapes(kind: str, spec_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each operand's shape for a `kind` Spec of `spec_shape` (a Matmul's written out:
    the search asks this for every tile it considers)."""
    if kind == MATMUL:
        b, m, k, n = spec_shape
        return ((b, m, k), (b, k, n), (b, m, n))
    return tuple(tuple(spec_shape[d] for d in dm) for dm in dim_maps(kind, len(spec_shape)))


def canonical(
    kind: str,
    accum: bool,
    shape: tuple[int, ...],
    operands: tuple[TensorSpec, ...],
    serial: bool,
) -> LogicalSpec:
    """Build a LogicalSpec from operands that are already canonical TensorSpecs.

    Applies the Move symmetry break: a same-dtype, same-layout, contiguous copy is a plain
    memcpy whatever the layout, so all such Moves collapse onto row-major.
    """
    if kind == MOVE:
        src, dst = operands
        if (
            src.dtype == dst.dtype
            and src.layout == dst.layout
            and src.is_contiguous
            and dst.is_contiguous
            and src.layout != lay.EMPTY
        ):
            rm = lay.row_major(src.shape)
            if src.layout != rm:
                operands = (src._replace(layout=rm), dst._replace(layout=rm))
    return LogicalSpec(kind, accum, shape, operands, serial)
