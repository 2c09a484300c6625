"""Bufferize: run a pipeline's head into an intermediate buffer, then the rest of it.

A pipeline Spec (ir/spec.py, `compose_stages`) has no kernel of its own. The search tiles
its output (every stage is elementwise after the head, so an output tile is a tile of
every stage) and then bufferizes: the head writes a row-major f32 intermediate at a
chosen level, the remaining stages read it. Bufferizing a small tile into L1 is the fused
plan (the epilogue runs on a tile that is still in cache); bufferizing the whole output
in GL is the unfused one (two passes over memory). The DP chooses (docs/pipelines.md).
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
    BROADCAST_KINDS,
    MATMUL,
    LogicalSpec,
    canonical,
    compose_kind,
    compose_stages,
)
from morello_build.ir.tensorspec import TensorSpec, make_tensor
from morello_build.machine.target import Target

#: Levels an intermediate may live at: L1 (fused: a tile in cache) or GL (unfused).
BUFFER_LEVELS = (Level.L1, Level.GL)


def _intermediate(spec: LogicalSpec, level: Level, matmul: bool) -> TensorSpec | None:
    """The head's output as a dense f32 buffer; a Matmul head writes it as [1, rows, n]
    (the same memory as the [rows, n] the tail reads: the emitter views it both ways)."""
    rows, n = spec.operands[-1].shape
    shape = (1, rows, n) if matmul else (rows, n)
    return make_tensor(shape, Dtype.F32, level, lay.row_major(shape), None)


@dataclass(frozen=True)
class Bufferize:
    """Split a pipeline after its head, through an intermediate at `level`."""

    level: Level

    def _wiring(self, spec: LogicalSpec) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """Operand indices of the head and of the tail; the intermediate is index
        ``len(spec.operands)``."""
        stages = compose_stages(spec.kind)
        if stages is None:
            return None
        scratch = len(spec.operands)
        head_inputs = 2 if stages[0] == MATMUL else 1
        head = list(range(head_inputs))
        nxt = head_inputs
        if stages[0] in BROADCAST_KINDS:
            head.append(nxt)
            nxt += 1
        tail = [scratch]
        tail.extend(range(nxt, len(spec.operands)))  # the tail's vectors, then the output
        return (*head, scratch), tuple(tail)

    def _parts(
        self, spec: LogicalSpec
    ) -> tuple[tuple[LogicalSpec, LogicalSpec], TensorSpec, tuple[tuple[int, ...], ...]] | None:
        stages = compose_stages(spec.kind)
        wiring = self._wiring(spec)
        if stages is None or wiring is None:
            return None
        matmul = stages[0] == MATMUL
        t = _intermediate(spec, self.level, matmul)
        flat = _intermediate(spec, self.level, False)
        if t is None or flat is None:
            return None
        head_w, tail_w = wiring
        ops = spec.operands
        head_ops = tuple(ops[i] for i in head_w[:-1]) + (t,)
        head = canonical(stages[0], False, spec.shape, head_ops, spec.serial)
        tail_ops = (flat, *(ops[i] for i in tail_w[1:]))
        rest = stages[1:]
        tail_kind = rest[0] if len(rest) == 1 else compose_kind(rest)
        tail = canonical(tail_kind, False, flat.shape, tail_ops, spec.serial)
        return (head, tail), flat, wiring

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        parts = self._parts(spec)
        if parts is None:
            return None
        children, flat, _ = parts
        own = [0] * LEVEL_COUNT
        own[self.level] = flat.memory_units()
        return Plan(children, (1, 1), 0, tuple(own))

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        parts = self._parts(spec)
        assert parts is not None
        _, flat, wiring = parts
        return Staged(spec, children, (flat,), wiring, self.describe())

    def describe(self) -> str:
        return f"bufferize({self.level.name})"
