"""Does the cost model rank programs like the hardware does?

    python benchmarks/cost_fidelity.py                   # f32 64^3 and 1x1024x1024, avx512
    python benchmarks/cost_fidelity.py --shapes 128 --target avx2 -n 16

For each Spec the DP's optimal program is the reference. Alternatives are the DP's own
programs with one decision changed: at every node of the optimal tree, each other
applicable action whose children fit the memory left there, completed optimally by the
DP below it. That covers different loop orders, tile sizes, register-tile shapes, moves and
kernels. Distinct programs (by their C source) are ranked by model cost; the N/2 cheapest
(always including the DP's choice) plus programs spread evenly over the rest of the
ranking are compiled (gcc) and timed in the
harness of this script: all programs linked into one executable, same inputs, timed
round-robin (median of 15 rounds; --min-time is the timed seconds per program). Printed: each program's model cost and time, the
Spearman rank correlation between them, and how far the DP's choice is from the fastest
program measured.

Shapes use the syntax of benchmarks/peers.py: ``N`` (N^3), ``MxKxN``, ``bf16:`` prefix.
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path as FsPath

from morello_build.actions.enumerate import actions_for
from morello_build.api import matmul_spec_text
from morello_build.codegen.emit import generate_c
from morello_build.harness.compile import kernel_flags
from morello_build.impl.cost import Cost
from morello_build.impl.nodes import Impl
from morello_build.ir.limits import ZERO, Limits, subtract
from morello_build.ir.spec import LogicalSpec, intern
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.search.dp import Search, run_deep
from morello_build.search.memo_protocol import Solution

Path = tuple[int, ...]  # child indices from the root


def _parse_shape(text: str) -> tuple[str, tuple[int, int, int]]:
    dtype = "f32"
    if ":" in text:
        dtype, text = text.split(":", 1)
    dims = [int(x) for x in text.split("x")]
    if len(dims) == 1:
        dims = dims * 3
    return dtype, (dims[0], dims[1], dims[2])


class Alternatives:
    """Builds Impls from the DP's memo with some nodes forced to other actions."""

    def __init__(self, search: Search) -> None:
        self.search = search
        self.target = search.target

    def best_action(self, ls: LogicalSpec, limits: Limits) -> int | None:
        r = self.search._solve(ls, limits).result
        return r.action if isinstance(r, Solution) else None

    def build(
        self, ls: LogicalSpec, limits: Limits, force: dict[Path, int], path: Path = ()
    ) -> Impl | None:
        idx = force.get(path)
        if idx is None:
            idx = self.best_action(ls, limits)
            if idx is None:
                return None
        action, plan = actions_for(ls, self.target)[idx]
        child_limits = subtract(limits, plan.own) if plan.own != ZERO else limits
        if child_limits is None:
            return None
        children = []
        main = plan.const
        for j, (c, coef) in enumerate(zip(plan.children, plan.coefs)):
            child = self.build(c, child_limits, force, (*path, j))
            if child is None:
                return None
            assert child.cost is not None
            main += coef * child.cost.main
            children.append(child)
        node = action.build(ls, plan, tuple(children))
        return replace(node, cost=Cost(main, ZERO, 0))

    def decision_points(
        self, ls: LogicalSpec, limits: Limits, path: Path = ()
    ) -> list[tuple[Path, LogicalSpec, Limits, int]]:
        """Every node of the optimal tree: (path, spec, limits, chosen action)."""
        idx = self.best_action(ls, limits)
        if idx is None:
            return []
        out = [(path, ls, limits, idx)]
        _, plan = actions_for(ls, self.target)[idx]
        child_limits = subtract(limits, plan.own) if plan.own != ZERO else limits
        assert child_limits is not None
        for j, c in enumerate(plan.children):
            out += self.decision_points(c, child_limits, (*path, j))
        return out


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for t in range(i, j + 1):
                r[order[t]] = (i + j) / 2 + 1
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx and vy else float("nan")


_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
%(includes)s
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
                          return t.tv_sec + 1e-9 * t.tv_nsec; }
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(void) {
    %(lt)s *a = aligned_alloc(64, %(abytes)d); %(lt)s *b = aligned_alloc(64, %(bbytes)d);
    float *c = aligned_alloc(64, %(cbytes)d);
    for (long i = 0; i < %(avol)d; i++) a[i] = (%(lt)s)%(one)s;
    for (long i = 0; i < %(bvol)d; i++) b[i] = (%(lt)s)%(one)s;
    memset(c, 0, %(cbytes)d);
    enum { N = %(n)d, ROUNDS = %(rounds)d };
    long reps[N];
    double t[N][ROUNDS];
    for (int f = 0; f < N; f++) {
        long r = 1;
        for (;;) {
            double t0 = now();
            for (long q = 0; q < r; q++) CALL(f);
            if (now() - t0 > %(sample)g) break;
            r *= 2;
        }
        reps[f] = r;
    }
    for (int round = 0; round < ROUNDS; round++)
        for (int g = 0; g < N; g++) {
            int f = (g + round) %% N;
            double t0 = now();
            for (long q = 0; q < reps[f]; q++) CALL(f);
            t[f][round] = (now() - t0) / reps[f];
        }
    for (int f = 0; f < N; f++) {
        qsort(t[f], ROUNDS, sizeof(double), cmp);
        printf("%%d %%.9e\n", f, t[f][ROUNDS / 2]);
    }
    return 0;
}
"""


def time_programs(impls: list[Impl], isa: str, ls: LogicalSpec, min_time: float) -> list[float]:
    """Median seconds per call of each program, timed round-robin in one executable."""
    a, b, c = ls.operands
    bf16 = a.dtype.value == "bf16"
    rounds = 15
    sample = max(0.002, min_time / rounds)
    with tempfile.TemporaryDirectory(prefix="morello-fidelity-") as d:
        work = FsPath(d)
        objs = []
        flags = kernel_flags(isa)
        for i, impl in enumerate(impls):
            g = generate_c(impl, f"prog{i}", isa)
            (work / f"prog{i}.c").write_text(g.c_source)
            (work / f"prog{i}.h").write_text(g.header)
            obj = work / f"prog{i}.o"
            subprocess.run(
                ["gcc", *flags, "-c", str(work / f"prog{i}.c"), "-o", str(obj)], check=True
            )
            objs.append(str(obj))
        cases = "".join(f"case {i}: prog{i}(a, b, c); break; " for i in range(len(impls)))
        src = _HARNESS % {
            "includes": "".join(f'#include "prog{i}.h"\n' for i in range(len(impls)))
            + f"#define CALL(f) do {{ switch (f) {{ {cases}}} }} while (0)",
            "lt": "uint16_t" if bf16 else "float",
            "one": "0x3f80" if bf16 else "0.5f",
            "abytes": _round64(a.volume * a.dtype.size),
            "bbytes": _round64(b.volume * b.dtype.size),
            "cbytes": _round64(c.volume * 4),
            "avol": a.volume,
            "bvol": b.volume,
            "n": len(impls),
            "rounds": rounds,
            "sample": sample,
        }
        (work / "h.c").write_text(src)
        exe = work / "h"
        subprocess.run(
            ["gcc", "-O2", "-std=gnu11", "-I", d, str(work / "h.c"), *objs, "-o", str(exe)],
            check=True,
        )
        out = subprocess.run(
            ["taskset", "-c", "0", str(exe)], check=True, capture_output=True, text=True
        ).stdout
    secs = [math.nan] * len(impls)
    for line in out.splitlines():
        idx, t = line.split()
        secs[int(idx)] = float(t)
    return secs


def _round64(n: int) -> int:
    return -(-n // 64) * 64


def study(shape: str, isa: str, n: int, min_time: float) -> None:
    dtype, (m, k, nn) = _parse_shape(shape)
    ls = intern(parse_spec(matmul_spec_text(1, m, k, nn, dtype=dtype)))
    target = get_target(isa)
    search = Search(target)
    limits = target.max_limits
    alt = Alternatives(search)

    def collect() -> list[tuple[int, str, Impl]]:
        found: list[tuple[int, str, Impl]] = []
        best = alt.build(ls, limits, {})
        assert best is not None and best.cost is not None
        found.append((best.cost.main, "DP choice", best))
        for path, spec, _lim, chosen in alt.decision_points(ls, limits):
            for idx, (action, _) in enumerate(actions_for(spec, target)):
                if idx == chosen:
                    continue
                impl = alt.build(ls, limits, {path: idx})
                if impl is not None and impl.cost is not None:
                    where = "/".join(map(str, path)) or "root"
                    found.append((impl.cost.main, f"{where}: {action.describe()}", impl))
        return found

    found = run_deep(collect)
    assert isinstance(found, list)
    programs: dict[str, tuple[int, str, Impl]] = {}
    for cost, label, impl in sorted(found, key=lambda x: x[0]):
        src = generate_c(impl, "kernel", isa).c_source
        if src not in programs:
            programs[src] = (cost, label, impl)
    ranked = sorted(programs.values(), key=lambda x: x[0])
    # Half the budget on the cheapest programs, half spread evenly over the rest of the
    # ranking, so that the correlation sees more than near-ties.
    head = max(2, n // 2)
    chosen = ranked[:head]
    rest = ranked[head:]
    want = min(len(rest), max(0, n - head))
    for i in range(want):
        chosen.append(rest[(i * (len(rest) - 1)) // max(1, want - 1)] if want > 1 else rest[-1])
    print(
        f"\n## {dtype} {m}x{k}x{nn} on {isa}: {len(found)} single-decision alternatives, "
        f"{len(programs)} distinct programs, measuring {len(chosen)}",
        flush=True,
    )
    secs_all = time_programs([c[2] for c in chosen], isa, ls, min_time * len(chosen))
    rows = []
    for (cost, label, _impl), secs in zip(chosen, secs_all):
        gf = ls.flops() / secs / 1e9
        rows.append((cost, secs, label, gf))
        print(f"  cost {cost:>12}  {secs * 1e6:10.2f} us  {gf:7.1f} GF/s  {label}", flush=True)
    if len(rows) < 2:
        print("  too few programs measured")
        return
    rho = spearman([float(r[0]) for r in rows], [r[1] for r in rows])
    dp = next(r for r in rows if r[2] == "DP choice")
    fastest = min(rows, key=lambda r: r[1])
    rank = sorted(r[1] for r in rows).index(dp[1]) + 1
    print(f"  Spearman rank correlation (model cost vs measured time): {rho:+.2f}")
    print(
        f"  DP choice: {dp[1] * 1e6:.2f} us, rank {rank} of {len(rows)} measured; fastest: "
        f"{fastest[1] * 1e6:.2f} us ({fastest[2]}); DP / fastest = {dp[1] / fastest[1]:.2f}x"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shapes", default="64,1x1024x1024")
    ap.add_argument("--target", default="avx512")
    ap.add_argument("-n", type=int, default=12, help="programs to measure per Spec")
    ap.add_argument("--min-time", type=float, default=0.3)
    args = ap.parse_args(argv)
    for shape in args.shapes.split(","):
        study(shape, args.target, args.n, args.min_time)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
