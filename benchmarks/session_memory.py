"""Peak and current RSS of one process that synthesizes many kernels through the API.

    python benchmarks/session_memory.py [--count 50] [--target avx2]

Each synthesis is a distinct f32 matmul (m from 1 to --count, k = n = 16), cold (no
cache). With search sessions (`morello_build.search.session`) the process-wide tables are
released after each one, so the current RSS stays flat; the table prints it every 10.
"""

from __future__ import annotations

import argparse
import resource
import time

from morello_build.api import matmul_spec_text, synthesize
from morello_build.ir import spec as ir_spec


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--target", default="avx2")
    args = ap.parse_args()
    start = time.perf_counter()
    print("| syntheses | Specs solved | RSS MiB | peak RSS MiB | interned Specs held |")
    print("|---|---|---|---|---|")
    solved = 0
    for m in range(1, args.count + 1):
        syn = synthesize(matmul_spec_text(1, m, 16, 16), args.target, use_cache=False)
        solved += syn.solved
        if m % 10 == 0 or m == 1:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            held = len(ir_spec._INTERNED)
            print(f"| {m} | {solved} | {rss_mib():.0f} | {peak:.0f} | {held} |")
    print(f"{args.count} syntheses in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
