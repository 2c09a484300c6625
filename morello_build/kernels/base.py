"""The microkernel record and the operand predicates the kernel families share.

A kernel declares, in one place, the Spec kind it implements, when it applies, the
scratch registers it needs beyond its operands (checked against the Spec's limits when it
is selected), its cost in the model's integer units and its C emitter. Costs are the
reference model's formulas (reference notes, "Kernels"); deviations are noted per kernel,
with their measurements in docs/cost-model.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import View
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.machine.target import Target

#: Writes the C of one kernel call: the Spec and one view per operand.
Emitter = Callable[[Ctx, LogicalSpec, tuple[View, ...]], None]


@dataclass(frozen=True)
class Kernel:
    """One microkernel. `name` appears in annotated C and in action fingerprints."""

    name: str
    kind: str  # the Spec kind it implements
    applies: Callable[[LogicalSpec, Target], bool]
    memory: Callable[[LogicalSpec, Target], Limits]
    cost: Callable[[LogicalSpec, Target], int]
    emit: Emitter
    #: The operand dtypes the kernel takes, when they are fixed. Checked before `applies`
    #: (`actions.select.takes`; `applies` need not check them), and the search lists the
    #: kernel only for Specs of these dtypes: most kernels are for one dtype, and asking
    #: every other kernel's `applies` was a tenth of synthesis (docs/internals.md).
    dtypes: tuple[Dtype, ...] | None = None
    #: The levels each operand may be at, when `applies` admits only some: a necessary
    #: condition of `applies`, checked before it, and the search lists the kernel only for
    #: Specs whose operands are at these levels. The matmul kernels declare them: each
    #: was asked of about every accumulating Matmul the search listed, and applied to 0.1%
    #: (docs/internals.md, "Kernels listed by operand levels"). None: any level.
    levels: tuple[frozenset[Level], ...] | None = None


#: Operand levels of `Kernel.levels`: a scalar a kernel reads or writes directly
#: (`scalar_here`), vector registers (`in_vectors`), memory (`Level.in_memory`).
SCALAR_LEVELS = frozenset((Level.RF, Level.L1))
VECTOR_LEVELS = frozenset((Level.VRF,))
MEMORY_LEVELS = frozenset(lv for lv in Level if lv.in_memory)


def regs(rf: int = 0, vrf: int = 0) -> Limits:
    """Scratch limits of `rf` scalar and `vrf` vector registers."""
    return (rf, vrf, 0, 0, 0)


def no_memory(spec: LogicalSpec, target: Target) -> Limits:
    return regs()


def scalar_here(t: TensorSpec) -> bool:
    """A single value a kernel can read or write directly."""
    return t.is_scalar and t.level in (Level.RF, Level.L1)


def io_cost(spec: LogicalSpec, target: Target) -> int:
    """Moving every operand once, at its level's price."""
    return sum(target.move_cost(o) for o in spec.operands)


def in_vectors(t: TensorSpec) -> bool:
    """Contiguous vector registers."""
    return t.level is Level.VRF and t.is_contiguous


def vectors(t: TensorSpec) -> int:
    """Vector registers the tensor occupies."""
    return t.registers


def columns_contiguous(b: TensorSpec) -> bool:
    """A 1 x K x N tile stored column-major (``w.T`` of a ``[n, k]`` w) with every column
    one contiguous run along k."""
    dims = b.layout.dims
    if not dims or dims[-1] != lay.PhysDim(1, lay.DYN, 0) or b.layout.contig < 1:
        return False
    return all(d.kind == lay.DYN and d.axis == 2 for d in dims[:-1])


def rows_contiguous(b: TensorSpec) -> bool:
    """A 1 x K x N tile stored row-major with every k-row one contiguous run along n."""
    dims = b.layout.dims
    if not dims or dims[-1] != lay.PhysDim(2, lay.DYN, 0) or b.layout.contig < 1:
        return False
    return all(d.kind == lay.DYN and d.axis == 1 for d in dims[:-1])
