"""Fused pipelines (``gelu(x @ w + b)``) against the unfused numpy path and fused peers.

    python benchmarks/pipelines.py                                   # the default MLP rows
    python benchmarks/pipelines.py --shapes 16x768x3072 --exprs 'gelu(x @ w + b)'
    python benchmarks/pipelines.py --exprs 'silu(x @ w.T + b)' --min-time 0.2 --out mlp.md
    python benchmarks/pipelines.py --offset 16        # every array 16 bytes past a line
    python benchmarks/pipelines.py --exprs 'softmax((q @ k.T) * s) @ v' --scalars s \
        --shapes 128x64x128,512x64x512                       # attention: seq x d x seq

Each (expression, shape) is synthesized (replayed from the persistent cache when it is
there, so a second run only times), then `morello_build.harness.pipeline_bench` times the
kernel through ctypes beside numpy (OpenBLAS matmul, then the epilogue as numpy passes),
BLAS sgemm then C loops (OpenBLAS, and MKL when installed),
onnxruntime (its optimized graph of the same ops), jax.jit (XLA CPU) and oneDNN (one matmul
primitive with the epilogue as post-ops, where the pipeline is one), one thread each,
after checking every output against the float64 reference. A ratio is the peer's median
time over morello's: > 1.00x means morello is faster.

Shapes are ``MxKxN``: x is [M, K], w is [K, N] ([N, K] when the expression says ``w.T``),
a second product's matrix [N, K] (``gelu(x @ w1 + b) @ w2``: an MLP back to width K),
the names given to ``--scalars`` one value [1], and every other input a vector [N] (the
current width). Without ``@``, x is [M, N].
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
import time
from pathlib import Path

from morello_build.api import pipeline_spec_text, synthesize_kernel
from morello_build.errors import MorelloError
from morello_build.harness.pipeline_bench import (
    MORELLO,
    PipelineBench,
    bench_pipeline,
    peers_for,
)
from morello_build.ir.expr import FUNCTIONS
from morello_build.machine.isa import host_cpu_name

EXPRS = ("relu(x @ w + b)", "gelu(x @ w + b)")
SHAPES = ",".join(f"{m}x{k}x{n}" for m in (1, 16, 128) for k, n in ((768, 3072), (3072, 768)))


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = text.strip().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected MxKxN, e.g. 16x768x3072")
    m, k, n = map(int, parts)
    return m, k, n


def expr_inputs(
    expr: str, m: int, k: int, n: int, scalars: frozenset[str] = frozenset()
) -> dict[str, tuple[int, ...]]:
    """The input shapes of `expr` at M, K, N, in the order the names first appear: x [M, K],
    w [K, N], a later product's matrix [N, K] (back to K, as an MLP's second layer), a
    gate's (x @ w3, x read again) [K, N], the `scalars` [1], every other input a vector of
    the current width; a name written ``.T`` is stored transposed."""
    tokens = re.findall(r"[A-Za-z_]\w*(?:\.T\b)?|@", expr)
    shapes: dict[str, tuple[int, ...]] = {}
    after_at, width = False, k if "@" in expr else n
    prev, gate = "", False  # the last input named; whether this `@` reads the first again
    for tok in tokens:
        name, transposed = tok.removesuffix(".T"), tok.endswith(".T")
        if tok == "@":
            after_at, gate = True, len(shapes) > 1 and prev == next(iter(shapes))
            continue
        if name in FUNCTIONS or name in shapes:
            prev, after_at = name, False
            continue
        if name in scalars:
            shapes[name] = (1,)
        elif not shapes:
            shapes[name] = (m, width)
        elif after_at and gate:
            shapes[name] = (n, k) if transposed else (k, n)
        elif after_at:
            dims = (width, n if width == k else k)
            width = dims[1]
            shapes[name] = dims[::-1] if transposed else dims
        else:
            shapes[name] = (width,)
        prev, after_at = name, False
    return shapes


def cell(bench: PipelineBench, name: str) -> str:
    row = bench.row(name)
    if row.ms is not None:
        return f"{row.ms:.4g}"
    return "wrong" if row.status.startswith("wrong") else "n/a"


def ratio(bench: PipelineBench, fused: bool) -> str:
    best = bench.best(fused=fused)
    if best is None or best.speedup is None:
        return "n/a"
    return f"{best.speedup:.2f}x ({best.name.split(' ')[0]})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="\n\n".join(__doc__.split("\n\n")[1:]) if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--target", default="avx2", help="kernel ISA (default avx2)")
    ap.add_argument("--shapes", default=SHAPES, help=f"comma-separated MxKxN (default {SHAPES})")
    ap.add_argument(
        "--exprs",
        nargs="+",
        default=list(EXPRS),
        help="pipeline expressions, each one argument (default: %(default)s)",
    )
    ap.add_argument(
        "--scalars",
        default="",
        help="comma-separated input names that are one value [1] (e.g. s in (q @ k.T) * s)",
    )
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds timed per implementation")
    ap.add_argument(
        "--offset",
        type=int,
        default=None,
        metavar="BYTES",
        help="place every input and the kernel's output BYTES past a 64-byte boundary (0:"
        " aligned; 16: where numpy puts large arrays) [default: wherever numpy puts them]",
    )
    ap.add_argument("--dtype", default="f32", choices=("f32", "bf16"), help="x and w dtype")
    ap.add_argument("--no-cache", action="store_true", help="synthesize without the cache")
    ap.add_argument("--out", type=Path, help="also write the Markdown table to this file")
    args = ap.parse_args(argv)
    try:
        shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    scalars = frozenset(name.strip() for name in args.scalars.split(",") if name.strip())
    # --dtype bf16 makes every product's matrices bf16: the bf16 peers run too
    peer_list = peers_for([args.dtype])
    peers = [p.name for p in peer_list]
    head = ["expression", "M x K x N", f"{MORELLO} ms", *(f"{p} ms" for p in peers)]
    head += ["vs best unfused", "vs best fused peer"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    notes: dict[str, None] = {}
    jobs = [(e, s) for e in args.exprs for s in shapes]
    for i, (expr, (m, k, n)) in enumerate(jobs, 1):
        tag = f"[{i}/{len(jobs)}] {expr} {m}x{k}x{n}"
        try:
            t0 = time.perf_counter()
            declared = expr_inputs(expr, m, k, n, scalars)
            text = pipeline_spec_text(expr, declared, dtype=args.dtype)
            kernel = synthesize_kernel(
                text, name="pipeline", target=args.target, use_cache=not args.no_cache
            ).kernel
            print(f"{tag}: synthesized in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            t0 = time.perf_counter()
            bench = bench_pipeline(
                kernel, min_time=args.min_time, offset=args.offset, peers=peer_list
            )
            print(f"{tag}: timed in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        except MorelloError as exc:
            print(f"{tag}: error: {exc}", file=sys.stderr)
            cells = [f"error: {str(exc).splitlines()[0]}"] + [""] * (len(head) - 3)
            lines.append(f"| `{expr}` | {m}x{k}x{n} | " + " | ".join(cells) + " |")
            continue
        cells = [cell(bench, name) for name in (MORELLO, *peers)]
        cells += [ratio(bench, fused=False), ratio(bench, fused=True)]
        lines.append(f"| `{expr}` | {m}x{k}x{n} | " + " | ".join(cells) + " |")
        skip = ("one thread", "checked")  # said once below / per row
        notes.update(dict.fromkeys(note for note in bench.notes if not note.startswith(skip)))
        for row in bench.rows:
            if row.status != "ok":
                notes[f"{expr} {m}x{k}x{n}: {row.name}: {row.status}"] = None
    now = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    doc = [
        f"# Pipelines: morello vs numpy, BLAS + C, onnxruntime, jax, oneDNN ({args.target}, {args.dtype})",
        "",
        f"CPU: {host_cpu_name()}  ",
        f"Date: {now}",
        "",
        *lines,
        "",
        "Times: medians in ms per call, one thread each, all called from Python (morello "
        "through ctypes), timed round-robin. Ratios: the best peer's median over morello's "
        "(> 1.00x: morello is faster). Every output was checked against the float64 "
        "reference (harness/pipeline_reference.py) before timing.",
        "",
        *(f"- {n}" for n in notes),
    ]
    text = "\n".join(doc) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
