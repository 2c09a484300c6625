"""Select: implement a Spec with a microkernel (a leaf)."""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Impl, Kernel
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
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
    """Whether `kernel` may implement `spec`: its kind, declared dtypes and operand levels
    (`declared_fit`), and `applies`. Here, in the compiled core, rather than on the kernel
    record: the kernels' modules are interpreted Python."""
    return (
        kernel.kind == spec.kind
        and declared_fit(kernel, *operand_dtypes_and_levels(spec))
        and kernel.applies(spec, target)
    )


def operand_dtypes_and_levels(spec: LogicalSpec) -> tuple[tuple[Dtype, ...], tuple[Level, ...]]:
    """The dtypes and the levels of `spec`'s operands."""
    dtypes = []
    levels = []
    for o in spec.operands:
        dtypes.append(o.dtype)
        levels.append(o.level)
    return tuple(dtypes), tuple(levels)


def declared_fit(
    kernel: KernelRecord, dtypes: tuple[Dtype, ...], levels: tuple[Level, ...]
) -> bool:
    """Whether operands of `dtypes` at `levels` pass `kernel`'s declared filters
    (`Kernel.dtypes`, `Kernel.levels`): what the search checks once per distinct pair to
    list a kernel, before `applies`."""
    if kernel.dtypes is not None and kernel.dtypes != dtypes:
        return False
    allowed = kernel.levels
    return allowed is None or all(lv in ok for lv, ok in zip(levels, allowed, strict=True))
