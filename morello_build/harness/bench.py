"""Time a generated kernel against peer libraries in one C harness.

Why one harness: timings taken in different processes (or languages) differ by page
placement, frequency ramps and call overhead. Here the kernel and every peer are linked into
one executable, read the same 64-byte-aligned input buffers and are timed round-robin
(the starting implementation rotates each round), so slow drifts hit them all alike.

Protocol, per implementation: `WARMUP_SECONDS` of untimed calls (caches, page mappings,
lazy library initialization, clock ramp); then the calibration doubles the repetition
count until a timed block lasts a quarter of `SAMPLE_SECONDS`, scales it so one sample
lasts about `SAMPLE_SECONDS`, re-measures once and rescales. Then
``max(MIN_SAMPLES, min_time / SAMPLE_SECONDS)`` rounds each time one sample of every
implementation with ``clock_gettime(CLOCK_MONOTONIC)``. A sample gives seconds per call; we
report the median and the best. GFLOP/s uses `KernelABI.flops`.

Before timing, the harness runs every implementation once from the same initial output and
writes the results; they are checked against the numpy reference with the tolerance of
`morello_build.harness.verify`. A peer that disagrees is reported as skipped ("wrong result"), and a
morello kernel that disagrees is an error: comparing wrong answers is worthless.

With ``threads=1`` the harness pins itself to one CPU and sets every library to one thread
(openblas_set_num_threads, MKL's sequential threading layer, OMP/MKL/OPENBLAS env vars).
With more threads, MKL runs on GNU OpenMP (one runtime shared with OpenMP kernels) and
thread pools spin only briefly after a call, since implementations alternate. The naive peer is always single-threaded.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.codegen.context import HELPERS
from morello_build.errors import MorelloError
from morello_build.harness.compile import (
    Compiler,
    compile_object,
    find_compiler,
    link,
    write_sources,
)
from morello_build.harness.peers import PEER_ISAS, PeerLib, find_mkl, find_openblas
from morello_build.harness.verify import (
    STORAGE,
    IsaUnavailable,
    compare_output,
    decode,
    from_physical,
    kernel_files,
    random_logical,
    reference_output,
    sentinel_fill,
    to_physical,
)
from morello_build.machine.isa import ISA_FLAGS, host_supports, native_isa
from morello_build.machine.target import tune_note

__all__ = [
    "ALL_PEERS",
    "REFERENCES",
    "STREAM_READ",
    "BenchError",
    "BenchReport",
    "ImplResult",
    "bench_kernel",
]

#: Peers benchmarked when `peers=None`, in table order.
ALL_PEERS: tuple[str, ...] = ("openblas", "mkl", "mkl-jit", "naive")
#: Reference loops that are timed like peers but compute nothing to compare: a plain
#: streaming read of a Matmul's rhs (B), the bandwidth bound of a matrix-vector product.
#: Timed in the same harness, it meets the same cache state as the kernel (a peer that
#: evicts B from L3 between samples slows both alike). Never the "best peer".
STREAM_READ = "stream-read"
#: The other reference: independent register FMAs of the kernel's ISA (the widest vectors
#: its flags allow) on `threads` threads, i.e. the compute peak, timed round-robin with the
#: kernel. A peak measured once, apart from the kernels, drifts with a VM's clock: on the
#: Zen 3 VM a separate best-of-7 read 88 GF/s in a run whose 64^3 kernel ran 94.6 GF/s.
#: Its GFLOP/s count its own FMAs, not the kernel's flops.
FMA_PEAK = "fma-peak"
#: The AMX counterpart of `FMA_PEAK` for the amx target: 4 independent `tdpbf16ps` tile
#: products (16x16 f32 += 16x32 bf16 . 32x16 bf16) per iteration, on `threads` threads.
#: The peers script measured it once, apart (3840 GF/s on the Xeon), so the amx rows' share
#: of it moved with the VM's clock (the same kernel read 46% and 39% in two runs).
AMX_PEAK = "amx-peak"
COMPUTE_PEAKS: tuple[str, ...] = (FMA_PEAK, AMX_PEAK)
REFERENCES: tuple[str, ...] = (STREAM_READ, *COMPUTE_PEAKS)
MORELLO = "morello-build"
#: A threaded kernel's one-thread counterpart (the same Spec synthesized for one thread),
#: timed in the same harness so that the scaling is a ratio of interleaved samples: on a
#: VM whose speed swings by 25%, rows measured minutes apart cannot show 1.8x from 1.7x.
ONE_THREAD = "morello-build@1"
SAMPLE_SECONDS = 0.015  # one timed sample lasts about this long
MIN_SAMPLES = 5
WARMUP_SECONDS = 0.05  # untimed calls per implementation before calibration

_ROW_MAJOR, _COL_MAJOR, _NO_TRANS, _TRANS = 101, 102, 111, 112


class BenchError(MorelloError):
    """The benchmark could not run, or the morello kernel computed a wrong result."""


@dataclass(frozen=True)
class ImplResult:
    """Timing of one implementation, or the reason it was not timed."""

    name: str
    seconds: float = math.nan  # median seconds per call
    seconds_best: float = math.nan
    gflops: float = math.nan  # at the median time
    gflops_best: float = math.nan
    samples: int = 0
    reps: int = 0  # calls per sample
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"name": self.name, "skipped": self.skipped}
        return {
            "name": self.name,
            "gflops": self.gflops,
            "gflops_best": self.gflops_best,
            "seconds": self.seconds,
            "seconds_best": self.seconds_best,
            "samples": self.samples,
            "reps": self.reps,
        }


#: Peers held to a kernel's instruction set when it is older than the host's best: a kernel built
#: for AVX2 machines is compared with the BLAS those machines would run, not with this
#: host's AVX-512 code paths. Environment for the peer libraries, flags for the naive loop.
#: (For a kernel of the host's own ISA only the OpenBLAS core is taken: `_peer_isa_settings`.)
PEER_ISA_LIMITS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    # AVX-512 with BF16 but without AMX (MKL's AVX512_E3 = Cooper Lake): on an AMX host,
    # MKL's bf16 GEMM would otherwise run on the tile unit, which avx512 machines lack.
    "avx512": (
        {"MKL_ENABLE_INSTRUCTIONS": "AVX512_E3", "OPENBLAS_CORETYPE": "CooperLake"},
        ("-march=cooperlake",),
    ),
    "avx2": (
        {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "OPENBLAS_CORETYPE": "Haswell"},
        ("-march=haswell",),
    ),
    "x86-64": (
        {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OPENBLAS_CORETYPE": "Nehalem"},
        ("-march=x86-64",),
    ),
}


_HOST_NAIVE_FLAGS = ("-march=native",)


def _peer_isa_settings(isa: str, peer_isa: str) -> tuple[dict[str, str], tuple[str, ...]]:
    """Environment for the peer libraries and flags for the naive loop nest that hold the
    peers to the ISA `isa` (`peer_isa == "kernel"`) or leave them this host's (`"host"`).

    A kernel older than the host meets all of `PEER_ISA_LIMITS`. A kernel for the host's
    own ISA still pins OpenBLAS to that ISA's core: OpenBLAS picks its kernels by CPU
    model, and on a CPU it does not know falls back to older ones (0.3.34 on AMD Zen 5,
    family 1Ah, picks Haswell: AVX2 on an AVX-512 core; f32 512^3 ran 104.8 GF/s on those
    against 199.5 on its CooperLake kernels, one harness run each)."""
    if peer_isa != "kernel" or isa not in PEER_ISA_LIMITS:
        return {}, _HOST_NAIVE_FLAGS
    limit_env, naive_flags = PEER_ISA_LIMITS[isa]
    if native_isa() != isa:
        return dict(limit_env), naive_flags
    return {"OPENBLAS_CORETYPE": limit_env["OPENBLAS_CORETYPE"]}, _HOST_NAIVE_FLAGS


@dataclass(frozen=True)
class BenchReport:
    """All results of one benchmark run; `ratio` > 1 means morello beats the best peer."""

    spec: str
    kernel: str
    target: str
    threads: int
    flops: int
    compiler: str
    results: tuple[ImplResult, ...]
    best_peer: str | None
    ratio: float | None  # best peer median seconds / morello median seconds
    peer_limit: str = ""  # how the peers were held to the kernel's ISA ("" = not at all)
    tune: str = "generic"  # the kernel's tuning (`GeneratedKernel.tune`)

    def result(self, name: str) -> ImplResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "kernel": self.kernel,
            "target": self.target,
            "tune": self.tune,
            "threads": self.threads,
            "flops": self.flops,
            "compiler": self.compiler,
            "results": [r.to_json() for r in self.results],
            "best_peer": self.best_peer,
            "ratio": self.ratio,
            "peer_limit": self.peer_limit,
            "scaling": self.scaling,
        }

    def format_table(self) -> str:
        lines = [
            f"spec: {self.spec}",
            f"kernel {self.kernel}, target {self.target}{tune_note(self.tune)}, "
            f"{self.threads} thread(s), "
            f"{self.flops} flop/call, {self.compiler}",
            f"peers: {self.peer_limit or 'all of this host'}",
            f"{'implementation':<16}{'GFLOP/s med':>12}{'GFLOP/s best':>13}{'us/call med':>13}"
            f"{'samples':>9}",
        ]
        for r in self.results:
            if r.skipped is not None:
                lines.append(f"{r.name:<16}skipped: {r.skipped}")
            else:
                lines.append(
                    f"{r.name:<16}{r.gflops:>12.2f}{r.gflops_best:>13.2f}"
                    f"{r.seconds * 1e6:>13.4g}{r.samples:>9d}"
                )
        if self.best_peer is not None and self.ratio is not None:
            lines.append(f"morello-build / best peer ({self.best_peer}): {self.ratio:.3f}x")
        else:
            lines.append("no peer could be timed")
        if self.scaling is not None:
            lines.append(
                f"morello-build / {ONE_THREAD} (its one-thread kernel, timed beside it): "
                f"{self.scaling:.3f}x on {self.threads} threads"
            )
        for name, what in _REFERENCE_LINES.items():
            share = self.share_of(name)
            if share is not None:
                lines.append(f"morello-build / {name}: {share:.0%} of {what}")
        return "\n".join(lines)

    def _timed_pair(self, name: str) -> tuple[ImplResult, ImplResult] | None:
        """(the kernel's result, `name`'s) when both were timed, else None."""
        other = next((r for r in self.results if r.name == name), None)
        if other is None or other.skipped is not None or self.results[0].skipped is not None:
            return None
        return self.results[0], other

    @property
    def scaling(self) -> float | None:
        """The threaded kernel's speed over its one-thread kernel's, timed side by side
        (`bench_kernel(one_thread=...)`), or None."""
        pair = self._timed_pair(ONE_THREAD)
        return pair[1].seconds / pair[0].seconds if pair else None

    def share_of(self, reference: str) -> float | None:
        """The kernel's GFLOP/s over a timed reference's (`FMA_PEAK`, `AMX_PEAK`: the
        fraction of the compute peak; `STREAM_READ`: of the bandwidth bound), or None if it
        was not timed."""
        pair = self._timed_pair(reference)
        if pair is None:
            return None
        mine, ref = pair
        if reference == STREAM_READ:  # same bytes of B per call: a ratio of times
            return ref.seconds / mine.seconds
        return mine.gflops / ref.gflops


# --------------------------------------------------------------------------- layouts


def _strides(op: OperandABI) -> list[int]:
    """Element stride of each logical dim of a dense buffer stored in `op.order`."""
    strides = [0] * len(op.shape)
    step = 1
    for d in reversed(op.order):
        strides[d] = step
        step *= op.shape[d]
    return strides


@dataclass(frozen=True)
class _Gemm:
    """A matmul expressed as `batch` CBLAS calls (pointers advance by the batch strides)."""

    batch: int
    m: int
    n: int
    k: int
    layout: int
    trans_a: int
    trans_b: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int


def _gemm_operand(rows: int, cols: int, s_row: int, s_col: int, layout: int) -> tuple[int, int]:
    """(trans, ld) for a rows x cols operand with these strides, or ValueError."""
    unit_col = cols == 1 or s_col == 1
    unit_row = rows == 1 or s_row == 1
    # In row-major CBLAS, NoTrans wants unit column stride; column-major is the mirror.
    direct, transposed = (unit_col, unit_row) if layout == _ROW_MAJOR else (unit_row, unit_col)
    if direct:
        ld = (
            (s_row if rows > 1 else cols) if layout == _ROW_MAJOR else (s_col if cols > 1 else rows)
        )
        need = cols if layout == _ROW_MAJOR else rows
        if ld >= max(1, need):
            return _NO_TRANS, ld
    if transposed:
        ld = (
            (s_col if cols > 1 else rows) if layout == _ROW_MAJOR else (s_row if rows > 1 else cols)
        )
        need = rows if layout == _ROW_MAJOR else cols
        if ld >= max(1, need):
            return _TRANS, ld
    raise ValueError("operand layout has no unit stride within a matrix")


def _gemm_plan(abi: KernelABI) -> _Gemm:
    """Map the operand layouts onto CBLAS arguments; ValueError if BLAS cannot express it."""
    lhs, rhs, out = abi.operands
    rank = len(out.shape)
    if rank not in (2, 3):
        raise ValueError(f"rank-{rank} matmul has no BLAS equivalent")
    sa, sb, sc = _strides(lhs), _strides(rhs), _strides(out)
    batch = out.shape[0] if rank == 3 else 1
    m, k, n = lhs.shape[-2], lhs.shape[-1], rhs.shape[-1]
    c_row, c_col = sc[-2], sc[-1]
    if n == 1 or c_col == 1:
        layout, ldc = _ROW_MAJOR, (c_row if m > 1 else n)
    elif m == 1 or c_row == 1:
        layout, ldc = _COL_MAJOR, (c_col if n > 1 else m)
    else:
        raise ValueError("output has no unit stride within a matrix")
    ta, lda = _gemm_operand(m, k, sa[-2], sa[-1], layout)
    tb, ldb = _gemm_operand(k, n, sb[-2], sb[-1], layout)
    bs = (sa[0], sb[0], sc[0]) if rank == 3 else (0, 0, 0)
    return _Gemm(batch, m, n, k, layout, ta, tb, lda, ldb, max(ldc, 1), *bs)


# --------------------------------------------------------------------------- C generation


def _c_call_args(abi: KernelABI, buf: str = "buf") -> str:
    return ", ".join(
        f"({'const ' if op.is_input else ''}{op.c_type} *){buf}[{i}]"
        for i, op in enumerate(abi.operands)
    )


_BF16_HELPERS = """
static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}
static inline uint16_t f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}
"""


def _naive_source(abi: KernelABI, fn: str) -> str:
    """A plain loop nest for `abi` (the "naive" peer), compiled -O3 -march=native.

    Locals are prefixed `mb_` so they cannot shadow operand names.
    """
    proto = replace(abi, name=fn).prototype()
    ops = abi.operands

    def idx(op: OperandABI, names: Sequence[str]) -> str:
        return " + ".join(f"{v} * {s}L" for v, s in zip(names, _strides(op), strict=True)) or "0"

    def load(op: OperandABI, expr: str) -> str:
        return f"bf16_to_f32({expr})" if op.dtype == "bf16" else expr

    if abi.op == "matmul":
        lhs, rhs, out = ops
        rank = len(out.shape)
        bnames = ["mb_b"] if rank == 3 else []
        batch = out.shape[0] if rank == 3 else 1
        m, k, n = lhs.shape[-2], lhs.shape[-1], rhs.shape[-1]
        acc_t = out.c_type
        oi = idx(out, [*bnames, "mb_i", "mb_j"])
        c = out.name
        a_load = load(lhs, f"{lhs.name}[{idx(lhs, [*bnames, 'mb_i', 'mb_k'])}]")
        b_load = load(rhs, f"{rhs.name}[{idx(rhs, [*bnames, 'mb_k', 'mb_j'])}]")
        zero = "" if abi.accumulate else f"for (long mb_j = 0; mb_j < {n}; mb_j++) {c}[{oi}] = 0;"
        batch_loop = f"for (long mb_b = 0; mb_b < {batch}; mb_b++)" if rank == 3 else ""
        body = f"""    {batch_loop}
        for (long mb_i = 0; mb_i < {m}; mb_i++) {{
            {zero}
            for (long mb_k = 0; mb_k < {k}; mb_k++) {{
                const {acc_t} mb_a = ({acc_t}){a_load};
                for (long mb_j = 0; mb_j < {n}; mb_j++) {c}[{oi}] += mb_a * ({acc_t}){b_load};
            }}
        }}"""
    elif abi.op == "zero":
        (out,) = ops
        body = (
            f"    for (long mb_t = 0; mb_t < {math.prod(out.shape)}L; mb_t++) {out.name}[mb_t] = 0;"
        )
    elif abi.op == "move":
        src, dst = ops
        names = [f"mb_i{d}" for d in range(len(src.shape))]
        loops = "".join(
            f"{'    ' * (d + 1)}for (long mb_i{d} = 0; mb_i{d} < {src.shape[d]}; mb_i{d}++)\n"
            for d in range(len(src.shape))
        )
        value = load(src, f"{src.name}[{idx(src, names)}]")
        if dst.dtype == "bf16" and src.dtype != "bf16":
            value = f"f32_to_bf16((float){value})"
        else:
            value = f"({dst.c_type}){value}"
        body = f"{loops}{'    ' * (len(names) + 1)}{dst.name}[{idx(dst, names)}] = {value};"
    else:
        raise ValueError(f"unknown op {abi.op!r}")
    return f"#include <stdint.h>\n{_BF16_HELPERS}\n{proto} {{\n{body}\n}}\n"


#: The streaming-read reference: 4 independent vector sums over a buffer (the widest
#: vectors the flags allow), compiled like the naive peer.
_STREAM_SOURCE = r"""
#include <string.h>
#if defined(__AVX512F__)
typedef float mb_v __attribute__((vector_size(64)));
#else
typedef float mb_v __attribute__((vector_size(32)));
#endif
float morello_bench_stream(const void *buf, long bytes);
float morello_bench_stream(const void *buf, long bytes) {
    const char *p = buf;
    mb_v s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    long i = 0;
    for (; i + 4 * (long)sizeof(mb_v) <= bytes; i += 4 * (long)sizeof(mb_v)) {
        mb_v x0, x1, x2, x3;
        memcpy(&x0, p + i, sizeof x0);
        memcpy(&x1, p + i + sizeof(mb_v), sizeof x1);
        memcpy(&x2, p + i + 2 * sizeof(mb_v), sizeof x2);
        memcpy(&x3, p + i + 3 * sizeof(mb_v), sizeof x3);
        s0 += x0; s1 += x1; s2 += x2; s3 += x3;
    }
    s0 += s1 + s2 + s3;
    float t = 0;
    for (unsigned j = 0; j < sizeof(mb_v) / sizeof(float); j++) t += s0[j];
    for (; i < bytes; i++) t += (float)p[i];
    return t;
}
"""


#: What `format_table` calls each reference when it prints the kernel's share of it.
_REFERENCE_LINES = {
    FMA_PEAK: "the register FMA peak timed beside it",
    AMX_PEAK: "the AMX tile peak timed beside it",
    STREAM_READ: "the speed of a streaming read of B",
}

#: Register FMAs per loop iteration and f32 lanes, by the vectors the kernel's flags allow:
#: enough independent accumulators to cover FMA latency x FMA units (24 zmm: Xeon 4 cycles
#: x 2 units; 12 ymm: Zen 3 4 x 2 with room to spare).
_FMA_SHAPE = {"avx512": (24, 16), "amx": (24, 16), "avx2": (12, 8)}
#: Fewest loop iterations per call of the FMA reference (per thread): ~25k cycles, so a
#: call's overhead (and a parallel region's start) stays small beside it for tiny kernels.
_FMA_MIN_ITERS = 4096


def _fma_source(isa: str) -> str:
    """C of the FMA reference for `isa`: each call runs `iters` iterations of independent
    register FMAs on `threads` threads. The loop is one asm statement that first zeroes its
    registers, so no compiler choice and no denormal input can change what is timed."""
    n, lanes = _FMA_SHAPE[isa]
    reg, a, b, clear = ("zmm", 30, 31, "vpxord") if lanes == 16 else ("ymm", 14, 15, "vxorps")
    regs = [*range(n), a, b]
    lines = [f"{clear} %%{reg}{r}, %%{reg}{r}, %%{reg}{r}" for r in regs]
    lines.append("1:")
    lines += [f"vfmadd231ps %%{reg}{a}, %%{reg}{b}, %%{reg}{i}" for i in range(n)]
    lines += ["dec %0", "jnz 1b", "vzeroupper"]
    asm = "\n".join(f'            "{line}\\n"' for line in lines)
    clobbers = ", ".join(f'"xmm{r}"' for r in regs)
    return f"""void morello_bench_fma(long iters, int threads);
void morello_bench_fma(long iters, int threads) {{
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {{
        long left = iters;
        __asm__ volatile(
{asm}
            : "+r"(left) : : {clobbers}, "cc");
    }}
}}
"""


#: Flops of one iteration of the AMX reference: 4 tile products of 16x16x32 multiply-adds.
_AMX_ITER_FLOPS = 4 * 16 * 16 * 32 * 2
#: Fewest iterations per call: ~25k cycles at one tile product per 16 cycles.
_AMX_MIN_ITERS = 400


def _amx_source() -> str:
    """C of the AMX reference: each thread asks for tile data, loads the kernels' tile
    configuration, fills its two A and two B tiles with zeros (no denormals) and runs
    `iters` iterations of 4 independent `tdpbf16ps` into 4 accumulator tiles."""
    return (
        "#include <immintrin.h>\n#include <stdio.h>\n#include <stdlib.h>\n"
        + HELPERS["amx"]
        + """void morello_bench_amx(long iters, int threads);
void morello_bench_amx(long iters, int threads) {
    (void)threads;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        static const unsigned short zero[512] __attribute__((aligned(64)));
        mb_amx_enable();
        _tile_loadconfig(mb_amx_cfg);
        _tile_loadd(4, zero, 64); _tile_loadd(5, zero, 64);
        _tile_loadd(6, zero, 64); _tile_loadd(7, zero, 64);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (long i = 0; i < iters; i++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        _tile_release();
    }
}
"""
    )


def _reference_iters(name: str, isa: str, flops: int, threads: int) -> tuple[int, int]:
    """(iterations per thread, flops per call) of the compute reference `name` beside a
    kernel of `flops`: about the kernel's work, at least ~25k cycles per call (so a tiny
    kernel's reference does not measure call overhead or a parallel region's start)."""
    if name == AMX_PEAK:
        per_iter, least = _AMX_ITER_FLOPS, _AMX_MIN_ITERS
    else:
        n, lanes = _FMA_SHAPE[isa]
        per_iter, least = n * lanes * 2, _FMA_MIN_ITERS
    iters = max(least, -(-flops // (per_iter * threads)))  # >= 1: the loops are do-while
    return iters, iters * per_iter * threads


def _compute_peak_source(name: str, isa: str) -> tuple[str, str | None]:
    """The C function of compute reference `name` and, if a kernel of `isa` cannot have
    it, why."""
    if name == AMX_PEAK:
        why = None if isa == "amx" else f"AMX tile products need the amx target, not {isa}"
        return "morello_bench_amx", why
    why = None if isa in _FMA_SHAPE else f"the kernel's ISA ({isa}) has no vector FMA"
    return "morello_bench_fma", why


@dataclass(frozen=True)
class _Impl:
    name: str
    code: str  # C statements of `static void run_<i>(void)`
    decls: str = ""  # file-scope declarations
    setup: str = ""  # statements in setup(); may set `impls[IDX].skip`
    reference: bool = False  # timed, but its output is not checked (see REFERENCES)


def _blas_impl(name: str, fn: str, abi: KernelABI, plan: _Gemm, elem: str) -> _Impl:
    beta = "1.0f" if abi.accumulate else "0.0f"
    decl = (
        f"void {fn}(int, int, int, int, int, int, float, const {elem} *, int, "
        f"const {elem} *, int, float, float *, int);"
    )
    code = f"""    for (long bb = 0; bb < {plan.batch}; bb++)
        {fn}({plan.layout}, {plan.trans_a}, {plan.trans_b}, {plan.m}, {plan.n}, {plan.k}, 1.0f,
             (const {elem} *)buf[0] + bb * {plan.stride_a}L, {plan.lda},
             (const {elem} *)buf[1] + bb * {plan.stride_b}L, {plan.ldb}, {beta},
             (float *)buf[2] + bb * {plan.stride_c}L, {plan.ldc});"""
    return _Impl(name, code, decl)


def _plan_peers(
    abi: KernelABI, wanted: Sequence[str], threads: int
) -> tuple[list[_Impl], dict[str, str], list[PeerLib], str]:
    """Implementations to build, skip reasons for the rest, libraries to link, thread setup."""
    impls: list[_Impl] = []
    skipped: dict[str, str] = {}
    libs: list[PeerLib] = []
    thread_setup = ""
    plan: _Gemm | None = None
    blas_reason = ""
    elem = ""
    if abi.op != "matmul":
        blas_reason = f"no BLAS routine for op {abi.op!r}"
    else:
        lhs, rhs, out = abi.operands
        dts = (lhs.dtype, rhs.dtype, out.dtype)
        if dts == ("f32", "f32", "f32"):
            elem = "float"
        elif dts == ("bf16", "bf16", "f32"):
            elem = "uint16_t"
        else:
            blas_reason = f"no BLAS gemm for {lhs.dtype} x {rhs.dtype} -> {out.dtype}"
        try:
            plan = _gemm_plan(abi)
        except ValueError as exc:
            blas_reason = blas_reason or f"layout not expressible in BLAS: {exc}"
    bf16 = elem == "uint16_t"

    for name in wanted:
        if name == "naive":
            if abi.op == "matmul" and abi.operands[2].dtype == "bf16":
                skipped[name] = "naive loop nest does not accumulate into bf16"
            else:
                impls.append(_Impl(name, f"    morello_bench_naive({_c_call_args(abi)});"))
            continue
        if name == STREAM_READ:
            if abi.op != "matmul":
                skipped[name] = "a streaming read of B needs a matmul"
            else:
                impls.append(
                    _Impl(
                        name,
                        "    morello_bench_sink += morello_bench_stream(buf[1], (long)nbytes[1]);",
                        "float morello_bench_stream(const void *, long);\n"
                        "static volatile float morello_bench_sink;",
                        reference=True,
                    )
                )
            continue
        if name in COMPUTE_PEAKS:
            fn, why_not = _compute_peak_source(name, abi.isa)
            if why_not:
                skipped[name] = why_not
            else:
                iters, _ = _reference_iters(name, abi.isa, abi.flops, threads)
                impls.append(
                    _Impl(
                        name,
                        f"    {fn}({iters}L, {threads});",
                        f"void {fn}(long, int);",
                        reference=True,
                    )
                )
            continue
        if name not in ("openblas", "mkl", "mkl-jit"):
            known = ", ".join((*ALL_PEERS, *REFERENCES))
            skipped[name] = f"unknown peer {name!r} (known: {known})"
            continue
        lib = find_openblas() if name == "openblas" else find_mkl()
        if not lib.available:
            skipped[name] = lib.reason
            continue
        if blas_reason or plan is None:
            skipped[name] = blas_reason
            continue
        if name == "openblas":
            sym = lib.symbol("sbgemm" if bf16 else "sgemm")
            if sym is None:
                skipped[name] = "this OpenBLAS build exports no cblas_sbgemm (bf16 gemm)"
                continue
            impls.append(_blas_impl(name, sym, abi, plan, elem))
            setter = lib.symbol("set_num_threads")
            if setter:
                thread_setup += f"    {{ void {setter}(int); {setter}(threads); }}\n"
        elif name == "mkl":
            sym = lib.symbol("gemm_bf16" if bf16 else "sgemm")
            if sym is None:
                skipped[name] = "this MKL exports no cblas_gemm_bf16bf16f32"
                continue
            impls.append(_blas_impl(name, sym, abi, plan, elem))
        else:  # mkl-jit
            roles = ("jit_create_sgemm", "jit_get_sgemm_ptr")
            if bf16:
                skipped[name] = "MKL JIT has no bf16 gemm"
                continue
            if any(lib.symbol(r) is None for r in roles):
                skipped[name] = "this MKL exports no mkl_jit_create_sgemm"
                continue
            beta = "1.0f" if abi.accumulate else "0.0f"
            create, get = (lib.symbol(r) for r in roles)
            decls = (
                "typedef void (*jit_sgemm_fn)(void *, float *, float *, float *);\n"
                f"int {create}(void **, int, int, int, int, int, int, float, int, int, float, int);\n"
                f"jit_sgemm_fn {get}(const void *);\n"
                "static void *jitter;\nstatic jit_sgemm_fn jit_fn;"
            )
            setup = f"""    {{
        int st = {create}(&jitter, {plan.layout}, {plan.trans_a}, {plan.trans_b}, {plan.m},
                          {plan.n}, {plan.k}, 1.0f, {plan.lda}, {plan.ldb}, {beta}, {plan.ldc});
        if (st == 1)
            impls[IDX].skip = "MKL JIT declined this shape (MKL_NO_JIT: it would call plain sgemm)";
        else if (st != 0)
            impls[IDX].skip = "mkl_jit_create_sgemm failed (MKL_JIT_ERROR)";
        else
            jit_fn = {get}(jitter);
    }}
"""
            code = f"""    for (long bb = 0; bb < {plan.batch}; bb++)
        jit_fn(jitter, (float *)buf[0] + bb * {plan.stride_a}L, (float *)buf[1] + bb * {plan.stride_b}L,
               (float *)buf[2] + bb * {plan.stride_c}L);"""
            impls.append(_Impl(name, code, decls, setup))
        if lib not in libs:
            libs.append(lib)
            if lib.name == "mkl":
                layer = lib.symbol("set_threading_layer")
                nthr = lib.symbol("set_num_threads")
                if layer:
                    thread_setup += f"    {{ int {layer}(int); {layer}(threads == 1 ? 1 : 3); }}\n"
                if nthr:
                    thread_setup += f"    {{ void {nthr}(int); {nthr}(threads); }}\n"
    return impls, skipped, libs, thread_setup


_MAIN = r"""
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *alloc64(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    memset(p, 0, rounded ? rounded : 64);
    return p;
}

static void *load(const char *dir, const char *file, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    void *p = alloc64(bytes);
    FILE *f = fopen(path, "rb");
    if (!f || fread(p, 1, bytes, f) != bytes) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
    return p;
}

static void save(const char *dir, const char *name, const void *p, size_t bytes) {
    char path[4096];
    snprintf(path, sizeof path, "%s/out_%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}

static double time_block(int i, long reps) {
    double t0 = now();
    for (long r = 0; r < reps; r++) impls[i].run();
    return now() - t0;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: harness check|time DIR THREADS [SAMPLE_S MIN_TIME NAMES...]\n"); return 2; }
    const char *dir = argv[2];
    int threads = atoi(argv[3]);
    char file[64];
    for (int i = 0; i < N_OPERANDS; i++) {
        snprintf(file, sizeof file, "in_%d.bin", i);
        buf[i] = i == OUT_INDEX ? alloc64(nbytes[i]) : load(dir, file, nbytes[i]);
    }
    void *init_out = load(dir, "init.bin", nbytes[OUT_INDEX]);
    if (threads == 1) {
        cpu_set_t set;
        CPU_ZERO(&set);
        int cpu = sched_getcpu();
        CPU_SET(cpu < 0 ? 0 : cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    setup(threads);
    if (strcmp(argv[1], "check") == 0) {
        for (int i = 0; i < N_IMPLS; i++) {
            if (impls[i].skip) { printf("skip %s %s\n", impls[i].name, impls[i].skip); continue; }
            if (impls[i].reference) { impls[i].run(); printf("reference %s\n", impls[i].name); continue; }
            memcpy(buf[OUT_INDEX], init_out, nbytes[OUT_INDEX]);
            impls[i].run();
            save(dir, impls[i].name, buf[OUT_INDEX], nbytes[OUT_INDEX]);
            printf("checked %s\n", impls[i].name);
        }
        return 0;
    }
    if (argc < 6) { fprintf(stderr, "time needs SAMPLE_S MIN_TIME NAMES...\n"); return 2; }
    double sample_s = atof(argv[4]), min_time = atof(argv[5]);
    int sel[N_IMPLS + 1], nsel = 0;
    for (int a = 6; a < argc; a++)
        for (int i = 0; i < N_IMPLS; i++)
            if (strcmp(argv[a], impls[i].name) == 0 && !impls[i].skip) sel[nsel++] = i;
    /* Accumulating kernels keep adding into the output; others overwrite it. */
    if (ACCUMULATE) memcpy(buf[OUT_INDEX], init_out, nbytes[OUT_INDEX]);
    else memset(buf[OUT_INDEX], 0, nbytes[OUT_INDEX]);
    long reps[N_IMPLS + 1];
    for (int s = 0; s < nsel; s++) {
        int i = sel[s];
        /* Warm-up: caches, page mappings, lazy library init and the clock ramp. */
        double t0 = now();
        for (int w = 0; w < 2 || now() - t0 < WARMUP_SECONDS; w++) impls[i].run();
        long r = 1;
        double t = time_block(i, r);
        while (t < sample_s / 4 && r < (1L << 40)) { r *= 2; t = time_block(i, r); }
        for (int pass = 0; pass < 2; pass++) { /* rescale, then re-measure once */
            long scaled = (long)ceil((double)r * sample_s / (t > 0 ? t : 1e-9));
            r = scaled < 1 ? 1 : scaled;
            if (pass == 0) t = time_block(i, r);
        }
        reps[s] = r;
        printf("reps %s %ld\n", impls[i].name, reps[s]);
    }
    long nsamples = (long)ceil(min_time / sample_s);
    if (nsamples < MIN_SAMPLES) nsamples = MIN_SAMPLES;
    if (nsamples > 100000) nsamples = 100000;
    for (long round = 0; round < nsamples; round++)
        for (int q = 0; q < nsel; q++) {
            int s = (int)((round + q) % nsel);
            double t = time_block(sel[s], reps[s]);
            printf("sample %s %.9e\n", impls[sel[s]].name, t / (double)reps[s]);
        }
    fflush(stdout);
    return 0;
}
"""


def _harness_source(
    abi: KernelABI, impls: Sequence[_Impl], thread_setup: str, one_thread: bool = False
) -> str:
    out_index = next(i for i, op in enumerate(abi.operands) if not op.is_input)
    nbytes = ", ".join(
        f"{math.prod(op.shape) * np.dtype(STORAGE[op.dtype]).itemsize}UL" for op in abi.operands
    )
    parts = [
        "#define _GNU_SOURCE",
        "#include <math.h>",
        "#include <sched.h>",
        "#include <stdint.h>",
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "#include <string.h>",
        "#include <time.h>",
        "",
        "/* Peer prototypes are declared here, not via cblas.h: OpenBLAS' and MKL's headers clash. */",
        replace(abi, name="morello_bench_naive").prototype() + ";",
        f"#define N_OPERANDS {len(abi.operands)}",
        f"#define OUT_INDEX {out_index}",
        f"#define ACCUMULATE {1 if (abi.op == 'matmul' and abi.accumulate) else 0}",
        f"#define MIN_SAMPLES {MIN_SAMPLES}",
        f"#define WARMUP_SECONDS {WARMUP_SECONDS!r}",
        f"static const size_t nbytes[N_OPERANDS] = {{{nbytes}}};",
        # Exported so that morello_bench_call.c can read it; `buf` is what the code here uses.
        "void *morello_bench_buf[N_OPERANDS];",
        "static void **const buf = morello_bench_buf;",
        "struct impl { const char *name; void (*run)(void); const char *skip; int reference; };",
    ]
    # The kernel's run function lives in morello_bench_call.c so that its header never meets
    # the libc headers here (a kernel may be named like a libc function, e.g. `bzero`). It is
    # the table entry itself, not called from a run_0 here: every implementation is then one
    # indirect call away from the timing loop. An extra hop cost the 8x8x8 avx2 kernel
    # 1.1 ns of its 10.7 ns per call (measured), which no user calling it directly pays.
    parts.append("void morello_bench_run(void);")
    entries = [f'    {{"{MORELLO}", morello_bench_run, 0, 0}}']
    if one_thread:
        parts.append("void morello_bench_run1(void);")
        entries.append(f'    {{"{ONE_THREAD}", morello_bench_run1, 0, 0}}')
    first = len(entries)  # the kernel (and its one-thread kernel) come first
    for i, impl in enumerate(impls, start=first):
        if impl.decls:
            parts.append(impl.decls)
        parts.append(f"static void run_{i}(void) {{\n{impl.code}\n}}")
        entries.append(f'    {{"{impl.name}", run_{i}, 0, {int(impl.reference)}}}')
    table = ",\n".join(entries)
    parts.append(f"static struct impl impls[] = {{\n{table}\n}};")
    parts.append(f"#define N_IMPLS {len(entries)}")
    setup = "".join(impl.setup.replace("IDX", str(i)) for i, impl in enumerate(impls, start=first))
    parts.append(f"static void setup(int threads) {{\n{thread_setup}{setup}    (void)threads;\n}}")
    parts.append(_MAIN)
    return "\n".join(parts)


# --------------------------------------------------------------------------- driver


def _run(cmd: Sequence[str], env: dict[str, str], what: str) -> str:
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, env=env, timeout=3600, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"benchmark harness timed out during {what}") from exc
    if proc.returncode != 0:
        raise BenchError(
            f"benchmark harness failed during {what} (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()}"
        )
    return proc.stdout


def _call_source(abi: KernelABI, run: str) -> str:
    """`void run(void)` calling the kernel on the harness buffers, in a file of its own so
    the kernel's header never meets the harness's libc headers (see `_harness_source`)."""
    return (
        f'#include "{abi.name}.h"\n'
        "extern void *morello_bench_buf[];\n"
        f"void {run}(void);\n"
        f"void {run}(void) {{ {abi.name}({_c_call_args(abi, 'morello_bench_buf')}); }}\n"
    )


def _build(
    cc: Compiler,
    workdir: Path,
    kernel: GeneratedKernel,
    impls: Sequence[_Impl],
    libs: Sequence[PeerLib],
    thread_setup: str,
    naive_flags: Sequence[str] = ("-march=native",),
    threads: int = 1,
    one_thread: GeneratedKernel | None = None,
) -> Path:
    abi = kernel.abi
    files = dict(kernel_files(kernel))
    if one_thread is not None:
        files |= kernel_files(one_thread)
        files["morello_bench_call1.c"] = _call_source(one_thread.abi, "morello_bench_run1")
    files["morello_bench_naive.c"] = _naive_source(abi, "morello_bench_naive")
    files["morello_bench_stream.c"] = _STREAM_SOURCE
    files["morello_bench_call.c"] = _call_source(abi, "morello_bench_run")
    files["morello_bench_harness.c"] = _harness_source(
        abi, impls, thread_setup, one_thread is not None
    )
    timed = {impl.name for impl in impls}
    if FMA_PEAK in timed:
        files["morello_bench_fma.c"] = _fma_source(abi.isa)
    if AMX_PEAK in timed:
        files["morello_bench_amx.c"] = _amx_source()
    write_sources(workdir, files)
    omp = ["-fopenmp"] if "#pragma omp" in kernel.c_source or threads > 1 else []
    kflags = ["-O3", "-std=gnu99", *ISA_FLAGS[abi.isa], *omp]
    objects = [
        compile_object(cc, workdir / f"{abi.name}.c", flags=kflags),
        compile_object(cc, workdir / "morello_bench_call.c", flags=["-O2", "-std=gnu99"]),
        compile_object(
            cc, workdir / "morello_bench_naive.c", flags=["-O3", *naive_flags, "-std=gnu99"]
        ),
        compile_object(
            cc, workdir / "morello_bench_stream.c", flags=["-O3", *naive_flags, "-std=gnu99"]
        ),
        compile_object(cc, workdir / "morello_bench_harness.c", flags=["-O2", "-std=gnu99"]),
    ]
    for ref in ("morello_bench_fma.c", "morello_bench_amx.c"):
        if ref in files:
            objects.append(compile_object(cc, workdir / ref, flags=kflags))
    if one_thread is not None:
        objects.append(compile_object(cc, workdir / f"{one_thread.abi.name}.c", flags=kflags))
        objects.append(
            compile_object(cc, workdir / "morello_bench_call1.c", flags=["-O2", "-std=gnu99"])
        )
    libargs = [a for lib in libs for a in lib.link_args]
    return link(
        cc,
        objects,
        workdir / "morello_bench",
        shared=False,
        flags=omp,
        libs=[*libargs, "-lm"],
    )


def _write_inputs(
    abi: KernelABI, workdir: Path, seed: int
) -> tuple[dict[str, NDArray[Any]], OperandABI]:
    """Random inputs (as in verify) as raw physical files; returns the logical arrays."""
    rng = np.random.default_rng(seed)
    logical: dict[str, NDArray[Any]] = {}
    out = next(op for op in abi.operands if not op.is_input)
    for i, op in enumerate(abi.operands):
        if op.is_input:
            logical[op.name] = random_logical(op, rng)
            to_physical(logical[op.name], op.order).tofile(workdir / f"in_{i}.bin")
    accumulate = out.role == "inout" or (abi.op == "matmul" and abi.accumulate)
    init = random_logical(out, rng) if accumulate else sentinel_fill(out, 0)
    logical[out.name] = init
    to_physical(init, out.order).tofile(workdir / "init.bin")
    return logical, out


def _check_one_thread(kernel: GeneratedKernel, one: GeneratedKernel, threads: int) -> None:
    """`one` must compute what `kernel` does, on one thread, under another C name."""
    if threads < 2:
        raise ValueError("one_thread is the baseline of a threaded run: needs threads >= 2")
    a, b = kernel.abi, one.abi
    if replace(b, name=a.name, workspace_bytes=a.workspace_bytes) != a:
        raise ValueError(
            f"one_thread kernel {b.name!r} does not have the ABI of {a.name!r} "
            "(the same Spec, target and layouts are needed)"
        )
    if b.name == a.name or b.name.startswith("morello_bench_"):
        raise ValueError(
            f"one_thread kernel needs a C name of its own (not {b.name!r}, the kernel's or "
            "the harness's)"
        )
    if "#pragma omp" in one.c_source:
        raise ValueError(
            f"one_thread kernel {b.name!r} has parallel loops: synthesize it for 1 thread"
        )


def bench_kernel(
    kernel: GeneratedKernel,
    *,
    peers: Sequence[str] | None = None,
    threads: int = 1,
    min_time: float = 0.5,
    compiler: str | None = None,
    seed: int = 0,
    peer_isa: str = "kernel",
    one_thread: GeneratedKernel | None = None,
) -> BenchReport:
    """Benchmark `kernel` against `peers` (default: all of `ALL_PEERS`).

    `min_time` is the minimum total timed seconds per implementation (at least
    `MIN_SAMPLES` samples of ~`SAMPLE_SECONDS` each). Peers that are missing, cannot express
    the kernel, or compute a wrong result are reported as skipped with the reason.
    `peer_isa="kernel"` holds the peers to the kernel's ISA (`PEER_ISA_LIMITS`); "host"
    lets them use everything this machine has.
    `one_thread`: with `threads` > 1, the same Spec synthesized for one thread, timed
    beside the kernel as `ONE_THREAD` (never a peer); `BenchReport.scaling` is then the
    kernel's speed-up over it.
    """
    if peer_isa not in PEER_ISAS:
        raise ValueError(f"peer_isa must be one of {PEER_ISAS}, got {peer_isa!r}")
    abi = kernel.abi
    if threads < 1:
        raise ValueError("threads must be >= 1")
    if abi.isa not in ISA_FLAGS:
        raise ValueError(f"kernel {abi.name}: unknown ISA {abi.isa!r}")
    if not host_supports(abi.isa):
        raise IsaUnavailable(abi.isa)
    if abi.name.startswith("morello_bench_"):
        raise BenchError(
            f"kernel name {abi.name!r}: names starting with 'morello_bench_' are the "
            "benchmark harness's own; choose another --name"
        )
    if one_thread is not None:
        _check_one_thread(kernel, one_thread, threads)
    wanted = list(ALL_PEERS if peers is None else peers)
    cc = find_compiler(compiler)
    impls, skipped, libs, thread_setup = _plan_peers(abi, wanted, threads)
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1:
        env["MKL_THREADING_LAYER"] = "SEQUENTIAL"
    else:
        # Round-robin timing alternates thread pools; a pool that keeps spinning after its
        # call (Intel OpenMP spins 200 ms by default) would steal cores from the next one.
        # MKL uses the GNU OpenMP layer so that it shares one runtime with OpenMP kernels.
        env.update(
            MKL_THREADING_LAYER="GNU",
            KMP_BLOCKTIME="0",
            GOMP_SPINCOUNT="10000",
            OPENBLAS_THREAD_TIMEOUT="4",
        )

    limit_env, naive_flags = _peer_isa_settings(abi.isa, peer_isa)
    env.update(limit_env)
    peer_limit = " ".join(f"{k}={v}" for k, v in limit_env.items())
    if naive_flags != _HOST_NAIVE_FLAGS:
        peer_limit += f", naive {' '.join(naive_flags)}"

    with tempfile.TemporaryDirectory(prefix="morello-bench-") as tmp:
        workdir = Path(tmp)
        exe = _build(
            cc, workdir, kernel, impls, libs, thread_setup, naive_flags, threads, one_thread
        )
        logical, out = _write_inputs(abi, workdir, seed)
        expected = reference_output(abi, logical)

        one_thread_name = one_thread.abi.name if one_thread is not None else ""
        # 1. Check every implementation once against numpy.
        stdout = _run([str(exe), "check", tmp, str(threads)], env, "the correctness check")
        passed: list[str] = []
        for line in stdout.splitlines():
            word, _, rest = line.partition(" ")
            if word == "skip":
                name, _, reason = rest.partition(" ")
                skipped[name] = reason
            elif word == "reference":
                passed.append(rest.strip())
            elif word == "checked":
                name = rest.strip()
                raw = np.fromfile(workdir / f"out_{name}.bin", dtype=STORAGE[out.dtype])
                phys = raw.reshape(tuple(out.shape[d] for d in out.order))
                got = decode(out.dtype, from_physical(phys, out.order))
                ok, _, max_rel, msg = compare_output(expected, got, out.dtype)
                if ok:
                    passed.append(name)
                elif name in (MORELLO, ONE_THREAD):
                    which = abi.name if name == MORELLO else f"{name} ({one_thread_name})"
                    raise BenchError(f"kernel {which} computed a wrong result: {msg}")
                else:
                    skipped[name] = f"wrong result ({msg})"
        if MORELLO not in passed:
            raise BenchError(f"kernel {abi.name} was not run by the harness")

        # 2. Time the ones that passed, round-robin.
        stdout = _run(
            [str(exe), "time", tmp, str(threads), repr(SAMPLE_SECONDS), repr(min_time), *passed],
            env,
            "timing",
        )
    samples: dict[str, list[float]] = {name: [] for name in passed}
    reps: dict[str, int] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "sample":
            samples[parts[1]].append(float(parts[2]))
        elif len(parts) == 3 and parts[0] == "reps":
            reps[parts[1]] = int(parts[2])

    def timed(name: str) -> ImplResult:
        s = samples[name]
        if not s:
            return ImplResult(name, skipped="harness produced no samples")
        flops = (
            _reference_iters(name, abi.isa, abi.flops, threads)[1]
            if name in COMPUTE_PEAKS
            else abi.flops
        )
        med, best = statistics.median(s), min(s)
        gf_med, gf_best = (flops / t / 1e9 if t > 0 else math.inf for t in (med, best))
        return ImplResult(name, med, best, gf_med, gf_best, len(s), reps.get(name, 0))

    results = [timed(MORELLO)]
    for name in wanted:
        results.append(timed(name) if name in passed else ImplResult(name, skipped=skipped[name]))
    if one_thread is not None:
        results.append(timed(ONE_THREAD))
    not_peers = (*REFERENCES, ONE_THREAD)
    timed_peers = [r for r in results[1:] if r.skipped is None and r.name not in not_peers]
    best = min(timed_peers, key=lambda r: r.seconds, default=None)
    ratio = best.seconds / results[0].seconds if best is not None else None
    return BenchReport(
        spec=kernel.spec_text,
        kernel=abi.name,
        target=abi.isa,
        threads=threads,
        flops=abi.flops,
        compiler=cc.name,
        results=tuple(results),
        best_peer=best.name if best else None,
        ratio=ratio,
        peer_limit=peer_limit,
        tune=kernel.tune,
    )
