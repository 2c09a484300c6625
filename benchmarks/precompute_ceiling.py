"""How far sharing work between precompute workers could go: the grid's units solved in one
process, in dependency order, with one memo, and the best two- (or N-) worker schedule of
those times.

    python benchmarks/precompute_ceiling.py                       # avx2, f32+bf16, 4,8,16
    python benchmarks/precompute_ceiling.py --sizes 8,16,32 --workers 2,4

A unit is one dtype and shape (M, K, N) in every B layout, as `plan_waves` deals them; a
matmul's sub-problems are smaller matmuls of its dtype, so a unit depends on every unit of
its dtype whose shape is no larger on each side. Each unit is solved after those, in one
`Search` over an in-memory memo, so its time is its own work only (what it would cost a
worker that had every earlier answer for free). Printed: the total, the part spent listing
programs (`needs.least_limits`, the walk a worker repeats for Specs another worker solved),
the critical path through the dependencies, and for each worker count the makespan of a
list schedule (ready units, longest remaining path first) and the speed-up it bounds.
`morello precompute` pays more than this: moving answers between workers, each worker's
flush, the coordinator's merge (docs/precompute.md, "Sharing within a family").
"""

from __future__ import annotations

import argparse
import sys
import time

from morello_build.errors import MorelloError
from morello_build.ir.spec import Spec, intern
from morello_build.ir.text import parse_spec
from morello_build.machine.isa import host_cpu_name
from morello_build.search import needs
from morello_build.search.dp import Search
from morello_build.search.memo_protocol import DictMemo
from morello_build.search.precompute import Grid, GridSpec, parse_sizes
from morello_build.search.session import search_session

Unit = tuple[str, int, int, int]  # dtype, M, K, N


def below(u: Unit, v: Unit) -> bool:
    """`u` is a sub-problem family of `v`: the same dtype, no side larger, not `v`."""
    return u != v and u[0] == v[0] and all(a <= b for a, b in zip(u[1:], v[1:], strict=True))


def solve_units(grid: Grid) -> tuple[list[tuple[Unit, float, float]], float]:
    """Each unit's (seconds, listing seconds), solved in dependency order in one session.
    A unit's listing is timed on its own: `needs.least_limits` of its grid Specs lists
    every Spec below them not listed yet, the walk the search's first miss would make."""
    units: dict[Unit, list[GridSpec]] = {}
    for s in grid.specs():
        units.setdefault((s.dtype, s.m, s.k, s.n), []).append(s)
    order = sorted(units, key=lambda u: (u[1] * u[2] * u[3], u))  # a larger unit comes later
    target = grid.target()
    rows = []
    with search_session():
        search = Search(target, DictMemo())
        start = time.perf_counter()
        for u in order:
            specs = [intern(parse_spec(s.text(grid.threads))) for s in units[u]]
            t = time.perf_counter()
            for ls in specs:
                needs.least_limits(ls, target)
            listed = time.perf_counter()
            for ls in specs:
                search.solve(Spec(ls, target.max_limits))
            rows.append((u, time.perf_counter() - t, listed - t))
        total = time.perf_counter() - start
    return rows, total


def critical_path(times: dict[Unit, float]) -> float:
    """The longest chain of dependent units."""
    finish: dict[Unit, float] = {}
    for u in sorted(times, key=lambda u: u[1] * u[2] * u[3]):
        finish[u] = times[u] + max((finish[v] for v in finish if below(v, u)), default=0.0)
    return max(finish.values(), default=0.0)


def list_schedule(times: dict[Unit, float], workers: int) -> float:
    """Makespan of `workers` workers taking ready units, the longest remaining path first."""
    remaining: dict[Unit, float] = {}
    for u in sorted(times, key=lambda u: -(u[1] * u[2] * u[3])):
        remaining[u] = times[u] + max((remaining[v] for v in remaining if below(u, v)), default=0)
    free = [0.0] * workers
    done: dict[Unit, float] = {}
    while len(done) < len(times):
        ready = [u for u in times if u not in done and all(v in done for v in times if below(v, u))]
        unit = max(ready, key=lambda u: (remaining[u], u))
        w = min(range(workers), key=lambda i: free[i])
        start = max([free[w], *(done[v] for v in times if below(v, unit))])
        done[unit] = free[w] = start + times[unit]
    return max(done.values(), default=0.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isa", default="avx2", help="target ISA [avx2]")
    ap.add_argument("--dtypes", default="f32,bf16", help="comma list [f32,bf16]")
    ap.add_argument("--sizes", default="4,8,16", help="matmul sides, comma list [4,8,16]")
    ap.add_argument("--workers", default="2", help="worker counts to schedule, comma list [2]")
    args = ap.parse_args(argv)
    try:
        counts = [int(w) for w in args.workers.split(",") if w.strip()]
        grid = Grid(
            args.isa,
            "generic",
            1,
            tuple(d.strip() for d in args.dtypes.split(",") if d.strip()),
            ("row", "col"),
            parse_sizes(args.sizes, None),
        )
        grid.check()
    except (ValueError, MorelloError) as e:
        ap.error(str(e))
    if not counts or any(w < 1 for w in counts):
        ap.error(f"--workers: expected positive counts, got {args.workers!r}")
    rows, total = solve_units(grid)
    times = {u: t for u, t, _ in rows}
    listing = sum(lt for _, _, lt in rows)
    path = critical_path(times)
    print(f"CPU: {host_cpu_name()}; grid: {args.isa}, {args.dtypes}, B row+col, sizes {args.sizes}")
    print(
        f"{len(rows)} units in {total:.2f} s, {listing:.2f} s of it listing programs; "
        f"critical path {path:.2f} s\n"
    )
    print("| workers | list-schedule makespan s | speed-up bound |")
    print("|---:|---:|---:|")
    for w in counts:
        span = list_schedule(times, w)
        print(f"| {w} | {span:.2f} | {sum(times.values()) / span:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
