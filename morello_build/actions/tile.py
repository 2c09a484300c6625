"""Tiling rewrites: tile the output (TileOut) and split the reduction dim (Split).

Both shrink some spec dims; operand tiles follow from `LogicalSpec.dim_maps()`. A size
that does not divide its dim leaves remainder slabs, implemented by boundary bodies that
run once after the loop (the search tiles them independently).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

from morello_build.actions.base import Plan
from morello_build.impl.nodes import Impl, Loop
from morello_build.ir import layout as lay
from morello_build.ir.levels import Level
from morello_build.ir.limits import ZERO
from morello_build.ir.spec import MATMUL, LogicalSpec, canonical, new_tuple, operand_shapes
from morello_build.ir.tensorspec import TensorSpec, tile_tensor
from morello_build.machine.target import Target


def shrink(
    spec: LogicalSpec, shape: tuple[int, ...], serial: bool, target: Target
) -> LogicalSpec | None:
    """`spec` restricted to a `shape`-sized region (None if a layout cannot express it)."""
    ops = []
    for o, sub in zip(spec.operands, operand_shapes(spec.kind, shape)):
        t = tile_tensor(o, sub, target.l2_strip_row_bytes)
        if t is None:
            return None
        ops.append(t)
    return canonical(spec.kind, spec.accum, shape, tuple(ops), serial)


def register_aligned(spec: LogicalSpec, tile: tuple[int, ...]) -> bool:
    """Every tile of a padded register tensor starts on a register: its rows are tiled
    whole or in whole registers, so a loop's remainder is the rows' last registers."""
    for o, dims in zip(spec.operands, spec.dim_maps()):
        vs = o.vector_size
        if vs:
            axis = o.padded_axis
            if axis is not None:
                width = tile[dims[axis]]
                if width != o.shape[axis] and width % vs:
                    return False
    return True


@functools.lru_cache(maxsize=1 << 16)
def boundary_regions(
    shape: tuple[int, ...], tile: tuple[int, ...]
) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """(shape, offset) of each remainder slab a `tile` leaves in `shape`, in body order.

    One region per non-empty subset of the ragged dims: ragged dims in the subset take
    their remainder (at offset S - r), the others their whole tiled part. Cached: every
    Spec of one shape asks for the same tiles (cleared with the search's tables).
    """
    ragged = [d for d, (s, t) in enumerate(zip(shape, tile)) if s % t]
    regions = []
    for r in range(1, len(ragged) + 1):
        for subset in itertools.combinations(ragged, r):
            region = list(shape)
            off = [0] * len(shape)
            for d in ragged:
                rem = shape[d] % tile[d]
                if d in subset:
                    region[d] = rem
                    off[d] = shape[d] - rem
                else:
                    region[d] = shape[d] - rem
            regions.append((tuple(region), tuple(off)))
    return tuple(regions)


#: Cost per output line of a parallel loop whose threads each write a strided part of the
#: output (e.g. the left and right halves of every row of C): cores sharing the output's
#: rows lose to cores splitting them (docs/cost-model.md, "Threads sharing output rows").
PAR_SHARED_ROWS_COST = 150


def loop_plan(
    spec: LogicalSpec, tile: tuple[int, ...], parallel: bool, target: Target
) -> Plan | None:
    shape = spec.shape
    if tile == shape:
        return None
    # One pass over the dims (this runs for every tiling of every Spec listed): validity,
    # whether any dim leaves a remainder, and the iteration count.
    ragged = False
    iters = 1
    for t, s in zip(tile, shape):
        if t > s or t < 1:
            return None
        if s % t:
            ragged = True
        iters *= s // t
    if parallel and (spec.serial or any(not o.level.parallel_tileable for o in spec.operands)):
        return None
    if not register_aligned(spec, tile):
        return None
    body = shrink(spec, tile, spec.serial or parallel, target)
    if body is None:
        return None
    children = [body]
    if ragged:  # most tiles divide their Spec: no remainder slabs to look up
        for region, _ in boundary_regions(shape, tile):
            b = shrink(spec, region, spec.serial, target)
            if b is None:
                return None
            children.append(b)
    if parallel:
        iters = -(-iters // target.processors)
    coefs = (iters,) + (1,) * (len(children) - 1)
    const = loop_const(spec, body, iters, parallel, target)
    return new_tuple(Plan, (tuple(children), coefs, const, ZERO))


def loop_const(
    spec: LogicalSpec, body: LogicalSpec, iters: int, parallel: bool, target: Target
) -> int:
    """A loop's own cost: nothing when serial; thread start-up, per-iteration scheduling
    and (threads writing strided parts of the output) shared output rows when parallel.
    `iters` is the iterations one thread runs."""
    if not parallel:
        return 0
    const = target.par_setup + target.par_per_iter * iters
    if not body.operands[body.output_index].is_contiguous:
        const += PAR_SHARED_ROWS_COST * spec.operands[spec.output_index].cache_lines()
    return const


def boundary_offsets(spec: LogicalSpec, tile: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    return tuple(off for _, off in boundary_regions(spec.shape, tile))


#: The widest row of B a register tile reads per k step, in lines: four zmm vectors (64 f32).
#: Strips of 1- and 2-line rows measured slow to read in place, chunks of 32-line rows fast.
TILE_ROW_LINES = 4


def streams_pages(b: TensorSpec, k: int) -> bool:
    """Whether k-chunks of `k` rows of B would be read in place, a few lines per page.

    B in main memory with rows whole pages apart (`page_pitch`), a strip no wider than a
    register tile's row (`TILE_ROW_LINES`), and a k-chunk few enough rows to fit L1's
    sets (so the chunk loses the mark and an L1 view of it is allowed): register tiles
    would then read B in place, every row a miss in another page that the prefetchers do
    not follow, with too few loads in flight behind the tile's FMAs. Such a split is not
    offered; B is split in chunks that keep the mark, which must be copied before they
    reach registers. A chunk of wide rows streams well in place (tiles walk a page's
    lines in order). Measured (`benchmarks/tile_stream.py`; the fused 16x768x3072 MLP row
    1.8x faster): docs/cost-model.md, "Streaming B in place"."""
    if not b.page_pitch or b.level is not Level.GL:
        return False
    if lay.runs(b.layout, b.shape, b.dtype.size)[1] > TILE_ROW_LINES:
        return False
    chunk = tile_tensor(b, (b.shape[0], k, b.shape[2]))
    return chunk is not None and not chunk.page_pitch


@dataclass(frozen=True)
class TileOut:
    """Tile the output to `shape` (a new spec shape; the reduction dim stays whole)."""

    shape: tuple[int, ...]
    parallel: bool = False

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind == MATMUL and self.shape[2] != spec.shape[2]:
            return None
        return loop_plan(spec, self.shape, self.parallel, target)

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        offsets = boundary_offsets(spec, self.shape)
        return Loop(spec, children, self.shape, self.parallel, offsets, self.describe())

    def describe(self) -> str:
        kind = "tile_out_parallel" if self.parallel else "tile_out"
        return f"{kind}({'x'.join(map(str, self.shape))})"


@dataclass(frozen=True)
class Split:
    """Split the reduction dim k of an accumulating Matmul into chunks of `k`."""

    k: int

    def _shape(self, spec: LogicalSpec) -> tuple[int, ...]:
        b, m, _, n = spec.shape
        return (b, m, self.k, n)

    def plan(self, spec: LogicalSpec, target: Target) -> Plan | None:
        if spec.kind != MATMUL or not spec.accum or self.k >= spec.shape[2]:
            return None
        if streams_pages(spec.operands[1], self.k):
            return None
        return loop_plan(spec, self._shape(spec), False, target)

    def build(self, spec: LogicalSpec, plan: Plan, children: tuple[Impl, ...]) -> Impl:
        shape = self._shape(spec)
        return Loop(spec, children, shape, False, boundary_offsets(spec, shape), self.describe())

    def describe(self) -> str:
        return f"split({self.k})"
