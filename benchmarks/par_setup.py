"""Measure what a parallel loop costs on this machine, in the cost model's units.

    python benchmarks/par_setup.py                 # 2 threads (the machine's cores)
    python benchmarks/par_setup.py --threads 4 --cc clang

The model prices a parallel loop `par_setup + par_per_iter * iterations` on top of its
body (actions/tile.py `loop_const`); `machine/isa.py` and `machine/target.py` hold the
constants. One unit is half a vector FMA's issue slot (docs/cost-model.md), so the script
times, in one C program built with the kernels' flags and OpenMP:
- the FMA rate: 12 independent chains of 256-bit FMAs (units per ns = 2 x FMAs per ns);
- a warm `#pragma omp parallel for schedule(static)` (the generated loops' form) over
  `threads` and 64 x `threads` iterations of an empty body, back to back: the region's
  start and join, and each further iteration;
- a barrier inside a warm region (two loops in one region, the second `nowait`), over the
  plain region's time;
- the same region after 20 ms idle, when the pool's threads have gone to sleep and must
  be woken (what a program pays that calls a kernel now and then);
- the first region of the process (the pool's creation), once.
Medians over `--samples` batches; results in ns and units (docs/cost-model.md, "Parallel
loops"). `morello bench` runs its harness with `GOMP_SPINCOUNT=10000` (harness/bench.py);
run this script with it too to see what the benchmarks see.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from c_probe import ProbeError, probe_compiler, run_probe

_C = r"""
#include <immintrin.h>
#include <omp.h>

static int touched[4096 * 16];

/* ns per region of `iters` iterations of an (almost) empty body, `reps` regions per batch */
static double region(int iters, int reps, int threads) {
    const double t0 = now();
    for (int r = 0; r < reps; r++) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int i = 0; i < iters; i++)
            touched[i * 16] += 1;
    }
    return (now() - t0) / reps;
}

/* the same with a barrier inside: two loops in one region, the second `nowait` (the
   form of a kernel that must see every thread's first pass, RowSoftmaxChunkedParallel) */
static double region_barrier(int iters, int reps, int threads) {
    const double t0 = now();
    for (int r = 0; r < reps; r++) {
#pragma omp parallel num_threads(threads)
        {
#pragma omp for schedule(static)
            for (int i = 0; i < iters; i++)
                touched[i * 16] += 1;
#pragma omp for schedule(static) nowait
            for (int i = 0; i < iters; i++)
                touched[i * 16] += 1;
        }
    }
    return (now() - t0) / reps;
}

static void sleep_ms(int ms) {
    struct timespec t = {0, ms * 1000000L};
    nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
    const int threads = atoi(argv[1]), samples = atoi(argv[2]);
    double v[1000];
    /* the pool's creation: the first region of the process */
    const double first = region(threads, 1, threads);
    /* FMA rate: 12 chains, 4 cycles of latency x 2 ports needs >= 8 */
    for (int s = 0; s < samples; s++) {
        __m256 a[12];
        for (int j = 0; j < 12; j++) a[j] = _mm256_set1_ps((float)j);
        const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
        const long n = 2000000;
        const double t0 = now();
        for (long i = 0; i < n; i++)
            for (int j = 0; j < 12; j++) a[j] = _mm256_fmadd_ps(a[j], b, c);
        v[s] = 12.0 * n / (now() - t0);
        float t = 0;
        for (int j = 0; j < 12; j++) t += a[j][0];
        sink = t;
    }
    const double fma = median(v, samples);
    region(threads, 1000, threads);  /* warm */
    for (int s = 0; s < samples; s++) v[s] = region(threads, 2000, threads);
    const double fork = median(v, samples);
    for (int s = 0; s < samples; s++) v[s] = region(64 * threads, 2000, threads);
    const double many = median(v, samples);
    for (int s = 0; s < samples; s++) v[s] = region_barrier(threads, 2000, threads);
    const double barrier = median(v, samples) - fork;
    for (int s = 0; s < samples; s++) {
        sleep_ms(20);
        v[s] = region(threads, 1, threads);
    }
    const double woken = median(v, samples);
    printf("%.6f %.3f %.3f %.3f %.3f %.3f\n", fma, first, fork, many, woken, barrier);
    return 0;
}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--samples", type=int, default=31, help="batches (default 31)")
    parser.add_argument("--cc", default=None, help="C compiler (default $CC, else gcc)")
    args = parser.parse_args(argv)
    if args.threads < 2:
        parser.error("--threads must be at least 2")
    if not 1 <= args.samples <= 1000:
        parser.error("--samples must be 1..1000")
    env = {**os.environ, "OMP_PROC_BIND": os.environ.get("OMP_PROC_BIND", "false")}
    try:
        cc = probe_compiler(args.cc)
        flags = ["-mavx2", "-mfma", "-fopenmp"]
        out = run_probe(cc, _C, flags, [str(args.threads), str(args.samples)], env).split()
    except ProbeError as e:
        print(f"par_setup.py: {e}", file=sys.stderr)
        return 1
    fma, first, fork, many, woken, barrier = map(float, out)
    units_per_ns = 2 * fma
    per_iter = (many - fork) / 63  # each thread ran 63 more iterations
    print(f"{Path(cc).name}, {args.threads} threads, medians of {args.samples} batches")
    print(f"FMA rate: {fma:.2f} 256-bit FMAs/ns -> {units_per_ns:.2f} units/ns")
    rows = [
        ("warm region start + join", fork),
        ("one more iteration per thread", per_iter),
        ("a barrier inside the region", barrier),
        ("region after 20 ms idle (threads woken)", woken),
        ("first region of the process (pool created)", first),
    ]
    print("| what | ns | units |\n|---|---|---|")
    for what, ns in rows:
        print(f"| {what} | {ns:,.1f} | {ns * units_per_ns:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
