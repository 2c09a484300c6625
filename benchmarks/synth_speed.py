"""Cold synthesis speed of source trees side by side: Specs solved, seconds, Specs/s, peak RSS.

    python benchmarks/synth_speed.py                              # this tree, the default cases
    python benchmarks/synth_speed.py --ref 72d44f3                # ... and a git ref beside it
    python benchmarks/synth_speed.py --cases avx2:f32:64,avx2:bf16:128 --ref main --ref HEAD~3

Rows per case: this tree with its search core compiled by mypyc (a copy of the tree built in
a temporary directory, as a wheel build does; skipped with `--no-compiled`), this tree as
pure Python (`MORELLO_PURE_PYTHON=1`), then each `--ref`. `--example` adds a second table: the
example project's cold and warm `pip install` with a wheel of each tree (this tree built
compiled and with `MORELLO_BUILD_PURE=1`, each ref as it builds), each in a fresh venv with an
empty cache. A case is `ISA:DTYPE:N` (an N^3 matmul). Each synthesis runs in a fresh process with the
persistent cache disabled, so every row is cold and rows are comparable; peak RSS is what the
child reports for itself (`ru_maxrss`). A `--ref` is exported with `git archive` into a
temporary directory and imported from there, so it needs no checkout. The speed-up column is
the first tree's seconds over the row's. Synthesis needs no hardware of the target ISA, so
avx512 and amx cases run on any x86 host. Record the CPU (`lscpu`) with every table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from morello_build.machine.isa import host_cpu_name

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = "avx2:f32:64,avx2:f32:128,avx2:f32:512,avx512:f32:512,avx2:bf16:256,amx:bf16:256"

CHILD = r"""
import json, resource, sys, time
from morello_build.api import matmul_spec_text, synthesize
isa, dtype, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
s = synthesize(matmul_spec_text(1, n, n, n, dtype=dtype), isa, use_cache=False)
seconds = time.perf_counter() - t0
import morello_build, morello_build.search.dp as dp
print(json.dumps({"package": morello_build.__file__, "native": not dp.__file__.endswith(".py"),
                  "seconds": seconds, "solved": s.solved, "cost": s.impl.cost.main,
                  "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


@dataclass(frozen=True)
class Case:
    isa: str
    dtype: str
    n: int

    @property
    def label(self) -> str:
        return f"{self.isa} {self.dtype} {self.n}^3"


@dataclass(frozen=True)
class Row:
    seconds: float
    solved: int
    cost: int
    peak_mib: float


def parse_cases(text: str) -> list[Case]:
    cases = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or parts[1] not in ("f32", "bf16") or not parts[2].isdigit():
            raise SystemExit(
                f"--cases: expected ISA:DTYPE:N items (e.g. avx2:f32:64), got {item!r}"
            )
        cases.append(Case(parts[0], parts[1], int(parts[2])))
    return cases


def export_ref(ref: str, into: Path, *paths: str) -> Path:
    """`paths` of git ref `ref` (its whole tree when none), unpacked under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, *paths],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--ref {ref}: {archive.stderr.decode().strip()}")
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def compile_tree(into: Path) -> Path:
    """A copy of this tree's package with the modules of `native.CORE_MODULES` compiled by
    mypyc in place (what setup.py does for a wheel)."""
    pkg = into / "morello_build"
    shutil.copytree(REPO / "morello_build", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(into))
    try:
        from morello_build.native import CORE_MODULES
    finally:
        sys.path.remove(str(into))
    files = [m.replace(".", "/") + ".py" for m in CORE_MODULES]
    print(f"(compiling {len(files)} modules with mypyc ...)", file=sys.stderr, flush=True)
    out = subprocess.run(
        [sys.executable, "-m", "mypyc", *files], cwd=into, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return into


def run(
    case: Case, tree: Path, timeout: float, pure: bool = False, native: bool = False
) -> Row | str:
    """One cold synthesis of `case` with the package of `tree`; a string says why it failed."""
    env = dict(os.environ, MORELLO_NO_CACHE="1", PYTHONPATH=str(tree))
    env.pop("MORELLO_PURE_PYTHON", None)
    if pure:
        env["MORELLO_PURE_PYTHON"] = "1"
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, case.isa, case.dtype, str(case.n)],
            env=env,
            cwd=tree,  # `python -c` puts the working directory first on sys.path
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return f"failed: {lines[-1] if lines else f'exit {out.returncode}'}"
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(doc["package"]).resolve().is_relative_to(tree.resolve()):
        return f"failed: imported {doc['package']}, not the tree's package"
    if pure and doc["native"]:
        return "failed: MORELLO_PURE_PYTHON=1 still imported the compiled core"
    if native and not doc["native"]:
        return "failed: the compiled core was not imported"
    return Row(doc["seconds"], doc["solved"], doc["cost"], doc["peak_kib"] / 1024)


def example_install(src: Path, work: Path, pure_build: bool, timeout: float) -> list[float] | str:
    """Seconds to build a wheel of `src`, then to `pip install` its example project cold
    (fresh venv, empty cache) and warm (reinstalled over the filled cache)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MORELLO_", "PYTHONPATH"))}
    env["MORELLO_CACHE_DIR"] = str(work / "cache")
    if pure_build:
        env["MORELLO_BUILD_PURE"] = "1"
    dist, venv = work / "dist", work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    example = str(src / "example_project")
    steps = [
        [py, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
        [py, "-m", "pip", "install", "-q", "--find-links", str(dist), example],
        [py, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps"]
        + ["--find-links", str(dist), example],
    ]
    seconds = []
    for cmd in steps:
        t0 = time.perf_counter()
        try:
            out = subprocess.run(
                cmd, env=env, cwd=work, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {timeout:.0f} s"
        if out.returncode != 0:
            lines = out.stderr.strip().splitlines()
            return f"failed: {lines[-1] if lines else f'exit {out.returncode}'}"
        seconds.append(time.perf_counter() - t0)
    return seconds


def example_table(refs: list[str], tmp: Path, timeout: float) -> None:
    rows = [("this tree, compiled wheel", REPO, False), ("this tree, pure wheel", REPO, True)]
    rows += [(ref, export_ref(ref, tmp / f"src{i}"), False) for i, ref in enumerate(refs)]
    print()
    print("| example project | wheel build s | cold pip install s | warm s | speed-up (cold) |")
    print("|---|---|---|---|---|")
    first: float | None = None
    for i, (name, src, pure_build) in enumerate(rows):
        r = example_install(src, tmp / f"example{i}", pure_build, timeout)
        if isinstance(r, str):
            print(f"| {name} | {r} | | | |", flush=True)
            continue
        first = first or r[1]
        print(
            f"| {name} | {r[0]:.1f} | {r[1]:.1f} | {r[2]:.1f} | {first / r[1]:.2f}x |", flush=True
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cases", default=DEFAULT_CASES, help=f"[default: {DEFAULT_CASES}]")
    p.add_argument(
        "--ref", action="append", default=[], help="a git ref to time beside this tree (repeatable)"
    )
    p.add_argument(
        "--no-compiled",
        action="store_true",
        help="no row for this tree compiled with mypyc (saves its ~1 min build)",
    )
    p.add_argument(
        "--example",
        action="store_true",
        help="also time the example project's cold and warm pip install per tree",
    )
    p.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds per synthesis [default: 1800]"
    )
    args = p.parse_args(argv)
    cases = parse_cases(args.cases)
    with tempfile.TemporaryDirectory(prefix="morello-synth-speed-") as tmp:
        trees: list[tuple[str, Path, bool, bool]] = []  # name, package root, pure, native
        if not args.no_compiled:
            compiled = compile_tree(Path(tmp) / "compiled")
            trees.append(("this tree, compiled", compiled, False, True))
        trees.append(("this tree, pure Python", REPO, True, False))
        for i, ref in enumerate(args.ref):
            trees.append((ref, export_ref(ref, Path(tmp) / str(i), "morello_build"), False, False))
        print(f"CPU: {host_cpu_name()}, {os.cpu_count()} CPUs\n")
        print("| case | tree | Specs solved | seconds | Specs/s | peak MiB | speed-up | cost |")
        print("|---|---|---|---|---|---|---|---|")
        for case in cases:
            first: Row | None = None
            for name, tree, pure, native in trees:
                r = run(case, tree, args.timeout, pure, native)
                if isinstance(r, str):
                    print(f"| {case.label} | {name} | {r} | | | | | |", flush=True)
                    continue
                first = first or r
                print(
                    f"| {case.label} | {name} | {r.solved} | {r.seconds:.1f} | "
                    f"{r.solved / r.seconds:,.0f} | {r.peak_mib:.0f} | "
                    f"{first.seconds / r.seconds:.2f}x | {r.cost} |",
                    flush=True,
                )
        if args.example:
            example_table(args.ref, Path(tmp), args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
