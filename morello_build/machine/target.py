"""The x86 targets: AMX (AVX-512 plus tiles), AVX-512, AVX2+FMA and a portable scalar fallback.

A `Target` holds the cost model's constants for one ISA and thread count. They follow the
published Morello model (reference notes, "X86 target"), plus an L2 level on AVX-512 and
AMX, whose hit cost was measured because the reference has none. `tune` picks what
differs between microarchitectures of one ISA, as gcc's `-mtune` does (`Tuning`, one per
name in `TUNES`). `processors` is the thread count the kernel is built for (the user's
`threads`), because that is what an OpenMP loop in our kernels really uses. The
measurements behind the constants and the tunings: docs/internals.md, "The cost model's
constants".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from morello_build.errors import SpecError
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.limits import Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.ir.tensorspec import L2_STRIP_MAX_ROW_BYTES, TensorSpec
from morello_build.machine.isa import ISA, ISAS, Isa, native_isa, native_tune


@dataclass(frozen=True)
class Tuning:
    """What one microarchitecture changes of an ISA's model and code (see the module doc)."""

    name: str
    #: `vdpbf16ps zmm` retires at the f32 FMA rate: bf16 GEMMs on vdpbf16ps register tiles
    #: (the search changes; avx512 only).
    fast_dpbf16: bool = False
    #: The streaming matrix-vector loop prefetches B rows ahead in software (code only).
    stream_prefetch: bool = True
    #: Row functions test at run time whether `out` lies just ahead of `x` modulo 1 MiB on
    #: an Intel CPU and then run backward (code only; `kernels.rows.STORE_AHEAD_WINDOW`):
    #: Intel cores stall forward loads on such stores, 2-5x; on Zen 5 the forward loop loses
    #: at most 1.2x there and the backward softmax pass 1.5-1.7x, so AMD tunings emit no
    #: test (docs/softmax.md, "On AMD Zen 5").
    store_direction: bool = True
    #: A parallel loop's start-up and per-iteration cost when measured on this
    #: microarchitecture (benchmarks/par_setup.py); None keeps the ISA's.
    par_setup: int | None = None
    par_per_iter: int | None = None
    #: What a line of an input's L2 view costs when a kernel reads it in place, when
    #: measured below the ISA's L2 cost on this microarchitecture (None: the ISA's).
    #: Copies, and outputs read and written back, keep the ISA's price.
    l2_read_hit: int | None = None
    #: What a line of a Matmul lhs's main-memory view costs when a kernel reads it in
    #: place as rows of at least `STREAM_RUN_LINES` lines under at least
    #: `STREAM_FMAS_PER_LINE` vector FMAs per line (A's rows under a whole-k register tile:
    #: the prefetchers fetch them behind the FMAs), when measured below the ISA's price of
    #: a main-memory line; None keeps the ISA's.
    gl_stream_hit: int | None = None
    #: The L2 lines the model may fill, when measured below the ISA's (`Isa.l2_lines`);
    #: None keeps the ISA's.
    l2_lines: int | None = None
    #: Register-tile heights offered besides the ISA's (`Isa.register_rows`) to products
    #: of f32 operands (the broadcast-FMA tiles they were measured with).
    f32_register_rows: tuple[int, ...] = ()
    #: What a vector load or store of 64 bytes adds when it splits two lines, measured on
    #: this microarchitecture: the cost of reading a caller's array in place, which may
    #: start anywhere in a line (`TensorSpec.aligned`); 0: not measured, not charged.
    split_cost: int = 0
    #: The widest rows (bytes) of an L2 view whose column strips a register tile may read
    #: in place from L2, when measured wider than `tensorspec.L2_STRIP_MAX_ROW_BYTES` on
    #: this microarchitecture (`benchmarks/l2_strips.py`); None keeps that.
    l2_strip_row_bytes: int | None = None
    #: Whether the search may copy a block of B whose rows are whole pages apart into an
    #: L2 buffer (besides viewing it there in place), where that was measured faster than
    #: packing the whole of B into a main-memory buffer (`actions/enumerate.py`).
    l2_copies: bool = False


#: Tunings by name, the default first.
TUNINGS: dict[str, Tuning] = {
    t.name: t
    for t in (
        # a warm fork and join on the Xeon: 0.7-1.3 us = 11k-22k units (docs/cost-model.md,
        # "Parallel loops"); the reference's 230k (AVX2) and 850k (AVX-512) are 18 us
        Tuning("generic", par_setup=22_000),
        # a warm OpenMP fork and join: 0.7-2.8 us = 9k-38k units (docs/cost-model.md,
        # "Parallel loops"); the reference's 230k is ~18 us
        Tuning(
            "zen3",
            stream_prefetch=False,
            store_direction=False,
            par_setup=36_000,
            par_per_iter=20,
        ),
        Tuning("zen4", fast_dpbf16=True, stream_prefetch=False, store_direction=False),
        # a warm fork and join on the Zen 5 VM: 0.44-0.60 us = 7.4k-11.0k units, 3-10 per
        # iteration (docs/cost-model.md, "Parallel loops")
        # a register tile reading B from L2 runs as fast as from L1 (a copy out of L2 costs
        # 1.3x one out of L1), f32 6x64 tiles fill 24 zmm as 12x32 ones do (bf16
        # vdpbf16ps tiles of 6 rows ran 0.93x), and an L2 view that fills all of its 1 MiB
        # L2 is evicted by the other streams: docs/cost-model.md, "Lines read from L2";
        # a whole-k tile's rows of A cost 0.27 ns a line beyond its FMAs from L3 (median),
        # 5 units: docs/cost-model.md, "Rows streamed under a tile";
        # a zmm load that splits two lines takes a second load's time (L1 reads 16 bytes
        # past a line: 0.258 against 0.135 ns a line): docs/cost-model.md, "Split loads";
        # a 12x32 tile reads 32-column strips of an L2 block with rows up to 4 KiB apart
        # as fast as packed panels: docs/cost-model.md, "Strips of an L2 view with wide rows";
        # a block of B with rows pages apart copied into L2 beats B packed whole in a
        # buffer that evicts A and C from L3: docs/cost-model.md, "B copied into L2"
        Tuning(
            "zen5",
            fast_dpbf16=True,
            store_direction=False,
            par_setup=11_000,
            par_per_iter=10,
            l2_read_hit=1,
            gl_stream_hit=5,
            l2_lines=1 << 13,
            f32_register_rows=(6,),
            split_cost=1,
            l2_strip_row_bytes=4096,
            l2_copies=True,
        ),
    )
}
#: Where `Tuning.gl_stream_hit` applies, as `benchmarks/row_stream.py` measured it: rows
#: (along k) of at least 64 lines (4 KiB), each line feeding at least 16 vector FMAs.
STREAM_RUN_LINES = 64
STREAM_FMAS_PER_LINE = 16

#: Tuning names (`Target.tune`), the default first.
TUNES: tuple[str, ...] = tuple(TUNINGS)


def tune_note(tune: str) -> str:
    """` (tune zen3)` for a non-generic tuning, else empty: how output names a tuning."""
    return "" if tune == "generic" else f" (tune {tune})"


@dataclass(frozen=True)
class Target:
    isa: str  # "amx" | "avx512" | "avx2" | "x86-64"
    vector_bytes: tuple[int, ...]  # legal vector register widths
    max_limits: Limits  # RF, VRF registers; L1, L2, GL lines
    hit_cost: tuple[int, ...]  # per level, per 64-byte line
    par_setup: int
    par_per_iter: int
    processors: int = 1
    #: Extra register-tile heights of Matmul tilings (`Isa.register_rows`), and those of
    #: f32 products when the tuning adds some (`Tuning.f32_register_rows`; empty: the same).
    register_rows: tuple[int, ...] = ()
    f32_register_rows: tuple[int, ...] = ()
    #: A strided source's copy surcharge, percent of its run-by-run reads (`Isa`).
    strided_copy_percent: int = 100
    #: What a line of an input's L2 view read in place costs (`Tuning.l2_read_hit`);
    #: None: what any L2 line costs.
    l2_read_hit: int | None = None
    #: What a line of an input's main-memory rows streamed under a tile costs
    #: (`Tuning.gl_stream_hit`); None: what any main-memory line costs.
    gl_stream_hit: int | None = None
    #: What a 64-byte vector access that splits two lines adds (`Tuning.split_cost`); 0:
    #: not charged, and the search marks no buffer `aligned`.
    split_cost: int = 0
    #: The widest rows (bytes) of an L2 view whose column strips stay in L2
    #: (`Tuning.l2_strip_row_bytes`, else `tensorspec.L2_STRIP_MAX_ROW_BYTES`).
    l2_strip_row_bytes: int = L2_STRIP_MAX_ROW_BYTES
    #: Whether a block of B with rows pages apart may be copied into L2 (`Tuning.l2_copies`).
    l2_copies: bool = False
    tune: str = "generic"  # one of TUNES: microarchitecture constants (see the module doc)

    def __hash__(self) -> int:
        # The search's caches are keyed by Target: hashing every field (a dataclass's own
        # hash) was 5% of a cold synthesis. Equal Targets still hash equal.
        return hash((self.isa, self.tune, self.processors))

    @property
    def tuning(self) -> Tuning:
        return TUNINGS[self.tune]

    @property
    def fast_dpbf16(self) -> bool:
        """`vdpbf16ps` retires at the f32 FMA rate (twice its flops): bf16 GEMMs use it."""
        return self.tuning.fast_dpbf16 and self.isa == "avx512"

    def vector_sizes(self, dtype: Dtype) -> tuple[int, ...]:
        """Legal values-per-register for `dtype`, smallest first."""
        return tuple(b // dtype.size for b in self.vector_bytes if b >= dtype.size)

    def lanes(self, dtype: Dtype) -> int:
        """Values in the widest vector register (1 on the scalar target)."""
        size, widest = dtype.size, 1
        for b in self.vector_bytes:  # a loop: every kernel check asks (no generator)
            if b // size > widest:
                widest = b // size
        return widest

    def move_cost(self, t: TensorSpec) -> int:
        """Cost of touching every line of `t` once; doubled when it is not contiguous."""
        c = self.run_lines_cost(t)
        return c if t.is_contiguous else 2 * c

    def in_place_read_discount(self, t: TensorSpec, fmas: int) -> int:
        """What an input's cache view of `t` costs less than `move_cost(t)` when a kernel
        doing `fmas` vector FMAs (0: not a Matmul) reads it in place: the tuning's measured
        price of an L2 line (`Tuning.l2_read_hit`), or of a main-memory line of long rows
        under enough FMAs (`Tuning.gl_stream_hit`); 0 elsewhere."""
        if t.level is Level.L2:
            if self.l2_read_hit is None:
                return 0
            return (self.hit_cost[Level.L2] - self.l2_read_hit) * t.cache_lines()
        if t.level is not Level.GL or self.gl_stream_hit is None or fmas <= 0:
            return 0
        count, per_run = lay.runs(t.layout, t.shape, t.dtype.size)
        row_lines = -(-t.shape[-1] * t.dtype.size // lay.LINE_BYTES)  # a row along k
        if row_lines < STREAM_RUN_LINES or per_run < row_lines:
            return 0  # short rows (a block of them is one run, but no stream measured)
        if fmas < STREAM_FMAS_PER_LINE * count * per_run:
            return 0
        # `run_lines_cost`'s lines, each row's unaligned start included, at the measured
        # price; a strided view (k columns of wider rows) drops `move_cost`'s doubling too:
        # its rows stream as whole rows do (docs/cost-model.md, "B copied into L2", first item)
        return self.move_cost(t) - self.gl_stream_hit * count * (per_run + 1)

    def run_lines_cost(self, t: TensorSpec) -> int:
        """Cost of touching every line of `t` once, a contiguous run at a time (what a
        copy's prologue pays to read it, row by row).

        In main memory each run counts one line more than its length needs: a kernel's
        arguments come from numpy (large arrays start 16 bytes past a page) or malloc, so a
        row may start anywhere in a line, and a 16-float strip of B then touches two lines
        per row, not one (docs/cost-model.md, "Unaligned rows")."""
        hit = self.hit_cost[t.level]
        if hit == 0:
            return 0
        if t.level is Level.GL:
            count, per_run = lay.runs(t.layout, t.shape, t.dtype.size)
            return hit * count * (per_run + 1)
        return hit * t.cache_lines()

    def check_spec(self, spec: LogicalSpec) -> None:
        """Reject Specs this target cannot represent (e.g. 64-byte vectors on AVX2)."""
        for i, o in enumerate(spec.operands):
            if o.vector_size is not None and o.vector_size not in self.vector_sizes(o.dtype):
                legal = ", ".join(map(str, self.vector_sizes(o.dtype))) or "none"
                raise SpecError(
                    f"operand {i}: vector size {o.vector_size} is not available for "
                    f"{o.dtype} on {self.isa} (legal: {legal})"
                )


def _max_limits(rec: Isa, tuning: Tuning) -> Limits:
    """The ISA's memory limits, with the tuning's L2 capacity where both have an L2."""
    limits = rec.max_limits
    if tuning.l2_lines is None or not rec.l2_lines:
        return limits
    return (*limits[: Level.L2], tuning.l2_lines, *limits[Level.L2 + 1 :])


def _f32_register_rows(rec: Isa, tuning: Tuning) -> tuple[int, ...]:
    """The ISA's register-tile heights plus the tuning's f32 ones, or () when the tuning
    adds none (so the enumeration need not look at the operands' dtypes)."""
    extra = tuple(r for r in tuning.f32_register_rows if r not in rec.register_rows)
    return (*rec.register_rows, *extra) if rec.vector_bytes and extra else ()


def _l2_strip_row_bytes(rec: Isa, tuning: Tuning) -> int:
    """The tuning's measured strip rows on AVX-512, where they were measured (zmm
    broadcast-FMA tiles; AMX tiles load B otherwise); else the default."""
    if tuning.l2_strip_row_bytes is None or rec.name != "avx512":
        return L2_STRIP_MAX_ROW_BYTES
    return tuning.l2_strip_row_bytes


def resolve_tune(tune: str | None, target_name: str) -> str:
    """The tuning a request means: `native` is this host's (`isa.native_tune`); None is
    `native` for the `native` target (like `-march=native`) and `generic` otherwise, so an
    explicitly named ISA gives the same kernels on every build machine."""
    if tune is None:
        tune = "native" if target_name == "native" else "generic"
    if tune == "native":
        return native_tune()
    if tune not in TUNES:
        raise SpecError(f"unknown tune {tune!r}; expected native, {', '.join(TUNES)}")
    return tune


@functools.cache
def get_target(name: str, threads: int = 1, tune: str = "generic") -> Target:
    """`amx`, `avx512`, `avx2`, `x86-64` or `native` (the best this host supports), with
    the tuning `tune` (one of `TUNES`; the scalar target has nothing to tune and is always
    `generic`). The model's constants are the ISA's record (`machine.isa.ISA`)."""
    if tune not in TUNES:
        raise SpecError(f"unknown tune {tune!r}; expected {', '.join(TUNES)}")
    isa = native_isa() if name == "native" else name
    rec = ISA.get(isa)
    if rec is None:
        raise SpecError(f"unknown target {name!r}; expected native, {', '.join(ISAS)}")
    tuning = TUNINGS[tune if rec.vector_bytes else "generic"]
    return Target(
        isa=rec.name,
        vector_bytes=rec.vector_bytes,
        max_limits=_max_limits(rec, tuning),
        hit_cost=rec.hit_cost,
        par_setup=rec.par_setup if tuning.par_setup is None else tuning.par_setup,
        par_per_iter=rec.par_per_iter if tuning.par_per_iter is None else tuning.par_per_iter,
        processors=max(1, threads),
        register_rows=rec.register_rows,
        f32_register_rows=_f32_register_rows(rec, tuning),
        strided_copy_percent=rec.strided_copy_percent,
        l2_read_hit=tuning.l2_read_hit if rec.l2_lines else None,
        gl_stream_hit=tuning.gl_stream_hit if rec.l2_lines else None,  # measured with zmm
        split_cost=tuning.split_cost,
        l2_strip_row_bytes=_l2_strip_row_bytes(rec, tuning),
        l2_copies=tuning.l2_copies and bool(rec.l2_lines),
        tune=tuning.name,
    )
