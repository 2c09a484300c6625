"""Microkernels: the leaves of every program, with applicability, register needs and cost.

Costs are the reference model's integer formulas (see the reference notes, "Kernels");
deviations are noted per kernel. `memory` is scratch the kernel needs beyond its operands
(checked against the Spec's limits when selected). C emitters live in
`morello_build.codegen.kernels`, keyed by kernel name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import MATMUL, MOVE, ZERO, LogicalSpec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.machine.isa import isa_includes
from morello_build.machine.target import Target

F32, BF16 = Dtype.F32, Dtype.BF16


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str  # spec kind it implements
    applies: Callable[[LogicalSpec, Target], bool]
    memory: Callable[[LogicalSpec, Target], Limits]
    cost: Callable[[LogicalSpec, Target], int]


def _regs(rf: int = 0, vrf: int = 0) -> Limits:
    return (rf, vrf, 0, 0, 0)


def _no_mem(spec: LogicalSpec, target: Target) -> Limits:
    return _regs()


def _scalar_here(t: TensorSpec) -> bool:
    return t.is_scalar and t.level in (Level.RF, Level.L1)


def _io(spec: LogicalSpec, target: Target) -> int:
    return sum(target.move_cost(o) for o in spec.operands)


def _vec(t: TensorSpec) -> bool:
    return t.level is Level.VRF and t.is_contiguous


def _nvec(t: TensorSpec) -> int:
    return t.registers


# ---- Matmul (accumulating) -------------------------------------------------------------


def _mult_add_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    return s.accum and all(_scalar_here(o) for o in s.operands) and c.dtype == F32


def _mult_add_cost(s: LogicalSpec, t: Target) -> int:
    # bf16 x bf16 -> f32 converts both inputs (a shift each): priced like CastBf16F32.
    base = 1 if s.operands[0].dtype == F32 else 4
    return base + _io(s, t)


def _bvma_orientation(s: LogicalSpec) -> str | None:
    """'row': c[1,1,n] += a[1,1,1] * b[1,1,n]; 'col': c[1,m,1] += a[1,m,1] * b[1,1,1]."""
    bdim, m, k, n = s.shape
    if bdim != 1 or k != 1:
        return None
    if m == 1:
        return "row"
    if n == 1:
        return "col"
    return None


def _bvma_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    if not s.accum or not (a.dtype == b.dtype == c.dtype == F32) or not _vec(c):
        return False
    o = _bvma_orientation(s)
    if o == "row":
        return _scalar_here(a) and _vec(b) and b.vector_size == c.vector_size
    if o == "col":
        return _scalar_here(b) and _vec(a) and a.vector_size == c.vector_size and a.volume > 1
    return False


def _bvma_cost(s: LogicalSpec, t: Target) -> int:
    return 2 * _nvec(s.operands[2]) + 1


def _bvma_memory(s: LogicalSpec, t: Target) -> Limits:
    """One vector register for the broadcast scalar, except where AVX-512 folds it into the
    FMA: an EVEX FMA reads a scalar from memory as an embedded broadcast (`{1to16}`), and
    gcc and clang emit that form when the scalar feeds a single FMA (a C row of one
    vector). So a 16x16 C tile and all 16 rows of B fit the 32 zmm registers, which is how
    the DP's 16^3 kernel keeps B in registers (see `VRF_LOAD_COST`). AVX2 has no embedded
    broadcast, and a scalar feeding several FMAs is broadcast into a register once."""
    a, b, c = s.operands
    scalar = a if _bvma_orientation(s) == "row" else b
    if isa_includes(t.isa, "avx512") and _nvec(c) == 1 and scalar.level is not Level.RF:
        return _regs()
    return _regs(vrf=1)


def _bvma_bf16_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    return (
        s.accum
        and (a.dtype, b.dtype, c.dtype) == (BF16, BF16, F32)
        and _bvma_orientation(s) == "row"
        and _scalar_here(a)
        and _vec(b)
        and _vec(c)
        and b.vector_size == c.vector_size
    )


def _bvma_bf16_cost(s: LogicalSpec, t: Target) -> int:
    """The f32 broadcast-FMA plus the widening it does on every call: each bf16 B vector
    (zero-extend + shift, two ops on the FMA ports) and the bf16 scalar (load, shift,
    broadcast). Priced like the FMAs, the widening made a 4x64 tile of this kernel look as
    cheap as f32 (avx512 bf16 256^3: 67 GF/s against 180 for f32), so the DP never paid
    for a widened copy of B that the f32 kernel could then reuse."""
    return _bvma_cost(s, t) + 2 * _nvec(s.operands[1]) + 2


def _bvma_bf16_memory(s: LogicalSpec, t: Target) -> Limits:
    # One broadcast register plus the widened copy of each B vector.
    return _regs(vrf=1 + _nvec(s.operands[1]))


def _dot_shape(s: LogicalSpec) -> bool:
    bdim, m, k, n = s.shape
    a, b, c = s.operands
    return (
        s.accum
        and bdim == m == n == 1
        and a.level is Level.L1
        and b.level is Level.L1
        and a.is_contiguous
        and b.is_contiguous
        and _scalar_here(c)
    )


def _accumulators(k: int, strip: int) -> int:
    """Independent vector accumulators a dot loop uses (hides FMA latency), up to 4."""
    steps = k // strip
    return next(c for c in (4, 3, 2, 1) if steps % c == 0)


def _dot_f32_applies(s: LogicalSpec, t: Target) -> bool:
    lanes = t.lanes(F32)
    return (
        lanes > 1
        and _dot_shape(s)
        and all(o.dtype == F32 for o in s.operands)
        and s.shape[2] % lanes == 0
    )


def _dot_f32_memory(s: LogicalSpec, t: Target) -> Limits:
    return _regs(vrf=_accumulators(s.shape[2], t.lanes(F32)) + 2)


#: Horizontal sum of the accumulators plus the scalar read-modify-write of the output.
DOT_REDUCE_COST = 8


def _dot_f32_cost(s: LogicalSpec, t: Target) -> int:
    # Each strip needs two vector loads per FMA (both operands stream from L1), against one
    # load per FMA for broadcast-FMA tiles, so a strip costs twice a broadcast-FMA vector
    # (2 load ports: 1 strip/cycle vs 2 FMAs/cycle). The reference's 2*K/lanes made the DP
    # pick dot products over broadcast-FMA register tiles for avx2 256^3, which measured
    # 36 GF/s against 42 for the naive loop nest in the same `morello bench` run.
    return 4 * s.shape[2] // t.lanes(F32) + DOT_REDUCE_COST + t.move_cost(s.operands[2])


def _dot_bf16_applies(s: LogicalSpec, t: Target) -> bool:
    lanes = t.lanes(F32)
    dts = tuple(o.dtype for o in s.operands)
    return lanes > 1 and _dot_shape(s) and dts == (BF16, BF16, F32) and s.shape[2] % lanes == 0


def _dot_bf16_memory(s: LogicalSpec, t: Target) -> Limits:
    return _regs(vrf=_accumulators(s.shape[2], t.lanes(F32)) + 4)


def _dot_bf16_cost(s: LogicalSpec, t: Target) -> int:
    # Widening both inputs costs about as much again as the FMAs.
    return 6 * s.shape[2] // t.lanes(F32) + DOT_REDUCE_COST + t.move_cost(s.operands[2])


def _vdpbf16_applies(s: LogicalSpec, t: Target) -> bool:
    dts = tuple(o.dtype for o in s.operands)
    return (
        isa_includes(t.isa, "avx512")
        and _dot_shape(s)
        and dts == (BF16, BF16, F32)
        and s.shape[2] % 32 == 0
    )


def _vdpbf16_memory(s: LogicalSpec, t: Target) -> Limits:
    return _regs(vrf=_accumulators(s.shape[2], 32) + 2)


#: One `vdpbf16ps zmm` costs this many units. Measured on this project's Xeon: 24 (or 12)
#: independent register vdpbf16ps retire one per 2 cycles (56 GF/s counted as f32 FMAs, against
#: 218-228 for vfmadd231ps zmm, which issues 2 per cycle at 2 units each).
VDPBF16PS_COST = 8
#: The same on AMD Zen 4 (`Target.tune == "zen4"`): 16 independent register `vdpbf16ps zmm`
#: retire one per cycle (3.62 G/s at 3.65 GHz), as many as `vfmadd231ps zmm` (3.61 G/s), so
#: both cost what an FMA does in `_bvma_cost`.
VDPBF16PS_COST_ZEN4 = 2


def vdpbf16ps_cost(t: Target) -> int:
    return VDPBF16PS_COST_ZEN4 if t.fast_dpbf16 else VDPBF16PS_COST


def _vdpbf16_cost(s: LogicalSpec, t: Target) -> int:
    k = s.shape[2]
    return vdpbf16ps_cost(t) * k // 32 + 4 * _accumulators(k, 32) + t.move_cost(s.operands[2])


# ---- Row-streaming vector x matrix (matrix-vector products) ------------------------------
#
# c[1, n] += sum_kk a[kk] * B[kk, n] for a few rows kk of a row-major B in main memory: the
# kernel walks all k rows side by side along n (one sequential stream per row, which the
# hardware prefetcher follows), keeping 4 output vectors in registers and reading/writing
# the L1-resident output once per call. This is the matrix-vector form that runs at
# memory bandwidth: B is read exactly once, in long sequential runs.
#
# Constants, measured on this project's machine (Xeon, AVX-512, 1 thread, gcc -O3, medians of
# 30 round-robin samples, /tmp harness with the same loops the emitters write):
#   f32 1x1024x1024:  column panels of 128 (the best plan without this kernel, model cost
#                     ~24 per B line) 8.9 GF/s; 8 row streams x 4 vectors 12.9 GF/s;
#                     a plain streaming read of B 11.7 GF/s-equivalent.
#   f32 1x2048x16384: panels 3.5, row streams 6.2-6.5, streaming read 5.5-6.2 GF/s-equivalent.
# So a streamed B line costs about 24 / 1.6 ~ 15 model units with the FMA included:
# `STREAM_LINE_COST` 13 per line plus 2 per FMA vector. Each row run additionally pays
# `STREAM_RUN_COST` (a new stream: a TLB miss and prefetcher warm-up; short runs such as
# 8-line panel rows measured ~1.5x slower per line, i.e. ~8 x 9 units per run), which is what
# makes the search prefer long rows over narrow panels.

STREAM_MAX_ROWS = 8  # rows (streams) per call; 4 and 8 measured equal, 16 slower
STREAM_ACCUMULATORS = 4  # output vectors held in registers per step
STREAM_LINE_COST = 13
STREAM_RUN_COST = 64


def _rows_layout_ok(b: TensorSpec) -> bool:
    """B tile stored row-major with every k-row one contiguous run along n."""
    dims = b.layout.dims
    if not dims or dims[-1] != lay.PhysDim(2, lay.DYN, 0) or b.layout.contig < 1:
        return False
    return all(d.kind == lay.DYN and d.axis == 1 for d in dims[:-1])


def _rows_applies_common(s: LogicalSpec, t: Target, dts: tuple[Dtype, ...]) -> bool:
    a, b, c = s.operands
    bdim, m, k, n = s.shape
    lanes = t.lanes(F32)
    return (
        s.accum
        and lanes > 1
        and bdim == 1
        and m == 1
        and 1 <= k <= STREAM_MAX_ROWS
        and n % lanes == 0
        and (a.dtype, b.dtype, c.dtype) == dts
        and a.level.in_memory
        and b.level is Level.GL
        and _rows_layout_ok(b)
        and c.level is Level.L1
        and c.is_contiguous
    )


def _rows_f32_applies(s: LogicalSpec, t: Target) -> bool:
    return _rows_applies_common(s, t, (F32, F32, F32))


def _rows_bf16_applies(s: LogicalSpec, t: Target) -> bool:
    return _rows_applies_common(s, t, (BF16, BF16, F32))


def _rows_memory(s: LogicalSpec, t: Target) -> Limits:
    # One broadcast scalar per row, the accumulators, one loaded (widened) B vector.
    return _regs(vrf=s.shape[2] + STREAM_ACCUMULATORS + 1)


def _rows_cost(s: LogicalSpec, t: Target) -> int:
    a, b, c = s.operands
    _, _, k, n = s.shape
    nvec = n // t.lanes(F32)
    per_fma = 2 if b.dtype == F32 else 3  # bf16: one more op to widen each B vector
    return (
        k * nvec * per_fma
        + b.cache_lines() * STREAM_LINE_COST
        + k * STREAM_RUN_COST
        + 2 * nvec  # output vectors loaded and stored once per call
        + t.move_cost(a)
    )


# ---- AMX tiles (target "amx") ----------------------------------------------------------
#
# c[M, N] (+)= a[M, K] @ b[K, N] with tdpbf16ps: C is held in 1-4 tile registers (16x16 f32
# each, M and N in {16, 32}); per 32-step of K it loads M/16 A tiles (16 rows x 32 bf16,
# rows contiguous along k, one row stride) and N/16 B tiles from the k-pair packed layout
# `[1,2,1p2]` (B'[k/2][n][2]: a tile row is the pairs of 16 columns, 64 bytes) and issues
# (M/16)(N/16) tdpbf16ps. C tiles are loaded at entry (zeroed in the tiles when the Matmul
# does not accumulate) and stored at exit.
#
# Measured on this project's Xeon (Sapphire Rapids class, ~3.8 GHz, gcc 12 -O3, standalone
# harness benchmarks/amx_tiles.c, medians of 2001 reps):
#   tdpbf16ps, 4 independent tiles: 4.47 ns each (~16.9 cycles; 16384 flops -> ~3.7 TF/s)
#   tileloadd 1 KB from L1: 2.39 ns (~9 cycles);  tilestored 1 KB: 4.45 ns (~17 cycles)
#   256^3 with 2x2 tiles, B prepacked: 19.5 us = 1724 GF/s (packing B too: 23.4 us);
#   _tile_loadconfig + _tile_release: 49 ns per pair.
# At 4 units per cycle: 64 per tdpbf16ps, 36 per tile load, 68 per tile store. The loads
# do overlap the tile multiplier in hardware; charging them anyway is what makes 2x2 tiles
# (4 loads per 4 tdpbf16ps) cheaper than 1x1 (2 loads per tdpbf16ps), as measured.

AMX_TDP_COST = 64
AMX_TILELOAD_COST = 36
AMX_TILESTORE_COST = 68
#: `tilezero` writes no memory (the non-accumulating form starts from zero tiles instead of
#: a memset C loaded back; 256^3: 29.8 us with memset + loads).
AMX_TILEZERO_COST = 4
AMX_K_STEP = 32  # bf16 values along k per tdpbf16ps (a 64-byte tile row)
AMX_TILE = 16  # rows (and f32 columns) of one tile

#: The k-pair layout of B (1 x K x N): physical B'[k/2][n][2].
AMX_PAIRS_DIMS = (
    lay.PhysDim(1, lay.DYN, 0),
    lay.PhysDim(2, lay.DYN, 0),
    lay.PhysDim(1, lay.PACKED, 2),
)
_ROWS_DIMS = (lay.PhysDim(1, lay.DYN, 0), lay.PhysDim(2, lay.DYN, 0))


def amx_pairs_layout(shape: tuple[int, ...]) -> lay.Layout | None:
    """`[1,2,1p2]` for a 1 x K x N tensor (None when K is odd or the layout collapses)."""
    if len(shape) != 3 or shape[1] % 2 or shape[1] < 4 or shape[2] < 2:
        return None
    return lay.packed((0, 1, 2), 1, 2, shape)


def _mem(t: TensorSpec) -> bool:
    return t.level.in_memory


def _amx_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    bdim, m, k, n = s.shape
    return (
        t.isa == "amx"
        and (a.dtype, b.dtype, c.dtype) == (BF16, BF16, F32)
        and bdim == 1
        and m in (16, 32)
        and n in (16, 32)
        and k % AMX_K_STEP == 0
        and _paired_in_memory(s)
    )


def _paired_in_memory(s: LogicalSpec) -> bool:
    """The operand layouts of the AMX and vdpbf16ps tile kernels: all three in memory, A
    and C row-major with contiguous rows, B in k-pairs with contiguous pair rows."""
    a, b, c = s.operands
    return (
        all(_mem(o) for o in s.operands)
        and a.layout.dims == _ROWS_DIMS
        and a.layout.contig >= 1
        and b.layout.dims == AMX_PAIRS_DIMS
        and b.layout.contig >= 2
        and c.layout.dims == _ROWS_DIMS
        and c.layout.contig >= 1
    )


def _amx_cost(s: LogicalSpec, t: Target) -> int:
    _, m, k, n = s.shape
    mt, nt, ks = m // AMX_TILE, n // AMX_TILE, k // AMX_K_STEP
    gl = sum(t.move_cost(o) for o in s.operands if o.level in (Level.L2, Level.GL))
    c_in = AMX_TILELOAD_COST if s.accum else AMX_TILEZERO_COST
    return (
        ks * (mt * nt * AMX_TDP_COST + (mt + nt) * AMX_TILELOAD_COST)
        + mt * nt * (c_in + AMX_TILESTORE_COST)
        + gl
    )


# ---- vdpbf16ps register tiles (bf16 GEMM where vdpbf16ps is fast: `Target.fast_dpbf16`) --
#
# c[M, N] (+)= a[M, K] @ b[K, N], all three in memory: C is held in M x N/16 zmm accumulators
# for the whole K; per k-pair the kernel loads the N/16 vectors of one B pair row (the k-pair
# layout `[1,2,1p2]` the AMX kernel uses: B'[k/2][n][2], 16 columns x 2 k per zmm),
# broadcasts each A row's pair (two adjacent bf16 of a row-major A, one 32-bit broadcast)
# and issues M x N/16 `vdpbf16ps`. C is loaded at entry (zeroed in registers when the
# Matmul does not accumulate) and stored at exit. Only enumerated with `fast_dpbf16`: on
# the generic tuning (the Xeon) vdpbf16ps has half the f32 FMA flop rate and widening wins.

DPBF16_COLS = 16  # f32 columns per zmm accumulator (and per B vector of 16 pairs)
DPBF16_MIN_K = 4  # a 2-row B tile is no longer in the k-pair layout (`amx_pairs_layout`)
DPBF16_TILE_MAX_COLS = 64  # four zmm accumulators per row
DPBF16_LOAD_COST = 1  # a B vector load or an A pair broadcast, per k-pair


def _dpbf16_tile_registers(m: int, n: int) -> int:
    """Accumulators, the B vectors of one pair row, and one broadcast."""
    return m * (n // DPBF16_COLS) + n // DPBF16_COLS + 1


def _dpbf16_tile_applies(s: LogicalSpec, t: Target) -> bool:
    a, b, c = s.operands
    bdim, m, k, n = s.shape
    return (
        t.fast_dpbf16
        and (a.dtype, b.dtype, c.dtype) == (BF16, BF16, F32)
        and bdim == 1
        and k % 2 == 0
        and k >= DPBF16_MIN_K
        and n % DPBF16_COLS == 0
        and n <= DPBF16_TILE_MAX_COLS
        and _dpbf16_tile_registers(m, n) <= t.max_limits[Level.VRF]
        and _paired_in_memory(s)
    )


def _dpbf16_tile_memory(s: LogicalSpec, t: Target) -> Limits:
    _, m, _, n = s.shape
    return _regs(vrf=_dpbf16_tile_registers(m, n))


def _dpbf16_tile_cost(s: LogicalSpec, t: Target) -> int:
    _, m, k, n = s.shape
    nv = n // DPBF16_COLS
    per_pair = m * nv * vdpbf16ps_cost(t) + (m + nv) * DPBF16_LOAD_COST
    c_io = m * nv * (ZMM_STORE_COST + (1 if s.accum else 0))
    far = sum(t.move_cost(o) for o in s.operands if o.level in (Level.L2, Level.GL))
    return (k // 2) * per_pair + c_io + far


# ---- Move --------------------------------------------------------------------------------


def _assign_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    return a.dtype == b.dtype and _scalar_here(a) and _scalar_here(b)


def _assign_cost(s: LogicalSpec, t: Target) -> int:
    return _io(s, t) + 1


def _cast_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    return (a.dtype, b.dtype) == (BF16, F32) and _scalar_here(a) and _scalar_here(b)


def _cast_cost(s: LogicalSpec, t: Target) -> int:
    return 4 + _io(s, t)


def _vassign_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    if a.dtype != b.dtype or not (a.is_contiguous and b.is_contiguous) or a.layout != b.layout:
        return False
    if Level.VRF not in (a.level, b.level):
        return False
    if a.level is Level.VRF and b.level is Level.VRF and a.vector_size != b.vector_size:
        return False
    return all(o.level in (Level.VRF, Level.L1) for o in (a, b))


#: Cost units of storing one 64-byte vector register to memory: the time of 2 FMAs (2 units
#: each in `_bvma_cost`). Measured on this CPU (asm loops, best of 7): an FMA 0.135 ns
#: (2 per cycle), a zmm store 0.250 ns (1.85 FMAs), 24 FMAs followed by storing their 24
#: registers 2.82 FMAs per pair: a register tile's stores do not hide behind its FMAs.
#: At one unit (the reference's price) the model saw storing and reloading C around a k
#: split as nearly free and picked such plans at 128^3 (0.95-0.98x of MKL against
#: 1.05-1.06x for whole-k tiles that store C once; same harness). 32-byte stores keep one
#: unit: one ymm store took 0.249 ns, 2.0 ymm FMAs, but a ymm FMA followed by its store
#: 2.03, so there the stores do overlap the FMAs.
ZMM_STORE_COST = 4


#: Cost units of one load into vector registers on AVX-512, on top of one unit per register:
#: a price per load *group*, so that of two plans with the same loads the DP prefers the one
#: that loads B for several k steps at once, ahead of the FMAs that use it, over one that
#: loads each B row right before its FMAs. Such a plan runs each C row's FMAs over the group
#: as a chain (rows outer, k inner), and that order is most of the gain: at 16^3, all of B
#: in registers with the k-outer order measured 0.997-0.999 of MKL's JIT, with the row
#: chains 1.051-1.053 (the cause is not pinned down). DP plans before and after, same
#: harness, 3-4 rounds, ratio to MKL's JIT: 16^3 (all of B in 16 zmm) 0.976-0.978 ->
#: 1.051-1.053; 32^3 (B two k steps at a time) 1.009-1.010 -> 1.043-1.044; 64^3 0.993-0.996
#: -> 0.996-0.998; ratio to MKL: 512^3 (its B pack copies a 512-float row through 32
#: registers at once) 1.025-1.062 -> 1.048-1.067; 512^3 on 2 threads (B two k steps at a
#: time) 0.983-1.025 -> 0.996-1.030; bf16 256^3 (widening copies of whole A rows) 1.627 ->
#: 1.625-1.628. The other table shapes keep their plans. AVX2 keeps the plain price: there
#: (16 registers, no embedded broadcast) the same rule picked B groups of 4 k steps at 8^3
#: and measured 1.049 -> 1.000 of the JIT.
VRF_LOAD_COST = 1


def _vassign_cost(s: LogicalSpec, t: Target) -> int:
    a, b = s.operands
    if b.level is not Level.VRF:  # a store from the registers of `a`
        zmm = a.vector_size is not None and a.vector_size * a.dtype.size == 64
        return (ZMM_STORE_COST if zmm else 1) * a.registers
    if a.level is not Level.VRF and isa_includes(t.isa, "avx512"):  # a load
        return b.registers + VRF_LOAD_COST
    return b.registers  # an AVX2 load, or a copy between registers (same count both sides)


def _vcast_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    return (
        (a.dtype, b.dtype) == (BF16, F32)
        and _vec(a)
        and _vec(b)
        and a.vector_size == b.vector_size
        and a.layout == b.layout
    )


def _vcast_cost(s: LogicalSpec, t: Target) -> int:
    return 2 * _nvec(s.operands[0])


#: One step of `PackBf16Pairs`: two 64-byte row loads, unpacklo/hi + 2 permutes (port 5,
#: ~4 cycles), two stores. Measured with the standalone harness: packing a 256x256 bf16 B
#: (L2-resident) takes 2.74 us, 2.7 ns ~ 10 cycles per step; the lines are charged by `_io`.
PACK_STEP_COST = 16


def _pack_pairs_applies(s: LogicalSpec, t: Target) -> bool:
    a, b = s.operands
    if not (t.isa == "amx" or t.fast_dpbf16) or len(s.shape) != 3:
        return False
    bdim, k, n = s.shape
    return (
        bdim == 1
        and a.dtype == b.dtype == BF16
        and k % 2 == 0
        and n % 16 == 0
        and _mem(a)
        and _mem(b)
        and _rows_layout_ok(a)
        and b.layout.dims == AMX_PAIRS_DIMS
        and b.layout.contig >= 2
    )


def _pack_pairs_cost(s: LogicalSpec, t: Target) -> int:
    _, k, n = s.shape
    return PACK_STEP_COST * (k // 2) * -(-n // 32) + _io(s, t)


# ---- Zero --------------------------------------------------------------------------------


def _memset_applies(s: LogicalSpec, t: Target) -> bool:
    (o,) = s.operands
    return o.level.in_memory and o.is_contiguous


def _memset_cost(s: LogicalSpec, t: Target) -> int:
    """One unit per 64-byte line, the cost of a VectorAssign store of one line.

    The reference charges a flat 1, which makes zeroing a whole output look free, so the
    DP zeroed outputs in memory and then loaded the zeros into the register tile. Measured
    (avx512, 96x37x256, same harness): memset + load 145 GF/s; the register tile zeroed
    in registers (`VectorZero`, no load) 170 GF/s.

    A zero in a Spec that may still run threads (not `serial`) runs on one thread before
    the parallel loops, while the other cores wait: it is charged like main-memory stores
    (`Target.move_cost`: the level's hit cost per line). Measured, avx2 f32 512^3 on 2
    threads, same harness as MKL: the DP zeroed all of C (1 MB, ~95 us) on one thread,
    then packed B in a second parallel region: 177 GF/s, 0.87x of MKL. Priced this way,
    the threads split the rows and each zeroes its own (the one-thread plan inside):
    0.96-0.99x. Zeros inside a parallel loop or in one-thread kernels are serial Specs and
    keep one unit per line (charging those more made the one-thread 128^3 plans slower:
    0.97x -> 0.94x).
    """
    (o,) = s.operands
    return o.cache_lines() if s.serial else t.move_cost(o)


def _value_zero_applies(s: LogicalSpec, t: Target) -> bool:
    return _scalar_here(s.operands[0])


def _vector_zero_applies(s: LogicalSpec, t: Target) -> bool:
    return _vec(s.operands[0])


KERNELS: tuple[Kernel, ...] = (
    Kernel("MultAdd", MATMUL, _mult_add_applies, _no_mem, _mult_add_cost),
    Kernel("BroadcastVecMultAdd", MATMUL, _bvma_applies, _bvma_memory, _bvma_cost),
    Kernel(
        "BroadcastVecMultAddBf16F32",
        MATMUL,
        _bvma_bf16_applies,
        _bvma_bf16_memory,
        _bvma_bf16_cost,
    ),
    Kernel("DotProductLoop", MATMUL, _dot_f32_applies, _dot_f32_memory, _dot_f32_cost),
    Kernel("DotProductLoopBf16", MATMUL, _dot_bf16_applies, _dot_bf16_memory, _dot_bf16_cost),
    Kernel("DotProductLoopVdpbf16ps", MATMUL, _vdpbf16_applies, _vdpbf16_memory, _vdpbf16_cost),
    Kernel("VecMatRowsF32", MATMUL, _rows_f32_applies, _rows_memory, _rows_cost),
    Kernel("VecMatRowsBf16F32", MATMUL, _rows_bf16_applies, _rows_memory, _rows_cost),
    Kernel("AmxTileMatmulBf16F32", MATMUL, _amx_applies, _no_mem, _amx_cost),
    Kernel(
        "Dpbf16TileBf16F32",
        MATMUL,
        _dpbf16_tile_applies,
        _dpbf16_tile_memory,
        _dpbf16_tile_cost,
    ),
    Kernel("Assign", MOVE, _assign_applies, _no_mem, _assign_cost),
    Kernel("CastBf16F32", MOVE, _cast_applies, _no_mem, _cast_cost),
    Kernel("VectorAssign", MOVE, _vassign_applies, _no_mem, _vassign_cost),
    Kernel("VectorCastBf16F32", MOVE, _vcast_applies, _no_mem, _vcast_cost),
    Kernel("PackBf16Pairs", MOVE, _pack_pairs_applies, _no_mem, _pack_pairs_cost),
    Kernel("MemsetZero", ZERO, _memset_applies, _no_mem, _memset_cost),
    Kernel("ValueZero", ZERO, _value_zero_applies, _no_mem, lambda s, t: _io(s, t) + 1),
    Kernel("VectorZero", ZERO, _vector_zero_applies, _no_mem, lambda s, t: _nvec(s.operands[0])),
)

KERNELS_BY_NAME: dict[str, Kernel] = {k.name: k for k in KERNELS}


def kernels_for(kind: str) -> tuple[Kernel, ...]:
    return tuple(k for k in KERNELS if k.kind == kind)
