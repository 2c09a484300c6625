"""The x86 targets: AMX (AVX-512 plus tiles), AVX-512, AVX2+FMA and a portable scalar fallback.

Constants follow the published Morello model (reference notes, "X86 target"): 64-byte
lines, L1 1024 lines, GL 2^25 lines, hit cost per line L1 1 (AVX-512) / 2 (AVX2) and
GL 20, parallel-loop overhead 850000 (AVX-512) / 230000 (AVX2) + 60 per iteration.

The reference has no L2. AVX-512 (and AMX) targets add one (views of contiguous memory
only, see `ir.levels`): 16384 lines (1 MiB, the smallest L2 of the AVX-512 server cores;
this machine has 2 MiB) and a hit cost measured with a streaming vector read loop on this
CPU (8 accumulators, best of 5):

    working set        AVX-512 ns/line     AVX2 ns/line
    16-32 KiB (L1)     0.20-0.24           0.29
    256 KiB-1 MiB (L2) 0.38-0.40           0.43
    256 MiB (memory)   4.36                4.88

so L2 costs about twice an L1 line with 64-byte vectors (1 -> 2) and 1.5 times with
32-byte ones (2 -> 3); memory at 18-20x L1 matches the reference's GL 20. Without L2
the model charged every re-read of a packed B panel as main-memory traffic, so at 512^3
it picked k blocks of 128 with C re-read 4 times (0.95-0.96x of MKL) over whole-k 12x32
tiles that stream 32-column B panels from L2 (1.03-1.05x, same harness runs).

AVX2 keeps the reference's levels (L2 capacity 0): with an L2 of 3 per line the model
prefers 512^3 plans that stream A from L2 against a 32 KiB B panel in L1, which measured
0.79-0.92x of MKL against 1.00x for its L1-only plan; whole-k plans like the AVX-512 one
measured 0.97-1.02x there, so an AVX2 L2 has nothing to win until the model knows this
CPU's 48 KiB L1 (the model's L1 is 64 KiB).

`tune` picks what differs between microarchitectures of one ISA, as gcc's `-mtune` does
(`Tuning`, one per name in `TUNES`): `generic` is the model as measured on this project's
Xeon (Sapphire Rapids class). `zen4` is AMD Zen 4, whose AVX-512 runs on 256-bit units: one
`vfmadd231ps zmm` per cycle (117 GF/s at 3.65 GHz, asm loop of 16 independent FMAs), the
same flops as two ymm FMAs, and one `vdpbf16ps zmm` per cycle too, i.e. *twice* the flops
of f32 FMAs (234 GF/s counted as bf16 flops), where the Xeon retires one per 2 cycles (half
its f32 rate). So on Zen 4 a bf16 GEMM on `vdpbf16ps` register tiles (B packed in k-pairs,
`target.kernels.Dpbf16TileBf16F32`) beats widening to f32, and on the Xeon it loses; that
changes the search on the avx512 target only. `zen5` is AMD Zen 5 (family 1Ah): its
AVX-512 units are 512 bits wide (f32 FMA peak 230 GF/s with zmm, 116 with ymm, `morello
bench --peers fma-peak`), and `vdpbf16ps zmm` still retires at the FMA rate, twice the flops
(458 GF/s in the same harness; bf16 256^3 on vdpbf16ps tiles ran 423 GF/s, 92% of that,
4.4x the -O3 loop nest), so its search is zen4's; the generic f32 kernels run at 87-99% of
the FMA peak there. Unlike Zen 4 it gains from the software prefetch of the streaming
matrix-vector loop, as the Xeon does (figures at `codegen.kernels.STREAM_PREFETCH_AHEAD`).
`zen3` is AMD Zen 3 (AVX2, no AVX-512).
On Zen 3 and Zen 4 the software prefetch of the streaming matrix-vector loop, a win on the
Xeon and on Zen 5, loses (`codegen.kernels.STREAM_PREFETCH_AHEAD` has the measurements),
so their tunings turn it off: a code generation choice on every vector target. Zen 3's L1 holds
32 KiB, half the model's; an L1 of 512 lines for zen3 was tried and lost: its 512^3 plan
(32 KiB of L1 tiles) ran 0.951-0.982x of the best peer against 0.996-1.059x for the 64 KiB
plan (3 interleaved rounds, one harness run each), so the model keeps 64 KiB (the L2 behind
it serves the overflow well).

`processors` is the thread count the kernel is built for (the user's `threads`), not the
reference's fixed 16/24, because that is what an OpenMP loop in our kernels really uses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from morello_build.errors import SpecError
from morello_build.ir.dtypes import Dtype
from morello_build.ir.limits import Limits
from morello_build.ir.spec import LogicalSpec
from morello_build.ir.tensorspec import TensorSpec
from morello_build.machine.isa import ISA, ISAS, native_isa, native_tune


@dataclass(frozen=True)
class Tuning:
    """What one microarchitecture changes of an ISA's model and code (see the module doc)."""

    name: str
    #: `vdpbf16ps zmm` retires at the f32 FMA rate: bf16 GEMMs on vdpbf16ps register tiles
    #: (the search changes; avx512 only).
    fast_dpbf16: bool = False
    #: The streaming matrix-vector loop prefetches B rows ahead in software (code only).
    stream_prefetch: bool = True


#: Tunings by name, the default first.
TUNINGS: dict[str, Tuning] = {
    t.name: t
    for t in (
        Tuning("generic"),
        Tuning("zen3", stream_prefetch=False),
        Tuning("zen4", fast_dpbf16=True, stream_prefetch=False),
        Tuning("zen5", fast_dpbf16=True),
    )
}
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
    #: Extra register-tile heights of Matmul tilings (`Isa.register_rows`).
    register_rows: tuple[int, ...] = ()
    tune: str = "generic"  # one of TUNES: microarchitecture constants (see the module doc)

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
        return max(self.vector_sizes(dtype), default=1)

    def move_cost(self, t: TensorSpec) -> int:
        """Cost of touching every line of `t` once; doubled when it is not contiguous."""
        hit = self.hit_cost[t.level]
        if hit == 0:
            return 0
        c = hit * t.cache_lines()
        return c if t.is_contiguous else 2 * c

    def check_spec(self, spec: LogicalSpec) -> None:
        """Reject Specs this target cannot represent (e.g. 64-byte vectors on AVX2)."""
        for i, o in enumerate(spec.operands):
            if o.vector_size is not None and o.vector_size not in self.vector_sizes(o.dtype):
                legal = ", ".join(map(str, self.vector_sizes(o.dtype))) or "none"
                raise SpecError(
                    f"operand {i}: vector size {o.vector_size} is not available for "
                    f"{o.dtype} on {self.isa} (legal: {legal})"
                )


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
    return Target(
        isa=rec.name,
        vector_bytes=rec.vector_bytes,
        max_limits=rec.max_limits,
        hit_cost=rec.hit_cost,
        par_setup=rec.par_setup,
        par_per_iter=rec.par_per_iter,
        processors=max(1, threads),
        register_rows=rec.register_rows,
        tune=tune if rec.vector_bytes else "generic",
    )
