"""ToAccum: `out = a @ b` becomes `out = 0; out += a @ b`."""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Block, Impl
from morello_build.ir.limits import ZERO as NO_MEMORY
from morello_build.ir.spec import MATMUL, ZERO, LogicalSpec, canonical


@dataclass(frozen=True)
class ToAccum:
    def plan(self, spec: LogicalSpec, target: object) -> Plan | None:
        if spec.kind != MATMUL or spec.accum:
            return None
        out = spec.operands[-1]
        zero = canonical(ZERO, False, out.shape, (out,), spec.serial)
        acc = canonical(spec.kind, True, spec.shape, spec.operands, spec.serial)
        return Plan((zero, acc), (1, 1), 0, NO_MEMORY)

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        return Block(spec, children, self.describe())

    def describe(self) -> str:
        return "to_accum()"
