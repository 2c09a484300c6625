"""Select: implement a Spec with a microkernel (a leaf)."""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Impl, Kernel
from morello_build.ir.spec import LogicalSpec
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine.target import Target


@dataclass(frozen=True)
class Select:
    kernel: str

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        k = KERNELS_BY_NAME[self.kernel]
        if not k.takes(spec, target):
            return None
        return Plan((), (), k.cost(spec, target), k.memory(spec, target))

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        return Kernel(spec, self.kernel, (), self.describe())

    def describe(self) -> str:
        return f"select({self.kernel})"
