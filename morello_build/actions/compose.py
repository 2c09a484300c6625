"""Bufferize: run a pipeline's first stages into an intermediate buffer, then the rest.

A pipeline Spec (ir/spec.py, `compose_stages`) has no kernel of its own. The search tiles
its output (every stage is elementwise after the head, so an output tile is a tile of
every stage) and then bufferizes: the first stages write a row-major f32 intermediate at
a chosen level, the remaining stages read it. Bufferizing a small tile into L1 is the fused
plan (the epilogue runs on a tile that is still in cache); bufferizing the whole output
in GL is the unfused one (two passes over memory). The DP chooses (docs/pipelines.md).

The cut is after the head, or before a later Matmul (`cut_points`): then the elementwise
stages between two products stay one pipeline, which can be tiled by rows and fused on
its own (the scale and softmax of `softmax((q @ k.T) * s) @ v` in one pass over the
scores) even where the products run unfused. The original cuts at every stage; the cuts
before a product are the ones that keep elementwise stages together.

A pipeline with a gate (`silu(x @ w1) * (x @ w3)`: the value times the head's lhs by one
more matrix) is cut only before the gate: the first stages write the gate's other side
g, and the rest is an ordinary pipeline headed by the gate's own product,
``(x @ w3) * g ...``, which reads the same x: one input feeds both, through the wiring.
"""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Impl, Staged
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import LEVEL_COUNT
from morello_build.ir.spec import (
    GATE,
    MATMUL,
    MUL,
    LogicalSpec,
    canonical,
    compose_dims,
    compose_kind,
    compose_stages,
    operand_shapes,
)
from morello_build.ir.tensorspec import TensorSpec, make_tensor, with_aligned
from morello_build.machine.target import Target

#: Levels an intermediate may live at: L1 (fused: a tile in cache) or GL (unfused).
BUFFER_LEVELS = (Level.L1, Level.GL)


def cut_points(stages: tuple[str, ...]) -> tuple[int, ...]:
    """Where a pipeline of `stages` may be cut (the number of stages before the cut):
    after its head, and before every later Matmul; before its gate only, if it has one
    (a tail that starts after the head but before the gate would lose the head's lhs)."""
    if GATE in stages:
        return (stages.index(GATE),)
    return tuple(at for at in range(1, len(stages)) if at == 1 or stages[at] == MATMUL)


def _split(
    spec: LogicalSpec, level: Level, at: int = 1, aligned: bool = False
) -> tuple[LogicalSpec, LogicalSpec, tuple[tuple[int, ...], ...]] | None:
    """(head, tail, wiring): the pipeline `spec` cut after its first `at` stages, which
    write a dense f32 intermediate at `level`. The wiring names the head's operands then
    the tail's; the intermediate is ``len(spec.operands)``."""
    stages = compose_stages(spec.kind)
    if stages is None or not 1 <= at < len(stages):
        return None
    dims = compose_dims(stages)
    shape = spec.shape
    rows, ops = shape[dims.rows], spec.operands
    n_head = sum(s < at for s in dims.stage_of)
    scratch = len(ops)
    head_w = (*range(n_head), scratch)
    tail_w = (scratch, *range(n_head, len(ops)))
    first, rest = stages[:at], stages[at:]
    gated = rest[0] == GATE
    if gated:  # the tail is (lhs @ gate) * intermediate, then the rest: lhs read again
        rest = (MATMUL, MUL, *rest[1:])
        tail_w = (0, n_head, scratch, *range(n_head + 1, len(ops)))
    head_kind = first[0] if at == 1 else compose_kind(first)
    # The head's dims, as the parent's: a batch dim if it has a Matmul, the rows, a Matmul
    # head's k, then its column dims.
    head_dims = [0] if MATMUL in first else []
    head_dims.append(dims.rows)
    if first[0] == MATMUL:
        head_dims.append(dims.rows + 1)
    head_dims += dict.fromkeys(dims.cols[:at])
    head_shape = tuple(shape[d] for d in head_dims)
    if MATMUL in rest:  # the tail keeps a batch dim: rows, (a gate's k,) its column dims
        tail_shape: tuple[int, ...] = (
            1,
            rows,
            *((shape[dims.rows + 1],) if gated else ()),
            *(shape[d] for d in dict.fromkeys(dims.cols[at - 1 :])),
        )
    else:
        tail_shape = (rows, shape[dims.cols[-1]])
    tail_kind = rest[0] if len(rest) == 1 else compose_kind(rest)
    at_buf = tail_w.index(scratch)
    head_t = _dense(operand_shapes(head_kind, head_shape)[-1], level, aligned)
    tail_t = _dense(operand_shapes(tail_kind, tail_shape)[at_buf], level, aligned)
    if head_t is None or tail_t is None:
        return None
    tail_ops = [tail_t if i == scratch else ops[i] for i in tail_w]
    if tail_kind == MATMUL:  # a Matmul writes [1, rows, n]: the same memory as [rows, n]
        out = batched(tail_ops[-1])
        if out is None:
            return None
        tail_ops[-1] = out
    head_ops = tuple(ops[i] for i in head_w[:-1]) + (head_t,)
    head = canonical(head_kind, False, head_shape, head_ops, spec.serial)
    tail = canonical(tail_kind, False, tail_shape, tuple(tail_ops), spec.serial)
    return head, tail, (head_w, tail_w)


def batched(t: TensorSpec) -> TensorSpec | None:
    """`t` with a leading dim of 1 (the same memory)."""
    b = make_tensor((1, *t.shape), t.dtype, t.level, lay.shift_axes(t.layout, 1), t.vector_size)
    return b if b is None or not t.aligned else with_aligned(b)


def _dense(shape: tuple[int, ...], level: Level, aligned: bool) -> TensorSpec | None:
    """An intermediate: f32, row-major, at `level` (marked `aligned` where the target
    tracks it)."""
    t = make_tensor(shape, Dtype.F32, level, lay.row_major(shape), None)
    return with_aligned(t) if t is not None and aligned else t


@dataclass(frozen=True)
class Bufferize:
    """Split a pipeline after its first `at` stages, through an intermediate at `level`."""

    level: Level
    at: int = 1

    def _parts(
        self, spec: LogicalSpec, aligned: bool = False
    ) -> tuple[tuple[LogicalSpec, LogicalSpec], TensorSpec, tuple[tuple[int, ...], ...]] | None:
        found = _split(spec, self.level, self.at, aligned)
        if found is None:
            return None
        head, tail, wiring = found
        # The buffer as the tail reads it (the emitter views it as the head writes it).
        return (head, tail), tail.operands[wiring[1].index(len(spec.operands))], wiring

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        parts = self._parts(spec, target.split_cost > 0)
        if parts is None:
            return None
        children, buf, _ = parts
        own = [0] * LEVEL_COUNT
        own[self.level] = buf.memory_units()
        return Plan(children, (1, 1), 0, tuple(own))

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        parts = self._parts(spec, plan.children[0].operands[-1].aligned)  # as `plan` made it
        assert parts is not None
        _, buf, wiring = parts
        return Staged(spec, children, (buf,), wiring, self.describe())

    def describe(self) -> str:
        if self.at == 1:
            return f"bufferize({self.level.name})"
        return f"bufferize({self.level.name}, after {self.at})"
