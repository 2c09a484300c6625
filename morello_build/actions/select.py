"""Select: implement a Spec with a microkernel (a leaf)."""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Impl, Kernel
from morello_build.ir.spec import LogicalSpec, new_tuple
from morello_build.kernels.base import Kernel as KernelRecord
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine.target import Target


@dataclass(frozen=True)
class Select:
    kernel: str

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        k = KERNELS_BY_NAME[self.kernel]
        if not takes(k, spec, target):
            return None
        return new_tuple(Plan, ((), (), k.cost(spec, target), k.memory(spec, target)))

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        return Kernel(spec, self.kernel, (), self.describe())

    def describe(self) -> str:
        return f"select({self.kernel})"


def takes(kernel: KernelRecord, spec: LogicalSpec, target: Target) -> bool:
    """Whether `kernel` may implement `spec`: its kind, dtypes, operand levels and
    `applies`. Here, in the compiled core, rather than on the kernel record: it runs for
    every kernel of every Spec the search lists, and the kernels' modules are interpreted
    Python."""
    if kernel.kind != spec.kind:
        return False
    dtypes = kernel.dtypes
    if dtypes is not None:  # compared in place: no tuple of the operands' dtypes per call
        operands = spec.operands
        if len(dtypes) != len(operands):
            return False
        for dtype, o in zip(dtypes, operands):
            if o.dtype is not dtype:
                return False
    levels = kernel.levels
    if levels is not None:
        for allowed, o in zip(levels, spec.operands):
            if o.level not in allowed:
                return False
    return kernel.applies(spec, target)
