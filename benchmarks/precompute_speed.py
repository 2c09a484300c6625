"""Speed of `morello precompute` on 1 and N local worker processes, and whether the tables agree.

    python benchmarks/precompute_speed.py                          # avx2, f32+bf16, 4,8,16
    python benchmarks/precompute_speed.py --sizes 8,16,32 --workers 1,2 --splits families,waves

Each row is one precompute into an empty cache root, in a fresh process (`--jobs 1` solves
in that process; more workers are spawned processes). Columns:
- grid Specs/s: grid Specs over the run's wall seconds (the useful throughput: what a user
  waits for). The 1.7x goal of issue 34 is measured on this column.
- solves/s: Specs solved by all workers together over the same seconds (includes work
  that two workers both did; duplication = solves / distinct solves).
- task seconds: each task's time in its worker (solving and encoding its pages); the rest
  of a row's seconds is spawning workers and the coordinator's validating, merging and
  writing, partly overlapped with the workers.
- same table: every grid Spec synthesized against the row's cache and against the first
  row's gives the same cost and byte-identical C, and solves nothing.
Record the CPU (`lscpu`) with every table; other load on the machine skews every row.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from morello_build.machine.isa import host_cpu_name

REPO = Path(__file__).resolve().parents[1]

RUN = r"""
import json, sys, time
from pathlib import Path
from morello_build.search import precompute as pc
isa, dtypes, sizes, workers, split, root = sys.argv[1:7]
grid = pc.Grid(isa, "generic", 1, tuple(dtypes.split(",")), ("row", "col"),
               tuple(int(s) for s in sizes.split(",")))
t0 = time.perf_counter()
engine = pc.make_engine(int(workers), None)
try:
    s = pc.precompute(grid, engine, Path(root), split=split)
finally:
    engine.close()
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "specs": s.grid_specs, "solved": s.solved,
                  "distinct": s.distinct, "tasks": s.tasks, "waves": s.waves,
                  "task_seconds": s.task_seconds}))
"""

CHECK = r"""
import hashlib, json, sys
from pathlib import Path
from morello_build.api import synthesize
from morello_build.codegen.emit import generate_c
from morello_build.search.persistent import PersistentMemo
from morello_build.search import precompute as pc
isa, dtypes, sizes, root = sys.argv[1:5]
grid = pc.Grid(isa, "generic", 1, tuple(dtypes.split(",")), ("row", "col"),
               tuple(int(s) for s in sizes.split(",")))
out = {}
for s in grid.specs():
    text = s.text(1)
    syn = synthesize(text, isa, memo=PersistentMemo(grid.target(), root=Path(root)))
    c = generate_c(syn.impl, "kernel", isa).c_source
    out[text] = [syn.impl.cost.main, hashlib.sha256(c.encode()).hexdigest(), syn.solved]
print(json.dumps(out))
"""


def child(code: str, *args: str) -> dict:  # type: ignore[type-arg]
    res = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO
    )
    if res.returncode != 0:
        raise SystemExit(f"child failed:\n{res.stderr}")
    return json.loads(res.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", default="avx2")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--workers", default="1,2", help="comma list; the first is the baseline")
    ap.add_argument("--splits", default="families", help="comma list: families, waves")
    ap.add_argument("--no-check", action="store_true", help="skip the same-table check")
    args = ap.parse_args()
    rows = []
    for w in (int(x) for x in args.workers.split(",")):
        for split in args.splits.split(",") if w > 1 else ["-"]:
            root = tempfile.mkdtemp(prefix="morello-pcbench-")
            t0 = time.perf_counter()
            r = child(RUN, args.isa, args.dtypes, args.sizes, str(w), split, root)
            wall = time.perf_counter() - t0
            check = None if args.no_check else child(CHECK, args.isa, args.dtypes, args.sizes, root)
            rows.append((w, split, r, wall, check))
            print(f"done: {w} workers, split {split}: {r['seconds']:.1f} s", file=sys.stderr)
    base = rows[0]
    grid = f"{args.isa}, {args.dtypes}, B row+col, sizes {args.sizes}"
    print(
        f"CPU: {host_cpu_name()}, {os.cpu_count()} CPUs; grid: {grid} ({base[2]['specs']} grid Specs)\n"
    )
    print(
        "| workers | split | tasks/waves | Specs solved (sum) | distinct | duplication"
        " | task seconds | seconds | grid Specs/s | solves/s | speed-up (grid Specs/s)"
        " | same table |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w, split, r, _, check in rows:
        same = "-"
        if check is not None:
            warm = all(v[2] == 0 for v in check.values())
            same = "yes" if check == base[4] and warm else "NO"
        print(
            f"| {w} | {split} | {r['tasks']}/{r['waves']} | {r['solved']} | {r['distinct']}"
            f" | {r['solved'] / r['distinct']:.3f}"
            f" | {' + '.join(f'{t:.1f}' for t in r['task_seconds'])} | {r['seconds']:.1f}"
            f" | {r['specs'] / r['seconds']:.2f} | {r['solved'] / r['seconds']:.0f}"
            f" | {base[2]['seconds'] / r['seconds']:.2f}x | {same} |"
        )
    digest = hashlib.sha256(json.dumps(base[4], sort_keys=True).encode()).hexdigest()[:12]
    if base[4] is not None:
        print(f"\nanswers digest (cost + C of every grid Spec): {digest}")


if __name__ == "__main__":
    main()
