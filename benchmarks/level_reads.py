"""Measure what a 64-byte line costs from each cache level: read by a register tile, copied,
and read alone.

    python benchmarks/level_reads.py
    python benchmarks/level_reads.py --sizes 32,512,4096 --cc clang
    python benchmarks/level_reads.py --offset 16     # rows 16 bytes past a line, as numpy's

The model prices touching a line at each level with one constant (`Isa.hit_cost`, overridden
per microarchitecture by `Tuning.l2_hit`): L1 1, L2 2, main memory 20 on AVX-512. A plan that
keeps B in L2 and sweeps it under every register tile of C pays B's lines at L2 once per
tile, so that constant decides between such plans and plans that block k and read C back
from L2 instead. This probe, built with the kernels' AVX-512 flags, runs over one buffer of
each `--sizes` KiB (resident in L1, L2, L3 or memory after the first pass):
- tile: a 6x64 broadcast-FMA tile of C (24 zmm accumulators, the kernels' microkernel) that
  reads one 256-byte row of B (the buffer) per k step, 4 lines per 24 FMAs;
- copy: 8 KiB blocks of the buffer copied into one 8 KiB buffer (what a move's prologue does);
- read: the buffer summed, four accumulators (loads alone).
Each figure is ns per line of the buffer; the `/ L1` columns divide by the first size's
(32 KiB by default: at 16 KiB the tile's per-call overhead shows).
Results and what the model does with them: docs/cost-model.md, "Lines read from L2".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from c_probe import ProbeError, probe_compiler, run_probe

from morello_build.harness.compile import ISA_FLAGS
from morello_build.machine.isa import host_cpu_name

_C = r"""
#include <immintrin.h>

/* C[6][64] += A[6][k] B[k][64]: B's rows are 256 contiguous bytes, read once per k step */
__attribute__((noinline)) static void tile(const float *a, long k, const float *b, float *c) {
    __m512 acc[6][4];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_loadu_ps(c + 64 * i + 16 * j);
    for (long r = 0; r < k; r++) {
        const __m512 b0 = _mm512_loadu_ps(b + 64 * r), b1 = _mm512_loadu_ps(b + 64 * r + 16);
        const __m512 b2 = _mm512_loadu_ps(b + 64 * r + 32), b3 = _mm512_loadu_ps(b + 64 * r + 48);
        for (int i = 0; i < 6; i++) {
            const __m512 x = _mm512_set1_ps(a[i * k + r]);
            acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
            acc[i][2] = _mm512_fmadd_ps(x, b2, acc[i][2]);
            acc[i][3] = _mm512_fmadd_ps(x, b3, acc[i][3]);
        }
    }
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 4; j++) _mm512_storeu_ps(c + 64 * i + 16 * j, acc[i][j]);
}
__attribute__((noinline)) static void copy_block(const float *restrict s, float *restrict d) {
    for (int i = 0; i < 2048; i += 16) _mm512_storeu_ps(d + i, _mm512_loadu_ps(s + i));
}
__attribute__((noinline)) static float read_all(const float *s, long n) {
    __m512 a = _mm512_setzero_ps(), b = a, c = a, e = a;
    for (long i = 0; i < n; i += 64) {
        a = _mm512_add_ps(a, _mm512_loadu_ps(s + i));
        b = _mm512_add_ps(b, _mm512_loadu_ps(s + i + 16));
        c = _mm512_add_ps(c, _mm512_loadu_ps(s + i + 32));
        e = _mm512_add_ps(e, _mm512_loadu_ps(s + i + 48));
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, e)));
}

int main(int argc, char **argv) {
    const long bytes = atol(argv[1]) * 1024, samples = atol(argv[2]), offset = atol(argv[3]);
    const long n = bytes / 4, lines = bytes / 64, k = n / 64, blocks = bytes / 8192;
    /* the buffer starts `offset` bytes past a page (numpy puts a large array 16 past one) */
    char *raw = aligned_alloc(4096, bytes + 4096);
    float *b = (float *)(raw + offset), *a = aligned_alloc(64, 6 * k * 4);
    float *d = aligned_alloc(64, 8192), c[6 * 64] = {0};
    for (long i = 0; i < n; i++) b[i] = (float)(i % 7) * 1e-3f;
    for (long i = 0; i < 6 * k; i++) a[i] = 1e-3f;
    /* every kind touches at least 16 MiB per sample, so small buffers are timed many times */
    const long reps = (16l << 20) / bytes > 1 ? (16l << 20) / bytes : 1;
    double v[1000], t[3];
    for (int kind = 0; kind < 3; kind++) {
        for (long s = 0; s < samples + 1; s++) {
            const double t0 = now();
            for (long r = 0; r < reps; r++) {
                if (kind == 0) tile(a, k, b, c);
                else if (kind == 1) for (long j = 0; j < blocks; j++) copy_block(b + 2048 * j, d);
                else sink += read_all(b, n);
            }
            const double dt = now() - t0;
            sink += c[0] + d[5];
            if (s) v[s - 1] = dt / reps / lines; /* the first pass warms the caches */
        }
        t[kind] = median(v, samples);
    }
    printf("%.4f %.4f %.4f\n", t[0], t[1], t[2]);
    return 0;
}
"""

_AVX512 = list(ISA_FLAGS["avx512"])  # the kernels' own AVX-512 flags


def _sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated KiB, got {text!r}") from None
    if not values or any(v < 8 or v % 8 for v in values):
        raise argparse.ArgumentTypeError("every size must be a multiple of 8 KiB")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        type=_sizes,
        default=[32, 256, 512, 768, 1024, 4096, 16384, 65536],
        help="buffer sizes in KiB, the first the L1 reference "
        "(default 32,256,512,768,1024,4096,16384,65536)",
    )
    parser.add_argument("--samples", type=int, default=21, help="passes timed (default 21)")
    parser.add_argument(
        "--offset",
        type=int,
        default=0,
        help="place the buffer this many bytes past a page, 0-60 in steps of 4 (16: where "
        "numpy puts a large array; every 64-byte load then straddles two lines) [default 0]",
    )
    parser.add_argument("--cc", default=None, help="C compiler (default $CC, else gcc)")
    args = parser.parse_args(argv)
    if not 1 <= args.samples <= 999:
        parser.error("--samples must be 1..999")
    if not 0 <= args.offset < 64 or args.offset % 4:
        parser.error(f"--offset must be 0-60 in steps of 4 (a float's size), got {args.offset}")
    try:
        cc = probe_compiler(args.cc)
        rows = [
            (
                kib,
                [
                    float(x)
                    for x in run_probe(
                        cc, _C, _AVX512, [str(kib), str(args.samples), str(args.offset)]
                    ).split()
                ],
            )
            for kib in args.sizes
        ]
    except ProbeError as e:
        print(f"level_reads.py: {e}", file=sys.stderr)
        return 1
    print(
        f"{host_cpu_name()}; {Path(cc).name}; medians of {args.samples} passes; ns per 64-byte line of "
        f"the buffer, which starts {args.offset} bytes past a page"
    )
    print("| buffer KiB | tile | tile / L1 | copy | copy / L1 | read | read / L1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    ref = rows[0][1]
    for kib, (tile, copy, read) in rows:
        print(
            f"| {kib} | {tile:.3f} | {tile / ref[0]:.2f}x | {copy:.3f} | {copy / ref[1]:.2f}x "
            f"| {read:.3f} | {read / ref[2]:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
