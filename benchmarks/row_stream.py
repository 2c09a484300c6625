"""Measure what a whole-k register tile pays to read its rows of A in place from memory.

    python benchmarks/row_stream.py
    python benchmarks/row_stream.py --rows 2048,8192 --widths 16,64 --cc clang

A plan that sweeps all of k under a register tile of C (6 rows) reads its 6 rows of A in
place, one broadcast per row per k step: six long streams, rows a matrix pitch (pages)
apart, each line feeding 16 k steps of the tile's FMAs. The model prices such a view of A
in main memory at `Isa.hit_cost` (20 a line on AVX-512, a lone streaming read from DRAM)
as if nothing overlapped it (docs/cost-model.md, "Rows streamed under a tile"). This
probe, built with the kernels' AVX-512 flags, times C[6][W] += A[6][K] B[K][W] (B, K x W
floats, warm in L1 or L2) for every 6-row block of an R x K matrix A:
- resident: every block reads the same 6 rows (48 KiB at K = 2048: L1 and L2);
- streamed: the blocks walk all R rows in order (R x K floats: in L3 or in memory).
Each figure is ns per line of A the pass reads; `extra` is streamed minus resident, what
the lines really cost beyond the tile's FMAs, and `FMAs / line` the tile's 512-bit FMAs per
line of A (16 k steps of W / 16 vectors on 6 rows, over 6 rows: W).
"""

from __future__ import annotations

import argparse
import sys

from c_probe import ProbeError, int_list, probe_compiler, run_probe

from morello_build.harness.compile import ISA_FLAGS
from morello_build.machine.isa import host_cpu_name

_C = r"""
#include <immintrin.h>

/* C[6][16 NV] += A[6][k] B[k][16 NV]; A's rows are `pitch` floats apart */
#define TILE(NV)                                                                           \
    __attribute__((noinline)) static void tile##NV(const float *a, long pitch, long k,       \
                                                   const float *b, float *c) {               \
        __m512 acc[6][NV];                                                                 \
        for (int i = 0; i < 6; i++)                                                        \
            for (int j = 0; j < NV; j++) acc[i][j] = _mm512_loadu_ps(c + 16 * (NV * i + j)); \
        for (long r = 0; r < k; r++) {                                                     \
            __m512 bv[NV];                                                                 \
            for (int j = 0; j < NV; j++) bv[j] = _mm512_loadu_ps(b + 16 * (NV * r + j));    \
            for (int i = 0; i < 6; i++) {                                                  \
                const __m512 x = _mm512_set1_ps(a[i * pitch + r]);                         \
                for (int j = 0; j < NV; j++) acc[i][j] = _mm512_fmadd_ps(x, bv[j], acc[i][j]); \
            }                                                                              \
        }                                                                                  \
        for (int i = 0; i < 6; i++)                                                        \
            for (int j = 0; j < NV; j++) _mm512_storeu_ps(c + 16 * (NV * i + j), acc[i][j]); \
    }
TILE(1)
TILE(2)
TILE(4)

int main(int argc, char **argv) {
    const long rows = atol(argv[1]), k = atol(argv[2]), nv = atol(argv[3]);
    const long samples = atol(argv[4]), pitch = atol(argv[5]);
    float *a = aligned_alloc(4096, rows * pitch * 4), *b = aligned_alloc(64, k * 64 * 4);
    float c[6 * 64] = {0};
    for (long i = 0; i < rows * pitch; i++) a[i] = (float)(i % 7) * 1e-3f;
    for (long i = 0; i < k * 64; i++) b[i] = 1e-3f;
    const long blocks = rows / 6, lines = blocks * 6 * k / 16;
    double v[1000], t[2];
    for (int kind = 0; kind < 2; kind++) {
        for (long s = 0; s < samples + 1; s++) {
            const double t0 = now();
            for (long blk = 0; blk < blocks; blk++) {
                const float *rows6 = a + (kind ? blk * 6 * pitch : 0);
                if (nv == 1) tile1(rows6, pitch, k, b, c);
                else if (nv == 2) tile2(rows6, pitch, k, b, c);
                else tile4(rows6, pitch, k, b, c);
            }
            const double dt = now() - t0;
            sink += c[0];
            if (s) v[s - 1] = dt / lines; /* the first pass warms the caches */
        }
        t[kind] = median(v, samples);
    }
    printf("%.4f %.4f\n", t[0], t[1]);
    return 0;
}
"""

_AVX512 = list(ISA_FLAGS["avx512"])  # the kernels' own AVX-512 flags


def _ints(what: str, allowed: tuple[int, ...] | None = None):
    """`c_probe.int_list`, then positive values (among `allowed` when given)."""

    def parse(text: str) -> list[int]:
        values = int_list(text)
        if any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected positive {what}")
        if allowed and any(v not in allowed for v in values):
            raise argparse.ArgumentTypeError(f"{what} must be among {allowed}")
        return values

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        type=_ints("row counts"),
        default=[1024, 2048, 8192],
        help="rows of A, one case each (default 1024,2048,8192: 8, 16, 64 MiB at k 2048)",
    )
    parser.add_argument("--k", type=int, default=2048, help="A's row length (default 2048)")
    parser.add_argument(
        "--pitch",
        type=int,
        default=None,
        help="floats from one row of A to the next (default K): a pitch above K reads a "
        "strided view, K columns of a wider matrix, as a plan that splits k does",
    )
    parser.add_argument(
        "--widths",
        type=_ints("widths", (16, 32, 64)),
        default=[16, 32, 64],
        help="the tile's columns: 16, 32 or 64 (default all three)",
    )
    parser.add_argument("--samples", type=int, default=11, help="passes timed (default 11)")
    parser.add_argument("--cc", default=None, help="C compiler (default $CC, else gcc)")
    args = parser.parse_args(argv)
    if not 1 <= args.samples <= 999:
        parser.error("--samples must be 1..999")
    if args.k < 16 or args.k % 16:
        parser.error("--k must be a positive multiple of 16")
    if any(r < 6 for r in args.rows):
        parser.error("every --rows must be at least 6")
    pitch = args.k if args.pitch is None else args.pitch
    if pitch < args.k or pitch % 16:
        parser.error("--pitch must be a multiple of 16 and at least --k")
    rows_of = f"{args.k * 4} B rows" + (f", {pitch * 4} B apart" if pitch != args.k else "")
    print(
        f"{host_cpu_name()}; A R x {args.k} f32 ({rows_of}), B {args.k} x W warm; medians "
        f"of {args.samples} passes; ns per line of A"
    )
    print("| A rows | A MiB | W | FMAs / line | resident | streamed | extra | extra / resident |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    try:
        cc = probe_compiler(args.cc)
        for rows in args.rows:
            for w in args.widths:
                probe_args = [str(rows), str(args.k), str(w // 16), str(args.samples), str(pitch)]
                res, streamed = (float(x) for x in run_probe(cc, _C, _AVX512, probe_args).split())
                mib = rows * args.k * 4 / (1 << 20)  # read (a wider pitch spreads them)
                print(
                    f"| {rows} | {mib:.0f} | {w} | {w} | {res:.3f} | {streamed:.3f} "
                    f"| {streamed - res:.3f} | {(streamed - res) / res:+.0%} |",
                    flush=True,
                )
    except ProbeError as e:
        print(f"row_stream.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
