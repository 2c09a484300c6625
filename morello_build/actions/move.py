"""Move: put one operand at another level, layout or dtype while the rest runs.

Moving into L1 or L2 with the same layout and dtype is a *cache view*: it copies nothing
but charges the tile's lines against that level's budget, which is how the model keeps
working sets in cache. Every other move allocates a buffer, filled by a prologue Move
(inputs) and/or drained by an epilogue Move (outputs). Same-level relayouts in GL/L1 are
how operands get packed into panels.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Alloc, Impl
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import LEVEL_COUNT, Limits
from morello_build.ir.spec import IN, INOUT, MATMUL, MOVE, OUT, LogicalSpec, canonical, new_tuple
from morello_build.ir.tensorspec import (
    TensorSpec,
    fits_l1_sets,
    intern_tensor,
    level_holds,
    make_tensor,
    with_aligned,
)
from morello_build.machine.target import Target


def move_const(src: TensorSpec, new: TensorSpec, view: bool, target: Target) -> int:
    """A move's own cost: what its children do not already charge.

    - A cache view (no copy) brings the tile's lines into the level: its lines at both levels.
    - A copy between memory levels (e.g. GL -> L1) is filled and drained by prologue and
      epilogue Move Specs, which read the source a run at a time through views of their own
      and so already pay its lines once; the copy adds the new buffer's lines and, for a
      strided source, the ISA's share (`Target.strided_copy_percent`) of the surcharge
      those contiguous runs do not see. Charging the source's lines here too made a packed
      L1 copy cost its memory traffic twice, so the search streamed B from memory again and
      again instead (docs/cost-model.md, "Copies" and "Strided copies").
    - A same-level copy (packing into panels) is charged by its prologue and epilogue alone.
    - A move into registers pays the source's lines: its load and store kernels do not.
    - An input's L2 view that a kernel reads in place pays less where the tuning measured it
      (`in_place_discount`, taken off in `Move.plan`, which knows the role).
    """
    if new.level == src.level:
        return 0
    if view or not new.level.in_memory:
        return target.move_cost(src) + target.move_cost(new)
    if src.is_contiguous:
        return target.move_cost(new)
    # `move_cost` doubles a strided source's lines; the prologue already paid them once
    surcharge = target.run_lines_cost(src) * target.strided_copy_percent // 100
    return target.move_cost(new) + surcharge


def in_place_discount(
    spec: LogicalSpec, operand: int, role: str, view: bool, target: Target
) -> int:
    """What a view of input `operand` costs less than `move_const` says because a kernel
    reads it in place (`Target.in_place_read_discount`, given a Matmul's vector FMAs when
    it is the lhs; `role` is the operand's, which the caller has); 0 for outputs, which are
    read and written back, and for a copy's source (a Move Spec), which keep the level's
    price. `Move.plan` and `schedule.with_costs` both take it off, so a schedule's cost is
    the DP's."""
    if not view or role != IN or spec.kind == MOVE:
        return 0
    # the lhs's rows, broadcast a value a k step, are what `gl_stream_hit` was measured on
    fmas = spec.volume // target.lanes(Dtype.F32) if spec.kind == MATMUL and operand == 0 else 0
    return target.in_place_read_discount(spec.operands[operand], fmas)


@functools.lru_cache(maxsize=1 << 16)
def moved_tensor(move: Move, src: TensorSpec) -> tuple[TensorSpec, bool] | None:
    """The tensor `move` puts operand `src` in (interned), and whether it is a cache view
    (no copy).

    Cached (cleared with the search's tables, `actions.enumerate.clear_cache`): it depends
    on the operand alone, and one operand recurs across thousands of Specs."""
    if src.level is Level.L2 and not src.layout.is_fully_contiguous:
        # A strip of an L2 view (`tensorspec._l2_strip`) is read in place, a row at a
        # time: as a whole it crowds a few L1 sets (no L1 view), and a copy of it
        # (e.g. AMX's bf16 pair packing) measured slower than one from memory.
        return None
    if move.level.is_cache and move.dtype == src.dtype and move.layout == src.layout:
        if not level_holds(move.level, src.layout):
            return None
        if move.level is Level.L1 and not fits_l1_sets(src):
            return None  # its rows would evict each other: a copy must pack them first
        return intern_tensor(src._replace(level=move.level)), True
    t = make_tensor(
        src.shape, move.dtype, move.level, move.layout.with_full_contig(), move.vector_size
    )
    if t is None:
        return None
    return intern_tensor(t), False


Charges = tuple[TensorSpec, bool, Limits, int]

# (ids of a move, an operand, a target) -> (them, their charges). Keyed by identity as
# `tensorspec.tile_tensor` is (moves are one object per action, operands interned
# tensors): a Move's generated hash is interpreted Python and an operand's walks its
# layout. Each entry holds its three objects, so their ids are not reused while it lives.
_CHARGES: dict[tuple[int, int, int], tuple[Move, TensorSpec, Target, Charges | None]] = {}


def _charges(move: Move, src: TensorSpec, target: Target) -> Charges | None:
    """(new tensor, is a view, memory it takes, the move's own cost): what a plan of
    `move` needs of operand `src`, None when the move does not apply or changes nothing."""
    key = (id(move), id(src), id(target))
    hit = _CHARGES.get(key)
    if hit is not None and hit[0] is move and hit[1] is src and hit[2] is target:
        return hit[3]
    found = _compute_charges(move, src, target)
    _CHARGES[key] = (move, src, target, found)
    return found


def _compute_charges(move: Move, src: TensorSpec, target: Target) -> Charges | None:
    found = moved_tensor(move, src)
    if found is None or found[0] == src:
        return None
    new, view = found
    if target.split_cost and not view:
        new = intern_tensor(with_aligned(new))  # our own buffer: see `TensorSpec.aligned`
    own = [0] * LEVEL_COUNT
    own[move.level] = new.memory_units()
    return new, view, tuple(own), move_const(src, new, view, target)


@dataclass(frozen=True)
class Move:
    operand: int
    level: Level
    layout: lay.Layout
    vector_size: int | None
    dtype: Dtype

    def new_tensor(self, spec: LogicalSpec) -> tuple[TensorSpec, bool] | None:
        """The introduced tensor and whether it is a cache view (no copy)."""
        return moved_tensor(self, spec.operands[self.operand])

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        src = spec.operands[self.operand]
        found = _charges(self, src, target)
        if found is None:
            return None
        new, view, own, const = found
        role = spec.roles()[self.operand]
        ops = list(spec.operands)
        ops[self.operand] = new
        body = canonical(spec.kind, spec.accum, spec.shape, tuple(ops), spec.serial)
        children = []
        if not view and role in (IN, INOUT):
            children.append(canonical(MOVE, False, src.shape, (src, new), spec.serial))
        children.append(body)
        if not view and role in (OUT, INOUT):
            if new.dtype != src.dtype:
                return None  # no narrowing kernels: a widened output cannot be stored back
            children.append(canonical(MOVE, False, src.shape, (new, src), spec.serial))
        if spec in children:
            return None  # would not make progress
        const -= in_place_discount(spec, self.operand, role, view, target)
        return new_tuple(Plan, (tuple(children), (1,) * len(children), const, own))

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        found = self.new_tensor(spec)
        assert found is not None
        view = found[1]
        role = spec.roles()[self.operand]
        # the body's operand: the plan's tensor (`aligned` when the target tracks it)
        new = plan.children[1 if not view and role in (IN, INOUT) else 0].operands[self.operand]
        pro = not view and role in (IN, INOUT)
        epi = not view and role in (OUT, INOUT)
        return Alloc(spec, children, self.operand, new, view, pro, epi, self.describe())

    def describe(self) -> str:
        parts = [f"{self.operand}", self.level.name]
        if self.level.has_layout:
            parts.append(lay.layout_text(self.layout))
        if self.vector_size:
            parts.append(f"vs={self.vector_size}")
        parts.append(self.dtype.value)
        return f"move({', '.join(parts)})"


def clear_caches() -> None:
    """Forget the cached move targets (they key on Specs' operands)."""
    moved_tensor.cache_clear()
    _CHARGES.clear()


def cache_entries() -> int:
    return moved_tensor.cache_info().currsize + len(_CHARGES)
