"""Impl nodes: the program tree the search chooses and the code generator walks.

Nodes refer to the Spec they implement and to their children; they hold no buffer views.
Tiles are described in *spec dims* (for Matmul ``b, m, k, n``): a loop's main body covers
`tile_shape`, stepping over every spec dim it shrinks, and each boundary body covers one
remainder slab at a constant offset. The code generator derives operand views from that
and from `LogicalSpec.dim_maps()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from morello_build.impl.cost import Cost
from morello_build.ir.spec import LogicalSpec
from morello_build.ir.tensorspec import TensorSpec


@dataclass(frozen=True)
class Loop:
    """Loops over the spec dims that `tile_shape` shrinks; bodies = [main, *boundaries]."""

    spec: LogicalSpec
    children: tuple[Impl, ...]
    tile_shape: tuple[int, ...]
    parallel: bool
    boundary_offsets: tuple[tuple[int, ...], ...]  # spec-dim offset of each boundary body
    action: str = ""
    cost: Cost | None = field(default=None, compare=False)

    def full_steps(self) -> tuple[int, ...]:
        return tuple(s // t for s, t in zip(self.spec.shape, self.tile_shape))


@dataclass(frozen=True)
class Alloc:
    """Puts operand `operand` in a new buffer (or an L1/L2 cache view) while `body` runs.

    Children: [prologue move?, body, epilogue move?]. A cache view copies nothing.
    """

    spec: LogicalSpec
    children: tuple[Impl, ...]
    operand: int
    tensor: TensorSpec
    cache_view: bool
    has_prologue: bool
    has_epilogue: bool
    action: str = ""
    cost: Cost | None = field(default=None, compare=False)

    @property
    def body(self) -> Impl:
        return self.children[1 if self.has_prologue else 0]


@dataclass(frozen=True)
class Block:
    """Runs its children in order (e.g. zero the output, then accumulate)."""

    spec: LogicalSpec
    children: tuple[Impl, ...]
    action: str = ""
    cost: Cost | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Staged:
    """Runs its children in order over the Spec's operands and the `scratch` buffers it
    allocates for them (softmax: each row's max and denominator, then the normalized rows).

    `wiring[i][j]` names child i's operand j: an index below the Spec's operand count is
    that operand, index ``len(operands) + k`` is ``scratch[k]``.
    """

    spec: LogicalSpec
    children: tuple[Impl, ...]
    scratch: tuple[TensorSpec, ...]
    wiring: tuple[tuple[int, ...], ...]
    action: str = ""
    cost: Cost | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Kernel:
    """A microkernel leaf."""

    spec: LogicalSpec
    name: str
    children: tuple[Impl, ...] = ()
    action: str = ""
    cost: Cost | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Hole:
    """A Spec not yet implemented (manual schedules in progress)."""

    spec: LogicalSpec
    children: tuple[Impl, ...] = ()
    action: str = ""
    cost: Cost | None = field(default=None, compare=False)


Impl = Loop | Alloc | Block | Staged | Kernel | Hole


def kind_name(node: Impl) -> str:
    return type(node).__name__.lower()
