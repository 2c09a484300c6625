"""Tiling rewrites: tile the output (TileOut) and split the reduction dim (Split).

Both shrink some spec dims; operand tiles follow from `LogicalSpec.dim_maps()`. A size
that does not divide its dim leaves remainder slabs, implemented by boundary bodies that
run once after the loop (the search tiles them independently).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.imp.nodes import Impl, Loop
from morello_build.ir.limits import ZERO
from morello_build.ir.spec import MATMUL, LogicalSpec, canonical
from morello_build.ir.tensorspec import tile_tensor
from morello_build.target.x86 import Target


def shrink(spec: LogicalSpec, shape: tuple[int, ...], serial: bool) -> LogicalSpec | None:
    """`spec` restricted to a `shape`-sized region (None if a layout cannot express it)."""
    ops = []
    for o, dm in zip(spec.operands, spec.dim_maps()):
        t = tile_tensor(o, tuple(shape[d] for d in dm))
        if t is None:
            return None
        ops.append(t)
    return canonical(spec.kind, spec.accum, shape, tuple(ops), serial)


def _loop_plan(
    spec: LogicalSpec, tile: tuple[int, ...], parallel: bool, target: Target
) -> tuple[Plan, tuple[tuple[int, ...], ...]] | None:
    if tile == spec.shape or any(t > s or t < 1 for t, s in zip(tile, spec.shape)):
        return None
    if parallel and (spec.serial or any(not o.level.parallel_tileable for o in spec.operands)):
        return None
    body = shrink(spec, tile, spec.serial or parallel)
    if body is None:
        return None
    full = [s // t for s, t in zip(spec.shape, tile)]
    ragged = [d for d, (s, t) in enumerate(zip(spec.shape, tile)) if s % t]
    children = [body]
    offsets: list[tuple[int, ...]] = []
    for r in range(1, len(ragged) + 1):
        for subset in itertools.combinations(ragged, r):
            shape = list(spec.shape)
            off = [0] * len(shape)
            for d in ragged:
                rem = spec.shape[d] % tile[d]
                if d in subset:
                    shape[d] = rem
                    off[d] = spec.shape[d] - rem
                else:
                    shape[d] = spec.shape[d] - rem
            b = shrink(spec, tuple(shape), spec.serial)
            if b is None:
                return None
            children.append(b)
            offsets.append(tuple(off))
    iters = math.prod(full)
    const = 0
    if parallel:
        iters = -(-iters // target.processors)
        const = target.par_setup + target.par_per_iter * iters
    coefs = (iters,) + (1,) * (len(children) - 1)
    return Plan(tuple(children), coefs, const, ZERO), tuple(offsets)


@dataclass(frozen=True)
class TileOut:
    """Tile the output to `shape` (a new spec shape; the reduction dim stays whole)."""

    shape: tuple[int, ...]
    parallel: bool = False

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind == MATMUL and self.shape[2] != spec.shape[2]:
            return None
        r = _loop_plan(spec, self.shape, self.parallel, target)
        return r[0] if r else None

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        r = _loop_plan(spec, self.shape, self.parallel, _ANY_TARGET_FOR_OFFSETS)
        assert r is not None
        return Loop(spec, children, self.shape, self.parallel, r[1], self.describe())

    def describe(self) -> str:
        kind = "tile_out_parallel" if self.parallel else "tile_out"
        return f"{kind}({'x'.join(map(str, self.shape))})"


@dataclass(frozen=True)
class Split:
    """Split the reduction dim k of an accumulating Matmul into chunks of `k`."""

    k: int

    def _shape(self, spec: LogicalSpec) -> tuple[int, ...]:
        b, m, _, n = spec.shape
        return (b, m, self.k, n)

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind != MATMUL or not spec.accum or self.k >= spec.shape[2]:
            return None
        r = _loop_plan(spec, self._shape(spec), False, target)
        return r[0] if r else None

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        r = _loop_plan(spec, self._shape(spec), False, _ANY_TARGET_FOR_OFFSETS)
        assert r is not None
        return Loop(spec, children, self._shape(spec), False, r[1], self.describe())

    def describe(self) -> str:
        return f"split({self.k})"


# Boundary offsets do not depend on the target; any target instance computes them.
_ANY_TARGET_FOR_OFFSETS = Target("x86-64", (), (16, 0, 1024, 1 << 25), (0, 0, 2, 20), 0, 0)
