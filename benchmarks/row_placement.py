"""Row kernels timed with `out` at chosen distances past `x`: does placement change the speed?

    python benchmarks/row_placement.py                              # this tree
    python benchmarks/row_placement.py --ref 8646452                # ... and a git ref beside it
    python benchmarks/row_placement.py --ops softmax,exp --shape 8x131072 --distances 16,2048

`out = np.empty_like(x)` right after an `x` of a whole number of MiB puts `out` 16-64 bytes
past `x` modulo 1 MiB, where a forward loop's loads of `x` wait on its own stores to `out`
(docs/softmax.md, "Arrays a few bytes apart"). For each op, the kernel of each tree (this
one, then each `--ref`, exported with `git archive` and run from its own directory) is
compiled to a shared library and called through ctypes in this process, pinned to one CPU,
with `x` page-aligned and `out` `d` bytes past a MiB boundary after `x` (`d` modulo 1 MiB;
negative: `out` just before it; 4112 is 16 modulo 4 KiB only). Rounds
alternate the trees and distances; a round's figure is the best of `--calls` calls, the
table the median of the rounds, in microseconds, and each tree's time over its own time at
the far distance (the first of `--distances`). Record the CPU (`lscpu`) with every table.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.synth_speed import export_ref  # noqa: E402
from morello_build.api import row_spec_text  # noqa: E402
from morello_build.harness.compile import (  # noqa: E402
    build_shared_library,
    find_compiler,
    kernel_flags,
)
from morello_build.ir.spec import BROADCAST_KINDS, broadcast_dims  # noqa: E402
from morello_build.machine.target import TUNES  # noqa: E402


def kernel_library(
    tree: Path | None, op: str, rows: int, n: int, target: str, tune: str, into: Path
) -> ctypes._CFuncPtr:
    """`op` synthesized by `tree` (None: this tree), built in `into`, loaded: its `k`."""
    into.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "morello_build", "synth", row_spec_text(op, rows, n)]
    cmd += ["--target", target, "--format", "c", "--name", "k", "-o", str(into / "k.c")]
    if tune != "generic":  # trees from before `--tune` existed take the default
        cmd += ["--tune", tune]
    cmd += ["--header", str(into / "k.h"), "--no-cache"]
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    subprocess.run(cmd, cwd=tree or REPO, env=env, check=True, capture_output=True, text=True)
    files = {name: (into / name).read_text() for name in ("k.c", "k.h")}
    flags = kernel_flags(target)
    lib = build_shared_library(find_compiler("gcc"), into, files, "k", flags=flags, libs=["-lm"])
    fn = ctypes.CDLL(str(lib)).k
    fn.restype = None
    return fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ops", default="softmax,exp,gelu_erf,relu,add_row")
    ap.add_argument("--shape", default="32x131072", help="ROWSxN (default 32x131072)")
    ap.add_argument("--distances", default="2048,-64,0,16,32,64,128,200,256,384,512,4112")
    ap.add_argument("--ref", action="append", default=[], help="a git ref to time beside")
    ap.add_argument("--target", default="avx512", help="avx512 (default) or avx2")
    ap.add_argument(
        "--tune",
        default="generic",
        choices=TUNES,
        help="the tuning to synthesize for (generic, the default, tests the direction on "
        "Intel CPUs; zen3/zen4/zen5 run forward)",
    )
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args(argv)
    rows, n = (int(v) for v in args.shape.split("x"))
    distances = [int(v) for v in args.distances.split(",")]
    ops = args.ops.split(",")
    trees = ["this tree", *args.ref]
    with tempfile.TemporaryDirectory(prefix="mb-placement-") as tmp_name:
        tmp = Path(tmp_name)
        roots: list[Path | None] = [None]
        roots += [export_ref(r, tmp / f"ref{i}") for i, r in enumerate(args.ref)]
        fns = {
            (op, t): kernel_library(root, op, rows, n, args.target, args.tune, tmp / f"k{t}_{op}")
            for op in ops
            for t, root in enumerate(roots)
        }
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        nbytes = rows * n * 4
        mib = 1 << 20
        span = -(-nbytes // mib) * mib + mib  # out at span + d: d modulo 1 MiB past x
        buf = np.zeros(span + nbytes + 2 * mib, dtype=np.uint8)
        base = (-buf.ctypes.data) % 4096
        x = buf[base : base + nbytes].view(np.float32)
        x[:] = np.random.default_rng(0).uniform(-8.0, 8.0, size=rows * n).astype(np.float32)
        times: dict[tuple[str, int, int], list[float]] = {}
        for _ in range(args.rounds):
            for op in ops:
                b = None
                if op in BROADCAST_KINDS:
                    b = np.ones(tuple((rows, n)[d] for d in broadcast_dims(op)), dtype=np.float32)
                for d in distances:
                    out = base + span + d
                    ptrs = [x.ctypes.data, *([b.ctypes.data] if b is not None else [])]
                    ptrs.append(buf.ctypes.data + out)
                    call = [ctypes.c_void_p(p) for p in ptrs]
                    for t in range(len(trees)):
                        fn = fns[op, t]
                        fn(*call)
                        best = float("inf")
                        for _ in range(args.calls):
                            t0 = time.perf_counter()
                            fn(*call)
                            best = min(best, time.perf_counter() - t0)
                        times.setdefault((op, d, t), []).append(best)
    head = " | ".join(f"{name} us | {name} / far" for name in trees)
    print(
        f"{args.target} (tune {args.tune}), {args.shape}, rounds {args.rounds}, best of {args.calls} calls each\n"
    )
    print(f"| op | out - x (bytes) | {head} |")
    print("|---|---|" + "---|---|" * len(trees))
    for op in ops:
        for d in distances:
            cells = []
            for t in range(len(trees)):
                med = statistics.median(times[op, d, t])
                far = statistics.median(times[op, distances[0], t])
                cells.append(f"{med * 1e6:.0f} | {med / far:.2f}x")
            print(f"| {op} | {d} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
