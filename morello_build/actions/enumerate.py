"""The deterministic list of rewrites for a logical Spec.

The memo stores an index into this list, so the list must depend only on the logical Spec
and the target, never on memory limits. Order: moves, tilings, splits, kernels, to_accum.

The search space is Morello's, pruned where a move could never pay off, to keep Python
synthesis fast (each pruning is a documented choice, not a limitation of the model):
- same-level relayouts (packing) only for Matmul inputs in GL/L1, and none in GL of an
  input that is already packed (panels or k-pairs; a user-declared packed B included,
  which may still be copied into L1): the search packs B once, a second
  whole-tensor copy never paid, and each allowed one spawned a chain of
  repacks p8 -> p16 -> p8 ... halving the GL budget down to zero, every link a re-solve of
  the same subtree (avx2 f32 64^3: 93,379 -> 53,840 Specs solved, same answers for the
  2,000 pinned queries and the same C for the codegen battery; docs/performance.md);
- RF moves only from L1 and only for single values (vectors do the register blocking);
- a non-accumulating Matmul only tiles, moves its output, takes L1 cache views of its
  inputs, or becomes zero + accumulate (so an output tile can be zeroed in registers
  below cache views hoisted above it);
- no VRF moves of a Matmul lhs (kernels read it as scalars or contiguous L1 rows);
- relayouts: B (rhs) into N-panels, and strided input tiles into dense L1 copies; on the
  amx target also bf16 B into k-pairs `[1,2,1p2]` (the AMX tile kernel's B layout);
- on the amx target a bf16 Matmul in whole AMX tiles stays on tiles (`amx_tileable`): no
  widening or register moves, tiles and k splits in whole tiles, and B may be packed
  above the (tile-zeroing) non-accumulating Matmul;
- widening copies of a Matmul input into GL only when the f32 copy would not fit L1 (a
  smaller one is made in L1, where it is also read faster): the mixed bf16/f32 Specs that
  GL copies of small tiles spawn were most of the bf16 search. Specs solved, avx512 bf16
  64^3 581k -> 248k, 100x37x250 1.50M -> 0.80M, 256^3 2.21M -> 1.76M; avx2 bf16 64^3
  785k -> 323k, 256^3 1.99M -> 1.54M; the same generated C for every bf16 table shape;
- no relayout or widening copies into GL/L1 of a Matmul rhs used only once in the Spec
  (m == 1): the copy is a whole extra pass over B (this is what keeps matrix-vector
  synthesis with long N fast: 1x2048x16384 bf16 went from ~250k Specs to ~8k);
- VRF moves use one vector size: as many f32 values as the widest register holds (so a
  bf16 vector widens into exactly one f32 vector), f32 rows wider than that in such
  registers with the last one padded (accessed with lane masks), or the widest that fits
  the tensor in whole registers, or else (f32 rows narrower than that) the narrowest
  register that holds a row, padded (see `_vector_size`);
- Move and Zero Specs get no same-level moves (a copy of a copy never helps);
- with `Target.fast_dpbf16` (the zen4 tuning) bf16 B may also be packed into k-pairs, and a
  bf16 Matmul the vdpbf16ps register tiles cover (`dpbf16_tileable`) keeps to them as an
  AMX-tileable one keeps to AMX tiles: no widening or register moves, column tiles in
  whole vectors, k splits in pairs;
- output tile sizes are powers of two and the whole dim, plus, for a Matmul's rows (m),
  the target's register-filling heights (`Target.register_rows`, e.g. AVX2 6x16).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TypeVar, cast

from morello_build.actions import move as move_mod
from morello_build.actions.accum import ToAccum
from morello_build.actions.base import Action, Plan
from morello_build.actions.compose import BUFFER_LEVELS, Bufferize, cut_points
from morello_build.actions.move import Move
from morello_build.actions.rows import (
    ONLINE,
    UNSCALED,
    RowsToAccum,
    SoftmaxParts,
    SplitScan,
    ToMaxAndDenominator,
)
from morello_build.actions.select import Select, declared_fit, operand_dtypes_and_levels
from morello_build.actions.tile import Split, TileOut, boundary_regions
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import WIDENINGS, Dtype
from morello_build.ir.levels import MOVE_DESTINATIONS, Level
from morello_build.ir.spec import (
    IN,
    MATMUL,
    NEG_INF,
    REDUCTIONS,
    ROW_KINDS,
    SOFTMAX,
    SOFTMAX_DENOM_MAX,
    STAGE_SEP,
    LogicalSpec,
    compose_stages,
    dim_maps,
    intern,
    last_cols_whole,
    new_tuple,
)
from morello_build.ir.tensorspec import TensorSpec, make_tensor, padded_axis
from morello_build.kernels.amx import AMX_K_STEP, AMX_TILE
from morello_build.kernels.dpbf16_tiles import DPBF16_COLS, DPBF16_MIN_K
from morello_build.kernels.k_pairs import AMX_PAIRS_DIMS, amx_pairs_layout
from morello_build.kernels.registry import kernels_for
from morello_build.machine.target import Target

T = TypeVar("T")
ActionPlans = tuple[tuple[Action, Plan], ...]

# Per target: id(interned spec) -> (spec, its actions, their plans). The spec is kept so
# its id stays unique while the entry lives. Two parallel tuples rather than (action, plan)
# pairs: a large search lists millions of plans (avx2 bf16 256^3: 3.0M), and a pair tuple
# each was about 160 MiB of its peak.
# The plans are None once `release_plans` dropped them (they are listed again on demand).
Listed = tuple[LogicalSpec, tuple[Action, ...], tuple[Plan, ...] | None]
_CACHE: dict[Target, dict[int, Listed]] = {}


# Equal coefficient or `own` tuples of different Specs' plans, kept as one object each: most
# recur across thousands of Specs (peak RSS: docs/performance.md). Actions are already one
# object each: they come from the per-operand and per-shape caches below.
_SHARED: dict[object, object] = {}


def _shared(value: T) -> T:
    return cast(T, _SHARED.setdefault(value, value))


def actions_for(spec: LogicalSpec, target: Target) -> ActionPlans:
    """Applicable (action, plan) pairs, in the stable enumeration order (built on each
    call: the search reads `plans_for` and `listed_actions`, which are cached).

    Plan children are interned (the rewrites build them with `ir.spec.canonical`), so the
    search can key its tables by identity.
    """
    return tuple(zip(*_actions_and_plans(spec, target)))


def plans_for(spec: LogicalSpec, target: Target) -> tuple[Plan, ...]:
    """The plans of `actions_for(spec, target)`, in its order."""
    return _actions_and_plans(spec, target)[1]


def listed_actions(spec: LogicalSpec, target: Target) -> tuple[Action, ...]:
    """The actions of `actions_for(spec, target)`, in its order (what the memo's action
    indices count)."""
    return _listed(spec, target)[1]


def action_and_plan(spec: LogicalSpec, target: Target, index: int) -> tuple[Action, Plan]:
    """The `index`-th action of `spec`'s listing and its plan, from one lookup (what
    rebuilding a stored answer needs)."""
    actions, plans = _actions_and_plans(spec, target)
    return actions[index], plans[index]


def _actions_and_plans(
    spec: LogicalSpec, target: Target
) -> tuple[tuple[Action, ...], tuple[Plan, ...]]:
    """`spec`'s listed actions and their plans (listed again if they were dropped)."""
    _spec, actions, plans = _listed(spec, target, with_plans=True)
    assert plans is not None
    return actions, plans


def _listed(spec: LogicalSpec, target: Target, with_plans: bool = False) -> Listed:
    """`spec`'s cached listing, made on first use; `with_plans`: listed again if
    `release_plans` dropped its plans."""
    cache = _CACHE.setdefault(target, {})
    found = cache.get(id(spec))
    if found is None or found[0] is not spec:
        # Not the interned instance (the search always passes that one, so it skips the
        # nested hash `intern` costs on every memo miss).
        spec = intern(spec)
        found = cache.get(id(spec))
    if found is None or (with_plans and found[2] is None):
        found = cache[id(spec)] = _list(spec, target)
    return found


def _list(spec: LogicalSpec, target: Target) -> Listed:
    """The applicable actions of interned `spec` and their plans."""
    actions: list[Action] = []
    plans: list[Plan] = []
    for a in enumerate_actions(spec, target):
        p = a.plan(spec, target)
        if p is not None:
            actions.append(a)  # one object per action already (`_operand_moves`)
            plans.append(new_tuple(Plan, (p.children, _shared(p.coefs), p.const, _shared(p.own))))
    return (spec, tuple(actions), tuple(plans))


def release_plans() -> None:
    """Drop every cached plan, keeping each Spec's action list (what memo indices and
    fingerprints read). A finished search calls this before its answers are merged into
    the compressed table, which then reuses their memory (avx2 bf16 256^3: 3.0M plans,
    ~190 MiB of peak RSS; docs/performance.md); a later `plans_for` lists them again."""
    for cache in _CACHE.values():
        for key, (spec, actions, _plans) in cache.items():
            cache[key] = (spec, actions, None)


def clear_cache() -> None:
    _CACHE.clear()
    _SHARED.clear()
    _MOVES.clear()
    _shape_tilings.cache_clear()
    move_mod.clear_caches()
    boundary_regions.cache_clear()


def cached_parts() -> int:
    """Entries of the per-operand and per-shape caches (moves, tilings, remainder slabs,
    move targets), over all targets."""
    caches = (_shape_tilings, boundary_regions)
    return sum(c.cache_info().currsize for c in caches) + len(_MOVES) + move_mod.cache_entries()


def cached_specs() -> int:
    """Specs whose action plans are cached, over all targets."""
    return sum(len(c) for c in _CACHE.values())


def amx_tileable(spec: LogicalSpec, target: Target) -> bool:
    """A bf16 x bf16 -> f32 Matmul the AMX tile kernel can cover whole (amx target).

    Such a Spec only gets actions that keep it on tiles: no widening or register moves,
    output tiles and k splits in whole tiles (16 rows/columns, 32 k). In the model a MAC
    on tiles costs 64 units per 8192; the f32 FMA path at least 2 per 16, i.e. 16x more,
    so the pruned branches never win. bf16 256^3 on amx: without this pruning the search
    had not finished after 884k Specs and 272 s; with it, 85k Specs in 8 s.
    """
    if target.isa != "amx" or spec.kind != MATMUL or len(spec.shape) != 4:
        return False
    dts = tuple(o.dtype for o in spec.operands)
    return dts == (Dtype.BF16, Dtype.BF16, Dtype.F32) and _whole_tiles(spec.shape)


def dpbf16_tileable(spec: LogicalSpec, target: Target) -> bool:
    """A bf16 x bf16 -> f32 Matmul the vdpbf16ps register tiles can cover whole
    (`Target.fast_dpbf16`): k in pairs, n in whole vectors, and m > 1 unless B is already
    in k-pairs (one row never pays for a packed copy of B, so a matrix-vector product keeps
    its streaming kernels).

    In the model a vdpbf16ps does 32 multiply-adds for the units an f32 FMA takes for 16,
    before any widening, so the pruned branches never win; without the pruning the bf16
    search is the widening one (avx512 bf16 256^3: 1.76M Specs) plus the tiles.
    """
    if not target.fast_dpbf16 or spec.kind != MATMUL or len(spec.shape) != 4:
        return False
    if tuple(o.dtype for o in spec.operands) != (Dtype.BF16, Dtype.BF16, Dtype.F32):
        return False
    bdim, m, k, n = spec.shape
    paired = spec.operands[1].layout.dims == AMX_PAIRS_DIMS
    return (
        bdim == 1
        and k % 2 == 0
        and k >= DPBF16_MIN_K
        and n % DPBF16_COLS == 0
        and (m > 1 or paired)
    )


def _whole_tiles(shape: tuple[int, ...]) -> bool:
    _, m, k, n = shape
    return m % AMX_TILE == 0 and n % AMX_TILE == 0 and k % AMX_K_STEP == 0


def enumerate_actions(spec: LogicalSpec, target: Target) -> list[Action]:
    if spec.kind in ROW_KINDS or spec.kind == NEG_INF:
        return _row_actions(spec, target)
    if STAGE_SEP in spec.kind:
        return _compose_actions(spec, target)
    acts: list[Action] = []
    tiles = amx_tileable(spec, target)
    dp_tiles = dpbf16_tileable(spec, target)
    for i in range(len(spec.operands)):
        moves: Sequence[Action] = _moves(spec, i, target)
        if spec.kind == MATMUL and not spec.accum and i != spec.output_index and not tiles:
            # Inputs of a non-accumulating Matmul get only cache views (no copies), so a
            # view can be hoisted above the zero-then-accumulate split. A one-thread
            # Matmul may also pack B into GL panels or into L1 there, so that whole-k
            # register tiles zero C in registers; a Spec that may still run threads does
            # not (both measured: docs/cost-model.md, "Packing B above the zero"). (On AMX
            # tiles the kernel itself zeroes C, so B may be packed above it.)
            moves = _hoistable(spec, moves)
        if tiles or dp_tiles:
            moves = [m for m in moves if _stays_on_tiles(spec, m)]
        acts.extend(moves)
    tilings: Sequence[Action] = _tilings(spec, target)
    if tiles:
        tilings = [a for a in tilings if isinstance(a, TileOut) and _whole_tiles(a.shape)]
    if dp_tiles:
        tilings = [a for a in tilings if isinstance(a, TileOut) and a.shape[3] % DPBF16_COLS == 0]
    acts.extend(tilings)
    if spec.kind == MATMUL and spec.accum:
        acts.extend(_splits(spec.shape[2], tiles, dp_tiles))
    acts.extend(_selects(spec.kind, *operand_dtypes_and_levels(spec)))
    if spec.kind == MATMUL and not spec.accum:
        acts.append(ToAccum())
    return acts


@functools.cache
def _splits(k: int, tiles: bool, dp_tiles: bool) -> tuple[Split, ...]:
    """The k splits of an accumulating Matmul, made once per k (actions are values)."""
    splits = _pow2_below(k)
    if tiles:
        splits = [s for s in splits if s % AMX_K_STEP == 0]
    if dp_tiles:
        splits = [s for s in splits if s >= DPBF16_MIN_K]
    return tuple(Split(s) for s in splits)


@functools.cache
def _selects(kind: str, dtypes: tuple[Dtype, ...], levels: tuple[Level, ...]) -> tuple[Select, ...]:
    """One Select per kernel of `kind` that takes operands of `dtypes` at `levels`
    (`Kernel.dtypes`, `Kernel.levels`), made once (actions are immutable values). A kernel
    left out would have had no plan, so the indices of the applicable plans, which the memo
    stores, do not change."""
    return tuple(Select(k.name) for k in kernels_for(kind) if declared_fit(k, dtypes, levels))


def _stays_on_tiles(spec: LogicalSpec, move: Action) -> bool:
    """A move that keeps an AMX- or vdpbf16ps-tileable Spec so: same dtype, memory levels."""
    if not isinstance(move, Move):
        return True
    src = spec.operands[move.operand]
    return move.dtype == src.dtype and move.level.in_memory


def _hoistable(spec: LogicalSpec, moves: Sequence[Action]) -> list[Action]:
    """The moves a non-accumulating Matmul's inputs (or a pipeline's head inputs) get:
    cache views, and on one thread B packed (`_packs_rhs`; reasons in `enumerate_actions`)."""
    return [m for m in moves if _is_view(spec, m) or (spec.serial and _packs_rhs(m))]


def _packs_rhs(move: Action) -> bool:
    """A copy of B into GL panels (or another GL layout), or into L1: then the register
    tiles below zero C in registers, where a zero-then-accumulate split above the L1 copy
    zeroes a whole column strip of C in memory and reloads it (the scores of `q @ k.T`, a
    2048x128x2048 GEMM: docs/cost-model.md, "Packing B above the zero")."""
    if not isinstance(move, Move) or move.operand != 1:
        return False
    return move.level in (Level.GL, Level.L1)


def _is_view(spec: LogicalSpec, move: Action) -> bool:
    if not isinstance(move, Move):
        return False
    found = move.new_tensor(spec)
    return found is not None and found[1]


def _pow2_below(n: int) -> list[int]:
    out, p = [], 1
    while p < n:
        out.append(p)
        p *= 2
    return out


def _tilings(spec: LogicalSpec, target: Target) -> tuple[Action, ...]:
    rows = target.register_rows
    if target.f32_register_rows and all(o.dtype is Dtype.F32 for o in spec.operands):
        rows = target.f32_register_rows
    return _shape_tilings(spec.kind, spec.shape, spec.output_index, spec.serial, rows, target)


@functools.lru_cache(maxsize=1 << 16)
def _shape_tilings(
    kind: str,
    shape: tuple[int, ...],
    output_index: int,
    serial: bool,
    register_rows: tuple[int, ...],
    target: Target,
) -> tuple[Action, ...]:
    """Output tilings of a `kind` Spec of `shape`, with the register-filling heights
    `register_rows` for Matmul rows: listed once per shape (see `_operand_moves`)."""
    out_dims = dim_maps(kind, len(shape))[output_index]
    if not out_dims:
        return ()  # a single value (a pipeline's scalar, moved): nothing to tile
    biggest = max(shape[d] for d in out_dims)
    sizes = _pow2_below(biggest) + [biggest]
    rows = len(shape) == 4 and (kind == MATMUL or kind.startswith(MATMUL + STAGE_SEP))
    extra = [r for r in register_rows if r < biggest and r not in sizes] if rows else []
    acts: list[Action] = []
    for size in sizes + extra:
        for d in out_dims:
            if size in extra and d != 1:
                continue  # register-filling heights tile only the rows (m)
            if size < shape[d]:
                tile = list(shape)
                tile[d] = size
                acts.append(TileOut(tuple(tile)))
    if not serial and target.processors > 1:
        for d in out_dims:
            for size in _pow2_below(shape[d]):
                tile = list(shape)
                tile[d] = size
                acts.append(TileOut(tuple(tile), parallel=True))
    return tuple(acts)


def _vector_size(t: TensorSpec, dtype: Dtype, layout: lay.Layout, target: Target) -> int | None:
    """One vector size for a VRF move, first that applies of:
    1. whole registers per row of the preferred width;
    2. f32 rows wider than that: preferred registers, the last one padded (lane masks),
       which takes fewer registers than any narrower width dividing the row;
    3. whole registers per row of the widest width that divides a row;
    4. f32 rows narrower than the preferred width: the narrowest register holding a row,
       padded;
    5. registers running across rows (only contiguous copies can use those)."""
    preferred = target.lanes(Dtype.F32) if dtype.is_float else target.lanes(dtype)
    legal = target.vector_sizes(dtype)
    full = layout.with_full_contig()
    phys = lay.expand(full, t.shape)
    if phys is None:
        return None
    row = phys[-1] if phys else 1
    widest_first = [preferred] + sorted((v for v in legal if v != preferred), reverse=True)
    narrowest_first = sorted(v for v in legal if v <= preferred)
    padded = [vs for vs in narrowest_first if padded_axis(t.shape, dtype, full, vs) is not None]
    steps = (
        [preferred] if row % preferred == 0 else [],
        [vs for vs in padded if vs == preferred < row],
        [vs for vs in widest_first if row % vs == 0],
        [vs for vs in padded if row < vs],
        [vs for vs in widest_first if row % vs],
    )
    for group in steps:
        for vs in group:
            if vs in legal and make_tensor(t.shape, dtype, Level.VRF, full, vs):
                return vs
    return None


def _relayouts(i: int, t: TensorSpec, level: Level, target: Target) -> list[lay.Layout]:
    """Layouts worth copying a Matmul input into.

    A dense row-major copy of a strided tile (into L1), and for B (rhs) N-panels
    `[n / p][k][p]` with p one or two vector widths, and four where the target has 6-row
    f32 tiles (in GL or L1), which make each k-row of a register tile one contiguous run.
    """
    if level is Level.GL is t.level and not _is_plain(t.layout):
        return []  # no GL repacking of a packed tensor (module docstring)
    shape = t.shape
    out = []
    rm = lay.row_major(shape)
    if level is Level.L1 and t.layout != rm:
        out.append(rm)
    if i == 1:
        lanes = target.lanes(Dtype.F32)
        widths = {lanes, 2 * lanes}
        if target.f32_register_rows and t.dtype == Dtype.F32:
            widths.add(4 * lanes)  # the rows of 6x64 f32 tiles (`Tuning.f32_register_rows`)
        for p in sorted(widths):
            if 1 < p < shape[2] and shape[2] % p == 0 and shape[1] > 1:
                out.append(lay.packed((0, 2, 1), 2, p, shape))
        amx = target.isa == "amx" and shape[1] % AMX_K_STEP == 0
        if (
            (amx or (target.fast_dpbf16 and shape[1] % 2 == 0))
            and t.dtype == Dtype.BF16
            and shape[2] % AMX_TILE == 0
        ):
            pairs = amx_pairs_layout(shape)  # k-pairs interleaved, for AMX or vdpbf16ps tiles
            if pairs is not None:
                out.append(pairs)
    return [x for x in dict.fromkeys(out) if x != t.layout]


def _is_plain(layout: lay.Layout) -> bool:
    """A layout of whole dims only (row-major, column-major, ...): no panels or pairs."""
    return all(d.kind == lay.DYN for d in layout.dims)


def _moves(
    spec: LogicalSpec, i: int, target: Target, kind: str | None = None
) -> tuple[Action, ...]:
    """Operand `i`'s moves, listed as for a `kind` Spec (default: the Spec's own; a
    pipeline's head inputs are listed as a Matmul's)."""
    kind = kind or spec.kind
    role = spec.roles()[i]
    is_matmul_input = kind == MATMUL and role == IN
    # The rhs is reused inside this Spec only if m > 1. A memory copy of a single-use
    # rhs (relayout or widening into GL/L1) reads every value once more than reading it
    # in place. (The lhs is small in the shapes where this matters, so it keeps its copies.)
    copy_pays = not is_matmul_input or i == 0 or spec.shape[1] > 1
    t = spec.operands[i]
    # Keyed by the identity of the operand and target (interned tensors; hashing a tensor
    # walks its layout), as `tensorspec.tile_tensor`; the entry holds both objects.
    key = (kind, role, i, id(t), copy_pays, id(target))
    hit = _MOVES.get(key)
    if hit is not None and hit[0] is t and hit[1] is target:
        return hit[2]
    found = _operand_moves(kind, role, i, t, copy_pays, target)
    _MOVES[key] = (t, target, found)
    return found


_MOVES: dict[tuple[object, ...], tuple[TensorSpec, Target, tuple[Action, ...]]] = {}


def _operand_moves(
    kind: str, role: str, i: int, t: TensorSpec, copy_pays: bool, target: Target
) -> tuple[Action, ...]:
    """The moves of operand `i` (`t`) of a `kind` Spec: they depend on nothing else of
    the Spec, and the same operand recurs across thousands of Specs, so they are listed
    once (cleared with the search's other tables, `clear_cache`)."""
    is_matmul_input = kind == MATMUL and role == IN
    dtypes = [t.dtype] + (list(WIDENINGS.get(t.dtype, ())) if role == IN else [])
    acts: list[Action] = []
    for level in MOVE_DESTINATIONS[t.level]:
        same = level == t.level
        if same and (level in (Level.RF, Level.VRF) or not is_matmul_input):
            continue
        if level is Level.L2:
            # Views (copies are made in GL or L1, but for the one below), and only of a tile
            # that fits L2 but not beside anything else in L1: a smaller tile moves to L1
            # directly (an L2 view only adds Specs); one as big as all of L1 (B of 128^3,
            # 64 KiB) is read from L2 in strips (`tensorspec._l2_strip`).
            if target.max_limits[Level.L1] <= t.cache_lines() <= target.max_limits[Level.L2]:
                acts.append(Move(i, level, t.layout, None, t.dtype))
                if target.l2_copies and copy_pays and is_matmul_input and i == 1 and t.page_pitch:
                    # a block of B with rows pages apart, copied dense into an L2 buffer:
                    # no main-memory buffer for the whole of B, which evicts A and C from
                    # L3 (docs/cost-model.md, "B copied into L2")
                    acts.append(Move(i, level, lay.row_major(t.shape), None, t.dtype))
            continue
        for dtype in dtypes:
            if level is Level.RF:
                if t.volume == 1:
                    acts.append(Move(i, level, lay.EMPTY, None, dtype))
            elif level is Level.VRF:
                if kind == MATMUL and i == 0:
                    continue  # lhs is only ever read as broadcast scalars or dot rows
                cands = [lay.row_major(t.shape)]
                own = t.layout.with_full_contig()
                if own != cands[0] and dtype == t.dtype:
                    cands.append(own)
                for layout in cands:
                    vs = _vector_size(t, dtype, layout, target)
                    if vs is not None:
                        acts.append(Move(i, level, layout, vs, dtype))
            else:
                layouts: list[lay.Layout] = []
                if level is Level.L1 and not same and dtype == t.dtype:
                    layouts.append(t.layout)  # the cache view
                if copy_pays and dtype != t.dtype:
                    wide = lay.row_major(t.shape)
                    fits_l1 = (
                        lay.cache_lines(wide, t.shape, dtype.size) <= target.max_limits[Level.L1]
                    )
                    if not (level is Level.GL and is_matmul_input and fits_l1):
                        layouts.append(wide)  # a widening copy
                elif copy_pays and is_matmul_input:
                    layouts.extend(_relayouts(i, t, level, target))
                for layout in layouts:
                    acts.append(Move(i, level, layout, None, dtype))
    return tuple(acts)


def _compose_actions(spec: LogicalSpec, target: Target) -> list[Action]:
    """A pipeline (actions/compose.py): the cache views and B packing a non-accumulating
    Matmul's inputs get (so they can be hoisted above the pipeline's loops), output
    tiles, then Bufferize at each cut point and level."""
    acts: list[Action] = []
    stages = compose_stages(spec.kind)
    if stages is not None and stages[0] == MATMUL:
        for i in (0, 1):
            acts.extend(_hoistable(spec, _moves(spec, i, target, MATMUL)))
    tilings = _tilings(spec, target)
    if stages is not None and last_cols_whole(stages):
        cols = spec.dim_maps()[-1][-1]  # a softmax needs whole rows: tile the rows only
        tilings = tuple(
            a for a in tilings if isinstance(a, TileOut) and a.shape[cols] == spec.shape[cols]
        )
    acts.extend(tilings)
    if stages is not None:
        acts.extend(Bufferize(level, at) for at in cut_points(stages) for level in BUFFER_LEVELS)
    return acts


#: Smallest chunk an online softmax denominator is split into: below it the per-chunk
#: rescaling (one scalar exp, a horizontal max and sum) outweighs the vector work.
MIN_SCAN_CHUNK = 64


def _row_actions(spec: LogicalSpec, target: Target) -> list[Action]:
    """Row operations (softmax, its parts, activations): L1 views of memory operands,
    register copies of single values, row tiles (any tile for elementwise parts),
    the softmax forms and reduction rewrites (actions/rows.py), then the kernels."""
    acts: list[Action] = []
    for i, t in enumerate(spec.operands):
        if t.level is Level.GL:
            acts.append(Move(i, Level.L1, t.layout, None, t.dtype))
        elif t.level is Level.L1 and t.volume == 1 and spec.kind != NEG_INF:
            acts.append(Move(i, Level.RF, lay.EMPTY, None, t.dtype))
    rows_only = spec.kind == SOFTMAX or spec.kind in REDUCTIONS
    out_dims = (0,) if rows_only else spec.dim_maps()[spec.output_index]
    for d in out_dims:
        for size in _pow2_below(spec.shape[d]):
            shape = list(spec.shape)
            shape[d] = size
            acts.append(TileOut(tuple(shape)))
    if not spec.serial and target.processors > 1 and len(spec.shape) == 2:
        for d in out_dims:  # threads over rows, or (elementwise parts) along them
            for size in _pow2_below(spec.shape[d]):
                shape = list(spec.shape)
                shape[d] = size
                acts.append(TileOut(tuple(shape), parallel=True))
    if spec.kind == SOFTMAX:
        for level in (Level.RF, Level.L1, Level.GL):
            for form in (UNSCALED, ONLINE):
                acts.append(SoftmaxParts(level, form))
    if spec.kind in REDUCTIONS and not spec.accum:
        acts.append(RowsToAccum())
        if spec.kind == SOFTMAX_DENOM_MAX:
            acts.append(ToMaxAndDenominator())
    if spec.kind == SOFTMAX_DENOM_MAX and spec.accum:
        acts.extend(SplitScan(k) for k in _pow2_below(spec.shape[1]) if k >= MIN_SCAN_CHUNK)
    acts.extend(_selects(spec.kind, *operand_dtypes_and_levels(spec)))
    return acts
