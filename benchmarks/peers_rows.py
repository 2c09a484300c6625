"""Softmax, activations and row reductions against their peers: `benchmarks/peers.py --ops ...`.

    python benchmarks/peers.py --ops softmax                       # the issue's softmax shapes
    python benchmarks/peers.py --ops gelu,gelu_tanh,silu,relu,exp  # the activation table
    python benchmarks/peers.py --ops max,sum                       # the reductions (out[rows])
    python benchmarks/peers.py --ops softmax --shapes 1x512,8x2048@2 --min-time 0.3

Each row runs ``morello bench OP RxN --json`` in a fresh process (one cache directory for the
whole run: synthesis is not what is measured here). In that run the kernel, the -O3 loop nest,
oneDNN and a streaming read+write of the tensor (the memory bound; a reduction: a read) are timed round-robin in
one C harness, and onnxruntime and jax in Python beside the kernel called through ctypes
(`morello_build.harness.row_peers`); every peer is checked against numpy first, and one
outside the reference's bounds shows as "wrong" (not timed). A peer's cell is its median time
over the kernel's in the same loop: > 1.00x means morello-build is faster.

Goals (issue 35): >= 1.0x the best peer on every row; >= 1.5x on batch-1 rows up to 8192;
on rows whose input + output do not fit L2, >= 80% of the streaming bound.

Shapes: ``RxN`` (R rows of N), optionally prefixed ``bf16:`` and suffixed ``@T`` (T threads).
Results are merged into ``--results`` keyed by (op, shape), so tables can be built piecewise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

OPS = ("softmax", "relu", "gelu", "gelu_erf", "gelu_tanh", "silu", "exp", "max", "sum")
#: The spelling in tables and result keys (the shorthand "gelu" is the erf form).
CANONICAL = {"gelu": "gelu_erf"}
SOFTMAX_SHAPES = ",".join(
    f"{b}x{n}@{t}"
    for t in (1, 2)
    for b in (1, 8, 32)
    for n in (512, 2048, 8192, 32768, 131072, 524288)
)
ACTIVATION_SHAPES = "32x8192@1,1x524288@1,32x8192@2,1x524288@2"
C_PEERS = ("naive", "onednn")
PY_PEERS = ("onnxruntime", "jax")
STREAM = "stream-rw"


def parse_row_shape(text: str) -> tuple[str, int, int, int]:
    """`bf16:8x2048@2` -> ("bf16", 8, 2048, 2)."""
    t, dtype, threads = text.strip(), "f32", "1"
    if ":" in t:
        dtype, t = t.split(":", 1)
    if "@" in t:
        t, threads = t.split("@", 1)
    parts = t.split("x")
    if (
        dtype not in ("f32", "bf16")
        or len(parts) != 2
        or not all(p.isdigit() and int(p) > 0 for p in (*parts, threads))
    ):
        raise ValueError(f"bad shape {text!r}: expected RxN, bf16:RxN, RxN@T (T threads)")
    return dtype, int(parts[0]), int(parts[1]), int(threads)


def l2_bytes() -> int:
    """This CPU's L2 per core (sysfs), or 512 KiB (Zen 3's) when it cannot be read."""
    path = Path("/sys/devices/system/cpu/cpu0/cache/index2/size")
    try:
        text = path.read_text().strip()
    except OSError:
        return 512 * 1024
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
    return int(text.rstrip("KM")) * scale


def cpu_line(results: dict[str, Any]) -> str | None:
    """`CPU: ...`, the machines (`bench --json`'s `cpu`) the rows of a results file ran on."""
    cpus = sorted({str(d["cpu"]) for d in results.values() if isinstance(d, dict) and d.get("cpu")})
    return f"CPU: {'; '.join(cpus)}" if cpus else None


def run_row(op: str, shape: str, min_time: float, cache: str) -> dict[str, Any]:
    dtype, rows, n, threads = parse_row_shape(shape)
    cmd = [sys.executable, "-m", "morello_build", "bench", op, f"{rows}x{n}", "--json"]
    cmd += ["--dtype", dtype, "--threads", str(threads), "--min-time", str(min_time)]
    env = dict(os.environ, MORELLO_CACHE_DIR=cache)
    env.pop("MORELLO_NO_CACHE", None)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        last = (p.stderr or p.stdout).strip().splitlines()[-1:]
        return {"error": " ".join(last) or f"exit {p.returncode}", "threads": threads}
    doc: dict[str, Any] = json.loads(p.stdout)
    doc.update(op=op, rows=rows, n=n, dtype=dtype)
    return doc


def _by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in [*doc.get("results", []), *doc.get("python_results", [])]}


def _peer_cell(doc: dict[str, Any], name: str) -> str:
    r = _by_name(doc).get(name)
    if r is None:
        return "-"
    if "skipped" in r:
        return "wrong" if r["skipped"].startswith("wrong result") else "n/a"
    ratio = doc["peer_ratios"].get(name)
    return f"{ratio:.2f}x" if ratio is not None else "-"


def goal_cell(doc: dict[str, Any], l2: int) -> str:
    """The issue's goals for this row: met, or which one is missed and by how much."""
    missed = []
    ratio = doc.get("ratio")
    need = 1.5 if doc["rows"] == 1 and doc["n"] <= 8192 else 1.0
    if ratio is not None and ratio < need:
        missed.append(f"{ratio:.2f}x < {need:.1f}x")
    share = doc.get("stream_share")
    if doc["bytes"] > l2 and share is not None and share < 0.8:
        missed.append(f"{share:.0%} < 80% bound")
    return "met" if not missed else "missed: " + ", ".join(missed)


def _order(doc: dict[str, Any]) -> tuple[str, int, str, int, int]:
    return (doc["op"], doc["threads"], doc["dtype"], doc["rows"], doc["n"])


def table(results: dict[str, dict[str, Any]], ops: set[str]) -> str:
    l2 = l2_bytes()
    head = (
        "| op | shape | threads | morello GB/s | us/call | % stream bound | "
        + " | ".join(f"{p}" for p in (*C_PEERS, *PY_PEERS))
        + " | best peer | morello / best | goal |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    errors = []
    docs = [d for d in results.values() if d.get("op") in ops and "error" not in d]
    for doc in sorted(docs, key=_order):
        k = _by_name(doc)["morello-build"]
        share = doc.get("stream_share")
        cells = [
            doc["op"],
            f"{doc['dtype'] + ':' if doc['dtype'] != 'f32' else ''}{doc['rows']}x{doc['n']}",
            str(doc["threads"]),
            f"{k['gbs']:.2f}",
            f"{k['seconds'] * 1e6:.4g}",
            f"{share:.0%}" if share is not None else "-",
            *(_peer_cell(doc, p) for p in (*C_PEERS, *PY_PEERS)),
            doc.get("best_peer") or "-",
            f"{doc['ratio']:.2f}x" if doc.get("ratio") is not None else "-",
            goal_cell(doc, l2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    for key_, d in sorted(results.items()):
        if "error" in d and key_.split("/")[0] in ops:
            errors.append(f"- {key_}: {d['error']}")
    if errors:
        lines += ["", "Rows that failed:", *errors]
    return "\n".join(lines)


def footnotes(results: dict[str, dict[str, Any]], ops: set[str]) -> list[str]:
    """The distinct reasons peers were skipped, once each."""
    seen: dict[str, list[str]] = {}
    for d in results.values():
        if d.get("op") not in ops or "error" in d:
            continue
        for name, r in _by_name(d).items():
            if "skipped" in r:
                why = r["skipped"]
                if why.startswith("wrong result"):
                    why = "wrong result (outside the numpy reference's bounds), e.g. " + why[14:-1]
                seen.setdefault(f"{name}: {why}", []).append(f"{d['rows']}x{d['n']}@{d['threads']}")
    return [f"- {k} [{', '.join(v[:4])}{', ...' if len(v) > 4 else ''}]" for k, v in seen.items()]


def plot(results: dict[str, dict[str, Any]], ops: set[str], path: Path) -> None:
    """GB/s (log scale) of every implementation per row, one panel per thread count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = sorted(
        (d for d in results.values() if d.get("op") in ops and "error" not in d), key=_order
    )
    counts = sorted({d["threads"] for d in docs})
    names = ["morello-build", *C_PEERS, STREAM, *PY_PEERS]
    several = len({d["op"] for d in docs}) > 1
    fig, axes = plt.subplots(len(counts), 1, figsize=(12, 4.2 * len(counts)), squeeze=False)
    for ax, threads in zip(axes[:, 0], counts, strict=True):
        rows = [d for d in docs if d["threads"] == threads]
        labels = [f"{d['op'] + ' ' if several else ''}{d['rows']}x{d['n']}" for d in rows]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            vals = []
            for d in rows:
                r = _by_name(d).get(name, {})
                vals.append(d["bytes"] / r["seconds"] / 1e9 if "seconds" in r else 0.0)
            ax.bar([j + i * width for j in range(len(rows))], vals, width, label=name)
        ax.set_xticks([j + 0.4 for j in range(len(rows))], labels, rotation=45, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("GB/s (input + output), median")
        ax.set_title(f"{', '.join(sorted(ops))}: {threads} thread(s); a missing bar: not timed")
        ax.legend(fontsize=7, ncol=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="peers.py --ops", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--ops", required=True, help=f"comma-separated subset of {','.join(OPS)}")
    ap.add_argument(
        "--shapes",
        default=None,
        help=f"comma-separated RxN[@T] [default: softmax {SOFTMAX_SHAPES}; the other ops "
        f"{ACTIVATION_SHAPES}]",
    )
    ap.add_argument("--min-time", type=float, default=0.3)
    ap.add_argument("--results", default="benchmarks/rows_results.json")
    ap.add_argument("--png", default="benchmarks/rows.png")
    ap.add_argument("--report-only", action="store_true", help="print/plot the results file")
    args = ap.parse_args(argv)
    ops = [CANONICAL.get(o.strip(), o.strip()) for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        ap.error(f"--ops: unknown {unknown or ops}; expected some of {','.join(OPS)}")
    plan: list[tuple[str, str]] = []
    for op in ops:
        default = SOFTMAX_SHAPES if op == "softmax" else ACTIVATION_SHAPES
        for shape in (args.shapes or default).split(","):
            try:
                parse_row_shape(shape)
            except ValueError as exc:
                ap.error(f"--shapes: {exc}")
            plan.append((op, shape.strip()))
    res_path = Path(args.results)
    results: dict[str, dict[str, Any]] = {}
    if res_path.exists():
        results = json.loads(res_path.read_text())
    if not args.report_only:
        with tempfile.TemporaryDirectory(prefix="morello-rows-cache-") as cache:
            for op, shape in plan:
                print(f"[peers] {op} {shape} ...", file=sys.stderr, flush=True)
                results[f"{op}/{shape}"] = run_row(op, shape, args.min_time, cache)
                res_path.write_text(json.dumps(results, indent=1))
    cpus = cpu_line(results)
    if cpus:
        print(f"{cpus}\n")
    print(table(results, set(ops)))
    notes = footnotes(results, set(ops))
    if notes:
        print("\nPeers not timed:")
        print("\n".join(notes))
    flags = sorted({d.get("xla_flags", "") for d in results.values() if d.get("xla_flags")})
    for f in flags:
        print(f"\njax: XLA_FLAGS={f}")
    try:
        plot(results, set(ops), Path(args.png))
    except ModuleNotFoundError as exc:
        print(f"\nno plot: {exc.name} is not installed", file=sys.stderr)
    else:
        print(f"\nplot: {args.png}", file=sys.stderr)
    return 0
