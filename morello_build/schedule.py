"""Manual (Halide-like) scheduling, mixable with synthesis.

A `Schedule` is an Impl tree with holes. Each method applies one rewrite to the *default
hole* (descending a loop into its main body, an allocation into its body, a block into its
last stage), or, with `at(path, fn)`, to the hole a path selects: a node with one child
consumes no path element, a node with several consumes one (the child index). Every call
returns a new Schedule; `synthesize_rest()` lets the DP fill the holes left.

    s = Schedule.for_spec(parse_spec("MatmulAccum(1x64x64x64, ...)"), get_target("avx2"))
    s = s.tile_out(1, 6, 16).move(2, "L1").move(2, "VRF", vector_size=8).split(1)
    impl = s.synthesize_rest().impl
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from morello_build.actions.accum import ToAccum
from morello_build.actions.base import Action
from morello_build.actions.move import Move, in_place_discount, move_const
from morello_build.actions.select import Select
from morello_build.actions.tile import Split, TileOut, loop_const
from morello_build.errors import MorelloError
from morello_build.impl.cost import Cost
from morello_build.impl.nodes import Alloc, Block, Hole, Impl, Loop, Staged
from morello_build.impl.printer import iter_nodes
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype, parse_dtype
from morello_build.ir.levels import Level, parse_level
from morello_build.ir.limits import LEVEL_COUNT, ZERO, Limits, add_peak, elementwise_max, subtract
from morello_build.ir.spec import LogicalSpec, Spec
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine.target import Target
from morello_build.search.dp import Search
from morello_build.search.persistent import make_memo
from morello_build.search.session import search_session

Path = tuple[int, ...]


class ScheduleError(MorelloError):
    """A rewrite that does not apply where it was asked for."""


@dataclass(frozen=True)
class Schedule:
    impl: Impl
    target: Target

    @classmethod
    def for_spec(cls, spec: LogicalSpec, target: Target) -> Schedule:
        return cls(Hole(spec), target)

    # -- rewrites on the default hole ------------------------------------------------------

    def tile_out(self, *shape: int, parallel: bool = False) -> Schedule:
        """Tile the output; `shape` is the output tile (Matmul: b, m, n or m, n)."""
        spec = self._default_hole().spec
        out_dims = spec.dim_maps()[spec.output_index]
        if len(shape) == len(out_dims) - 1:
            shape = (1, *shape)
        if len(shape) != len(out_dims):
            raise ScheduleError(f"tile_out{shape}: expected {len(out_dims)} output dims")
        full = list(spec.shape)
        for d, s in zip(out_dims, shape):
            full[d] = s
        return self.apply(TileOut(tuple(full), parallel))

    def split(self, k: int) -> Schedule:
        return self.apply(Split(k))

    def to_accum(self) -> Schedule:
        return self.apply(ToAccum())

    def select(self, kernel: str) -> Schedule:
        return self.apply(Select(kernel))

    def move(
        self,
        operand: int,
        level: str | Level,
        *,
        layout: lay.Layout | str | None = None,
        vector_size: int | None = None,
        dtype: str | Dtype | None = None,
    ) -> Schedule:
        """Move an operand; `layout=None` keeps its layout (row-major in registers)."""
        spec = self._default_hole().spec
        return self.apply(_make_move(spec, operand, level, layout, vector_size, dtype))

    def apply(self, action: Action, path: Path | None = None) -> Schedule:
        hole_path = self._default_path() if path is None else path
        hole = _node_at(self.impl, hole_path)
        if not isinstance(hole, Hole):
            raise ScheduleError(f"path {hole_path} is not an unscheduled Spec")
        plan = action.plan(hole.spec, self.target)
        if plan is None:
            raise ScheduleError(f"{action.describe()} does not apply to {hole.spec.text()}")
        node = action.build(hole.spec, plan, tuple(Hole(c) for c in plan.children))
        return replace(self, impl=_replace_at(self.impl, hole_path, node))

    def at(self, path: int | Sequence[int], fn: Callable[[Schedule], Schedule]) -> Schedule:
        """Schedule the hole under `path` with `fn` (a function of a sub-Schedule)."""
        p = (path,) if isinstance(path, int) else tuple(path)
        start = _resolve(self.impl, p)
        sub = fn(Schedule(_node_at(self.impl, start), self.target))
        return replace(self, impl=_replace_at(self.impl, start, sub.impl))

    def holes(self) -> list[LogicalSpec]:
        return [n.spec for n in iter_nodes(self.impl) if isinstance(n, Hole)]

    # -- synthesis of what is left, and costs -----------------------------------------------

    def synthesize_rest(self, use_cache: bool = False) -> Schedule:
        """Fill every hole with the DP's optimum under the memory left at that hole."""
        search = Search(self.target, make_memo(self.target, use_cache))

        def fill(node: Impl, limits: Limits) -> Impl:
            if isinstance(node, Hole):
                found = search.reconstruct(Spec(node.spec, limits))
                if found is None:
                    raise ScheduleError(f"no implementation of {node.spec.text()} fits {limits}")
                return found
            child_limits = _child_limits(node, limits)
            return replace(node, children=tuple(fill(c, child_limits) for c in node.children))

        with search_session():
            impl = fill(self.impl, self.target.max_limits)
            search.memo.flush()
            return replace(self, impl=with_costs(impl, self.target))

    def _default_path(self) -> Path:
        path: list[int] = []
        node = self.impl
        while not isinstance(node, Hole):
            if not node.children:
                raise ScheduleError("no unscheduled Spec left on the default path")
            idx = _default_child(node)
            path.append(idx)
            node = node.children[idx]
        return tuple(path)

    def _default_hole(self) -> Hole:
        node = _node_at(self.impl, self._default_path())
        assert isinstance(node, Hole)
        return node


def _make_move(
    spec: LogicalSpec,
    operand: int,
    level: str | Level,
    layout: lay.Layout | str | None,
    vector_size: int | None,
    dtype: str | Dtype | None,
) -> Move:
    if not 0 <= operand < len(spec.operands):
        raise ScheduleError(f"operand {operand} out of range for {spec.text()}")
    src = spec.operands[operand]
    lvl = parse_level(level) if isinstance(level, str) else level
    dt = parse_dtype(dtype) if isinstance(dtype, str) else (dtype or src.dtype)
    if isinstance(layout, str):
        layout = lay.parse_layout(layout, src.shape)
    if layout is None:
        if lvl is Level.RF:
            layout = lay.EMPTY
        elif lvl in (Level.VRF,) or src.level is Level.RF:
            layout = lay.row_major(src.shape)
        else:
            layout = src.layout
    return Move(operand, lvl, layout, vector_size, dt)


def _default_child(node: Impl) -> int:
    if isinstance(node, Alloc):
        return 1 if node.has_prologue else 0
    if isinstance(node, (Block, Staged)):
        return len(node.children) - 1
    return 0


def _resolve(root: Impl, path: Path) -> Path:
    """Turn a user path (only multi-child nodes consume elements) into a full index path."""
    out: list[int] = []
    node = root
    rest = list(path)
    while True:
        if not rest or not node.children:
            if rest:
                raise ScheduleError(f"path {tuple(path)} goes past a leaf")
            return tuple(out)
        if len(node.children) == 1:
            out.append(0)
            node = node.children[0]
            continue
        i = rest.pop(0)
        if not 0 <= i < len(node.children):
            raise ScheduleError(f"path {tuple(path)}: child {i} out of range")
        out.append(i)
        node = node.children[i]


def _node_at(root: Impl, path: Path) -> Impl:
    node = root
    for i in path:
        node = node.children[i]
    return node


def _replace_at(root: Impl, path: Path, new: Impl) -> Impl:
    if not path:
        return new
    i = path[0]
    kids = list(root.children)
    kids[i] = _replace_at(kids[i], path[1:], new)
    return replace(root, children=tuple(kids))


def _alloc_units(node: Alloc) -> Limits:
    own = [0] * LEVEL_COUNT
    own[node.tensor.level] = node.tensor.memory_units()
    return tuple(own)


def _staged_units(node: Staged) -> Limits:
    own = [0] * LEVEL_COUNT
    for t in node.scratch:
        own[t.level] += t.memory_units()
    return tuple(own)


def _child_limits(node: Impl, limits: Limits) -> Limits:
    if isinstance(node, (Alloc, Staged)):
        units = _alloc_units(node) if isinstance(node, Alloc) else _staged_units(node)
        got = subtract(limits, units)
        if got is None:
            raise ScheduleError(f"{node.action}: out of memory under {limits}")
        return got
    return limits


def with_costs(node: Impl, target: Target) -> Impl:
    """Recompute every node's cost from the tree itself (independently of the DP's plans).

    Used for manual schedules, and by tests to check that the DP's costs are the costs
    of the programs it rebuilds.
    """
    kids = tuple(with_costs(c, target) for c in node.children)
    costs = [c.cost for c in kids]
    assert all(c is not None for c in costs)
    mains = [c.main for c in costs if c is not None]
    peak = ZERO
    depth = 0
    for c in costs:
        if c is not None:
            peak = elementwise_max(peak, c.peaks)
            depth = max(depth, c.depth)
    if isinstance(node, Hole):
        return replace(node, cost=Cost(0, ZERO, 1))
    if isinstance(node, Loop):
        steps = 1
        for s in node.full_steps():
            steps *= s
        if node.parallel:
            steps = -(-steps // target.processors)
        body = node.children[0].spec
        main = loop_const(node.spec, body, steps, node.parallel, target)
        main += mains[0] * steps + sum(mains[1:])
        cost = Cost(main, peak, depth + 1)
    elif isinstance(node, Alloc):
        src = node.spec.operands[node.operand]
        main = move_const(src, node.tensor, node.cache_view, target) + sum(mains)
        role = node.spec.roles()[node.operand]
        main -= in_place_discount(node.spec, node.operand, role, node.cache_view, target)
        cost = Cost(main, add_peak(_alloc_units(node), peak), depth + 1)
    elif isinstance(node, Block):
        cost = Cost(sum(mains), peak, depth + 1)
    elif isinstance(node, Staged):
        own = _staged_units(node)
        cost = Cost(sum(mains), peak if own == ZERO else add_peak(own, peak), depth + 1)
    else:
        k = KERNELS_BY_NAME[node.name]
        cost = Cost(k.cost(node.spec, target), k.memory(node.spec, target), 1)
    return replace(node, children=kids, cost=cost)
