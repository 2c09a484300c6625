"""Rewrites of row operations (softmax and its parts; ir/spec.py `ROW_KINDS`).

A softmax is a plan of parts, and the DP chooses among them (docs/softmax.md):
- `SoftmaxParts(level, "unscaled")`: the row max, then ``out = exp(x - max)`` summed into
  the denominator as it is stored, then ``out /= denom``. One exp per element; out is
  written, read and written again: the plan for rows that stay in cache.
- `SoftmaxParts(level, "online")`: the max and denominator together, then
  ``out = exp(x - max) / denom``. The denominator part is itself either one online pass
  (`ToAccum`: a running max and denominator, `SplitScan` in chunks that stay in L1, each
  chunk read twice from there) or two passes (`ToMaxAndDenominator`). out is written once:
  the plan for rows that do not fit in cache, at the price of a second exp per element.
`level` is where the per-row max and denominator live (RF for one row: scalar locals).
"""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.actions.tile import boundary_offsets, loop_plan
from morello_build.impl.nodes import Impl, Loop, Staged
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import LEVEL_COUNT
from morello_build.ir.limits import ZERO as NO_MEMORY
from morello_build.ir.spec import (
    DIVIDE_ROWS,
    MAX,
    NEG_INF,
    REDUCTIONS,
    SOFTMAX,
    SOFTMAX_COMPLETE,
    SOFTMAX_DENOM,
    SOFTMAX_DENOM_MAX,
    SOFTMAX_UNSCALED,
    SUM,
    ZERO,
    LogicalSpec,
    canonical,
)
from morello_build.ir.tensorspec import TensorSpec, make_tensor
from morello_build.machine.target import Target

ONLINE, UNSCALED = "online", "unscaled"

#: Child kinds and wiring of each softmax form. Operands: 0 = x, 1 = out, 2 = max,
#: 3 = denominator.
_FORMS: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {
    ONLINE: ((SOFTMAX_DENOM_MAX, (0, 2, 3)), (SOFTMAX_COMPLETE, (0, 2, 3, 1))),
    UNSCALED: ((MAX, (0, 2)), (SOFTMAX_UNSCALED, (0, 2, 3, 1)), (DIVIDE_ROWS, (3, 1))),
}


def row_values(rows: int, level: Level) -> TensorSpec | None:
    """An f32 value per row at `level` (RF: one row only, a scalar local)."""
    if level is Level.RF:
        if rows != 1:
            return None
        return make_tensor((1,), Dtype.F32, level, lay.EMPTY, None)
    return make_tensor((rows,), Dtype.F32, level, lay.row_major((rows,)), None)


def _children(
    spec: LogicalSpec,
    operands: tuple[TensorSpec, ...],
    parts: tuple[tuple[str, tuple[int, ...]], ...],
) -> tuple[LogicalSpec, ...]:
    return tuple(
        canonical(kind, False, spec.shape, tuple(operands[i] for i in wiring), spec.serial)
        for kind, wiring in parts
    )


def _own(tensors: tuple[TensorSpec, ...]) -> tuple[int, ...]:
    own = [0] * LEVEL_COUNT
    for t in tensors:
        own[t.level] += t.memory_units()
    return tuple(own)


@dataclass(frozen=True)
class SoftmaxParts:
    """Softmax as its parts (module docstring), with the row max and denominator at `level`."""

    level: Level
    form: str

    def _scratch(self, spec: LogicalSpec) -> tuple[TensorSpec, TensorSpec] | None:
        t = row_values(spec.shape[0], self.level)
        return None if t is None else (t, t)

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind != SOFTMAX:
            return None
        scratch = self._scratch(spec)
        if scratch is None:
            return None
        children = _children(spec, spec.operands + scratch, _FORMS[self.form])
        return Plan(children, (1,) * len(children), 0, _own(scratch))

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        scratch = self._scratch(spec)
        assert scratch is not None
        wiring = tuple(w for _, w in _FORMS[self.form])
        return Staged(spec, children, scratch, wiring, self.describe())

    def describe(self) -> str:
        return f"softmax_parts({self.form}, {self.level.name})"


#: The offline denominator: the max first, then the sum of exp(x - max).
_OFFLINE = ((MAX, (0, 1)), (SOFTMAX_DENOM, (0, 1, 2)))


@dataclass(frozen=True)
class ToMaxAndDenominator:
    """The max and denominator of each row in two passes (the offline form)."""

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind != SOFTMAX_DENOM_MAX or spec.accum:
            return None
        children = _children(spec, spec.operands, _OFFLINE)
        return Plan(children, (1, 1), 0, NO_MEMORY)

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        return Staged(spec, children, (), tuple(w for _, w in _OFFLINE), self.describe())

    def describe(self) -> str:
        return "to_max_and_denominator()"


#: The value each accumulated output of a reduction starts from, by (kind, operand).
_INITIAL: dict[str, tuple[tuple[int, str], ...]] = {
    MAX: ((1, NEG_INF),),
    SUM: ((1, ZERO),),
    SOFTMAX_DENOM_MAX: ((1, NEG_INF), (2, ZERO)),
    SOFTMAX_DENOM: ((2, ZERO),),
    SOFTMAX_UNSCALED: ((2, ZERO),),
}


@dataclass(frozen=True)
class RowsToAccum:
    """A reduction becomes: fill its reduced outputs (max: -inf, sums: 0), then merge into
    them (the accumulating form, which can be split along the row)."""

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind not in _INITIAL or spec.accum:
            return None
        fills = tuple(
            canonical(kind, False, spec.operands[i].shape, (spec.operands[i],), spec.serial)
            for i, kind in _INITIAL[spec.kind]
        )
        acc = canonical(spec.kind, True, spec.shape, spec.operands, spec.serial)
        return Plan((*fills, acc), (1,) * (len(fills) + 1), 0, NO_MEMORY)

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        wiring: tuple[tuple[int, ...], ...] = tuple((i,) for i, _ in _INITIAL[spec.kind])
        wiring += (tuple(range(len(spec.operands))),)
        return Staged(spec, children, (), wiring, self.describe())

    def describe(self) -> str:
        return "to_accum()"


@dataclass(frozen=True)
class SplitScan:
    """Split an accumulating reduction along the row into chunks of `k` values."""

    k: int

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind not in REDUCTIONS or not spec.accum or self.k >= spec.shape[1]:
            return None
        return loop_plan(spec, (spec.shape[0], self.k), False, target)

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        shape = (spec.shape[0], self.k)
        return Loop(spec, children, shape, False, boundary_offsets(spec, shape), self.describe())

    def describe(self) -> str:
        return f"split_scan({self.k})"
