"""Micro-benchmark of the memo table's hot paths (not a test; run ``python benchmarks/memo_bench.py``).

Simulates the DP's traffic: 25-d points (21 non-memory coords, 4 memory limits), puts that
fill a box of memory limits ``[peaks, limits]`` for one Spec, then repeated point lookups.
"""

from __future__ import annotations

import random
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from morello_build.memo.store import CacheStore
from morello_build.memo.table import MemoTable
from morello_build.memo.value import MemoValue

D_SPEC, D_MEM = 21, 4


def spec_points(rng: random.Random, n: int) -> list[tuple[int, ...]]:
    out = []
    for _ in range(n):
        shape = [rng.randrange(7) for _ in range(4)]  # log2 sizes 1..64
        aux = [rng.randrange(4) for _ in range(D_SPEC - 4)]
        out.append(tuple(shape + aux))
    return out


def main() -> None:
    rng = random.Random(0)
    specs = spec_points(rng, 4000)
    values = [MemoValue(Fraction(rng.randrange(1, 50), 8), (1, 2, 3, 4), 2, a) for a in range(30)]
    limits = (16, 16, 11, 26)
    puts = []
    for s in specs:
        peaks = tuple(rng.randrange(0, lim + 1) for lim in limits)
        lim = tuple(rng.randrange(p, lo + 1) for p, lo in zip(peaks, limits, strict=True))
        puts.append((s + peaks, s + lim, rng.choice(values)))

    t = MemoTable(memory_dims=D_MEM)
    t0 = time.perf_counter()
    for lo, hi, v in puts:
        t.put("Matmul", lo, hi, v)
    dt = time.perf_counter() - t0
    st = t.stats()["Matmul"]
    print(
        f"put:  {len(puts) / dt:9.0f} /s  ({dt / len(puts) * 1e6:.1f} us each); "
        f"{st.pages} pages, {st.boxes} boxes, max {max(len(p) for _, p in t.pages())} per page"
    )

    queries = [hi for _, hi, _ in puts] + [lo for lo, _, _ in puts]
    rng.shuffle(queries)
    t0 = time.perf_counter()
    for q in queries:
        t.get("Matmul", q)
    dt = time.perf_counter() - t0
    print(
        f"get (first lookup of each point): {len(queries) / dt:9.0f} /s  "
        f"({dt / len(queries) * 1e6:.2f} us each)"
    )
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        for q in queries:
            t.get("Matmul", q)
    dt = time.perf_counter() - t0
    n = reps * len(queries)
    print(f"get (repeated lookups, hot cache): {n / dt:9.0f} /s  ({dt / n * 1e6:.2f} us each)")
    misses = [s + (0, 0, 0, 0) for s in spec_points(rng, 4000)]
    t0 = time.perf_counter()
    for q in misses:
        t.get("Matmul", q)
    dt = time.perf_counter() - t0
    print(
        f"get (misses, first lookup): {len(misses) / dt:9.0f} /s  "
        f"({dt / len(misses) * 1e6:.2f} us each)"
    )

    # The DP's pattern: look up a Spec (miss), solve it, put its box, look it up again
    # from several parents; meanwhile other Specs of the same pages are being put.
    t2 = MemoTable(memory_dims=D_MEM)
    ops = 0
    t0 = time.perf_counter()
    for lo, hi, v in puts:
        t2.get("Matmul", hi)
        t2.put("Matmul", lo, hi, v)
        for _ in range(5):
            t2.get("Matmul", hi)
        ops += 7
    dt = time.perf_counter() - t0
    print(
        f"DP pattern (get miss, put, 5 gets): {ops / dt:9.0f} ops/s  ({dt / len(puts) * 1e6:.1f} us per Spec)"
    )

    with tempfile.TemporaryDirectory() as tmp:
        store = CacheStore("bench", "x86", root=Path(tmp))
        for lo, hi, v in puts:
            store.put("Matmul", lo, hi, v)
        t0 = time.perf_counter()
        pages = store.flush()
        dt = time.perf_counter() - t0
        print(f"flush: {pages} pages in {dt * 1e3:.0f} ms ({dt / pages * 1e3:.2f} ms/page)")
        t0 = time.perf_counter()
        reader = CacheStore("bench", "x86", root=Path(tmp))
        for q in queries:
            reader.get("Matmul", q)
        dt = time.perf_counter() - t0
        print(f"cold reader (loads every page): {len(queries)} gets in {dt * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
