"""Kernel speed against peers: the issue's table as Markdown plus a PNG plot.

    python benchmarks/peers.py                       # every shape on avx512 and avx2,
                                                     # the bf16 shapes on amx (the targets
                                                     # this host can run)
    python benchmarks/peers.py --targets avx512 --shapes 64,256,1x1024x1024
    python benchmarks/peers.py --shapes bf16:1x2048x16384 --results out.json   # piecewise
    python benchmarks/peers.py --repeats 3           # rows under 1.02x: 3 more runs each

Each row runs ``morello bench --json`` in a fresh process with a fresh, empty cache
directory, so synthesis is cold and its time is reported; the kernel and its peers
(OpenBLAS, MKL, MKL JIT, an -O3 loop nest) are then timed side by side in one C harness
(medians of round-robin samples); for avx2 rows the peers are held to AVX2, and on an AMX
host avx512 rows hold them to AVX-512 without AMX (`morello bench --peer-isa kernel`, the
default), as on the machines such kernels are for; on an AVX-512 host OpenBLAS is pinned to
its AVX-512 kernels (its own detection gives AMD Zen 5 AVX2 ones).
With ``--repeats N``, a row whose ratio is below ``--repeat-below`` (1.02) is benchmarked N
more times (synthesis warm) and the table shows the range of those ratios: the VM moves a
single ratio by a few percent, which decides a verdict near 1.00x.
A threaded row with a one-thread row of the same target and shape also gets a scaling line
(each threaded implementation's GF/s over its one-core GF/s). Rows run minutes apart, so
threaded rows also time their one-thread kernel in their own harness (`morello bench
--scaling`): the morello-build scaling from interleaved samples, with its range over
the repeats.
Results are merged into ``--results`` (JSON) keyed by
(target, shape), so the table can be built piecewise; the table and the plot always show
everything in that file.

Softmax and activations: ``--ops softmax`` or ``--ops gelu,gelu_tanh,silu,relu,exp`` builds
their tables instead (against oneDNN, onnxruntime, jax, a loop nest and the streaming bound;
see benchmarks/peers_rows.py for its options).

Shapes: ``N`` (N^3), ``MxKxN``, optionally prefixed ``bf16:`` (bf16 x bf16 -> f32) and
suffixed ``@T`` (T threads). The FMA peak is *measured*, in each row's own harness: a
loop of 24 independent register FMAs (zmm for avx512, 12 ymm for avx2) on the row's
threads, timed round-robin with the kernel and its peers (`morello bench --peers
...,fma-peak`), so the VM's clock swings move the kernel and its peak alike
(docs/performance.md, "Harness notes"). The same loop, run once apart, gives the peak
line of the plot. bf16 rows count against the same f32 FMA peak: on the Xeon `vdpbf16ps zmm` retires one per 2 cycles (measured the same way), half the f32
FMA flop rate, so widening to f32 is the faster path without AMX (which MKL uses). With
``--tune`` other than generic (the default ``native`` is zen3 on an AMD Zen 3 host, zen4 on
Zen 4, zen5 on Zen 5) rows are labelled with it, e.g. ``avx2-zen3``: matrix-vector kernels
there have no software prefetch (zen5's do). With zen4 and zen5 the avx512 bf16 GEMMs run
on vdpbf16ps register tiles, and their rows count against the measured vdpbf16ps peak (24 independent register vdpbf16ps,
64 flops each); other GEMM rows are the same kernels as generic ones. bf16 rows of the amx target (AMX tile
kernels) count against the AMX peak, 4 independent `tdpbf16ps` tiles in a loop, timed in
their own harness too (`morello bench --peers ...,amx-peak`).
``--ghz G`` uses the formula 2 FMA units x lanes x 2 flops x G instead (the issue's figure is 3.7 GHz, which this VM does not sustain with
AVX-512), and 1024 bf16 flops per cycle for AMX.
Matrix-vector rows (M=1) also show the kernel's speed as a percentage of a plain
streaming read of B timed in the same harness (`morello bench --peers ...,stream-read`:
4 independent vector sums over B, compiled like the naive peer), and that read's GB/s.
Timed round-robin with the kernel and the peers, the read meets the same cache state as
the kernel (e.g. whether B is still in L3 after a peer's call).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from morello_build.api import cache_target_id
from morello_build.machine.isa import ISA, host_supports, native_isa, native_tune
from morello_build.machine.target import TUNES as TARGET_TUNES
from morello_build.machine.target import TUNINGS, get_target

# Softmax and activations have a table of their own (benchmarks/peers_rows.py), beside this
# file whether it runs as a script or is loaded from its path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_rows import cpu_line  # noqa: E402
from peers_rows import main as rows_main  # noqa: E402

TARGETS = ("avx512", "avx2", "amx")
DEFAULT_SHAPES = (
    "8,16,32,64,128,256,512,100x37x250,1x1024x1024,1x2048x16384,bf16:1x2048x16384,bf16:256,512@2"
)
PEERS = ("openblas", "mkl", "mkl-jit", "naive")
MORELLO = "morello-build"
#: Shapes per target when --shapes is not given: the amx target differs from avx512 only
#: in its bf16 GEMM kernel (AMX tiles), so it gets the bf16 rows.
TARGET_SHAPES = {"amx": "bf16:256,bf16:1x2048x16384"}
TUNES = ("native", *TARGET_TUNES)
#: The peak key of bf16 rows on vdpbf16ps tiles (`--tune zen4`).
DPBF16_PEAK = "avx512-dpbf16"


def parse_shape(text: str) -> tuple[str, tuple[int, int, int], int]:
    """`bf16:1x2048x16384@2` -> ("bf16", (1, 2048, 16384), 2)."""
    t = text.strip()
    dtype, threads = "f32", "1"
    if ":" in t:
        dtype, t = t.split(":", 1)
    if "@" in t:
        t, threads = t.split("@", 1)
    parts = t.split("x")
    numbers = (*parts, threads)
    if (
        dtype not in ("f32", "bf16")
        or len(parts) not in (1, 3)
        or not all(x.isdigit() and int(x) > 0 for x in numbers)
    ):
        raise ValueError(f"bad shape {text!r}: expected N, MxKxN, bf16:..., ...@T (T threads)")
    dims = [int(x) for x in parts] * (3 if len(parts) == 1 else 1)
    return dtype, (dims[0], dims[1], dims[2]), int(threads)


def key(target: str, shape: str) -> str:
    return f"{target}/{shape}"


def row_target(target: str, tune: str) -> str:
    """The row's target label: its one-thread cache table name, the target plus its
    tuning unless generic (`avx512-zen4`, `avx2-zen3`)."""
    return cache_target_id(get_target(target, 1, tune))


def split_target(label: str) -> tuple[str, str]:
    """`avx512-zen4` -> ("avx512", "zen4"); `avx2` -> ("avx2", "generic")."""
    isa, _, tune = label.partition("-")
    return isa, tune or "generic"


def _last_line(p: subprocess.CompletedProcess[str]) -> list[str]:
    """What a failed `morello` run said last (its error message)."""
    return (p.stderr or p.stdout).strip().splitlines()[-1:]


def run_one(
    target: str,
    shape: str,
    min_time: float,
    repeats: int = 0,
    repeat_below: float = 0.0,
    tune: str = "generic",
) -> dict[str, object]:
    """Cold synthesis, then the benchmark; then, if its ratio is below `repeat_below`,
    `repeats` more benchmark runs (synthesis warm from the same cache)."""
    dtype, (m, k, n), threads = parse_shape(shape)
    with tempfile.TemporaryDirectory(prefix="morello-peers-cache-") as cache:
        env = dict(os.environ, MORELLO_CACHE_DIR=cache)
        env.pop("MORELLO_NO_CACHE", None)
        common = [
            "matmul",
            f"{m}x{k}x{n}",
            "--target",
            target,
            "--dtype",
            dtype,
            "--threads",
            str(threads),
            "--tune",
            tune,
        ]

        def morello(command: str, *args: str) -> subprocess.CompletedProcess[str]:
            argv = [sys.executable, "-m", "morello_build", command, *common, *args]
            return subprocess.run(argv, env=env, capture_output=True, text=True)

        bench = ("--json", "-q", "--min-time", str(min_time))
        # 1. Cold synthesis into the empty cache (timed by the synthesizer itself) ...
        t0 = time.perf_counter()
        p = morello("synth", "--format", "json", "-q")
        if p.returncode != 0:
            return {"error": _last_line(p)}
        synth = json.loads(p.stdout)
        # 2. ... then the benchmark, which replays the cached solution.
        beside = {"fma-peak", beside_reference(target, dtype) or "fma-peak"}
        refs = (
            "--peers",
            ",".join((*PEERS, *sorted(beside), *(("stream-read",) if m == 1 else ()))),
        )
        # A threaded row also times its one-thread kernel in the same harness.
        scaling = ("--scaling",) if threads > 1 else ()
        p = morello("bench", *refs, *scaling, *bench)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            return {"error": _last_line(p), "wall": wall}
        doc: dict[str, object] = json.loads(p.stdout)
        ratio = doc.get("ratio")
        if repeats > 0 and isinstance(ratio, float) and ratio < repeat_below:
            again, scalings = [], []
            for i in range(repeats):
                print(f"[peers]   repeat {i + 1}/{repeats}", file=sys.stderr, flush=True)
                p = morello("bench", *scaling, *bench)
                if p.returncode != 0:
                    doc["repeat_error"] = _last_line(p)
                    break
                rep = json.loads(p.stdout)
                again.append(rep.get("ratio"))
                scalings.append(rep.get("scaling"))
            doc["repeat_ratios"] = again
            if scaling:
                doc["repeat_scalings"] = scalings
    doc["tune"] = synth.get("tune", "generic")
    doc["synth_seconds"] = synth.get("seconds")
    doc["solved"] = synth.get("solved")
    doc["wall"] = wall
    return doc


def measure_ghz() -> float:
    """Clock of one core: a chain of 1-cycle dependent adds, best of several runs."""
    src = r"""
#include <stdio.h>
#include <time.h>
int main(void) {
    double best = 0;
    for (int r = 0; r < 7; r++) {
        struct timespec a, b;
        unsigned long x = 0, n = 200000000UL;
        clock_gettime(CLOCK_MONOTONIC, &a);
        unsigned long one = 1;
        /* register adds: 1-cycle latency (add-immediate chains can be folded at rename) */
        for (unsigned long i = 0; i < n; i += 8)
            __asm__ volatile("add %1,%0\n add %1,%0\n add %1,%0\n add %1,%0\n"
                             "add %1,%0\n add %1,%0\n add %1,%0\n add %1,%0"
                             : "+r"(x) : "r"(one));
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
        double ghz = n / s / 1e9;
        if (ghz > best) best = ghz;
    }
    printf("%.3f\n", best);
    return 0;
}
"""
    return float(_run_c(src, []))


def amx_peak_gflops() -> float:
    """Best-of-7 bf16 GFLOP/s of independent `tdpbf16ps` (4 C tiles, 16x16x32 each), with
    the tile configuration and OS permission helper the generated kernels use."""
    from morello_build.codegen.context import HELPERS

    src = (
        "#include <immintrin.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\n"
        + HELPERS["amx"]
        + r"""
int main(void) {
    static unsigned short zero[512] __attribute__((aligned(64)));
    mb_amx_enable();
    _tile_loadconfig(mb_amx_cfg);
    _tile_loadd(4, zero, 64); _tile_loadd(5, zero, 64);
    _tile_loadd(6, zero, 64); _tile_loadd(7, zero, 64);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    double best = 0;
    for (int r = 0; r < 7; r++) {
        struct timespec a, b;
        long iters = 2000000;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < iters; i++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
        double gf = iters * 4.0 * 16 * 16 * 32 * 2 / s / 1e9;
        if (gf > best) best = gf;
    }
    _tile_release();
    printf("%.3f\n", best);
    return 0;
}
"""
    )
    return float(_run_c(src, ["-mamx-tile", "-mamx-bf16"]))


def peak_key(label: str, dtype: str) -> str:
    """The peak a row is measured against: for bf16, AMX tiles on amx and vdpbf16ps on the
    avx512 zen4 and zen5 tunings; else the f32 FMAs of its ISA."""
    isa, tune = split_target(label)
    if dtype == "bf16" and isa == "amx":
        return "amx-bf16"
    if dtype == "bf16" and isa == "avx512" and tune in TUNINGS and TUNINGS[tune].fast_dpbf16:
        return DPBF16_PEAK
    return isa


def beside_reference(label: str, dtype: str) -> str | None:
    """The `morello bench` reference timed beside the kernel that a row counts against:
    `fma-peak` for the f32 FMAs of its ISA, `amx-peak` for AMX tiles; None for the
    vdpbf16ps peak, which is only measured apart."""
    key = peak_key(label, dtype)
    if key == split_target(label)[0]:
        return "fma-peak"
    return "amx-peak" if key == "amx-bf16" else None


def _row_peak_key(k: str) -> str:
    label, shape = k.split("/", 1)
    return peak_key(label, parse_shape(shape)[0])


def fma_peak_gflops(target: str) -> float:
    """Best-of-7 f32 GFLOP/s of independent register FMAs on one core (no memory traffic)."""
    return _register_loop_gflops(target, "vfmadd231ps")


def dpbf16_peak_gflops() -> float:
    """The same loop of `vdpbf16ps zmm` (64 flops each: 16 lanes x 2 products x 2)."""
    return _register_loop_gflops("avx512", "vdpbf16ps")


def _register_loop_gflops(target: str, instr: str) -> float:
    wide = target in ("avx512", "amx")
    reg, n = ("zmm", 24) if wide else ("ymm", 12)
    body = "".join(f'"{instr} %%{reg}14, %%{reg}15, %%{reg}{i}\\n"' for i in range(n))
    if wide:
        body = body.replace("%%zmm14, %%zmm15", "%%zmm30, %%zmm31")
    clobbers = ", ".join(f'"xmm{i}"' for i in range(n))
    lanes = (16 if wide else 8) * (2 if instr == "vdpbf16ps" else 1)
    src = f"""
#include <stdio.h>
#include <time.h>
int main(void) {{
    double best = 0;
    for (int r = 0; r < 7; r++) {{
        struct timespec a, b;
        long iters = 20000000;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < iters; i++)
            __asm__ volatile({body} ::: {clobbers});
        clock_gettime(CLOCK_MONOTONIC, &b);
        double s = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
        double gf = iters * {n}.0 * {lanes} * 2 / s / 1e9;
        if (gf > best) best = gf;
    }}
    printf("%.3f\\n", best);
    return 0;
}}
"""
    flags = ["-mavx512f", "-mavx512bf16"] if wide else ["-mavx2", "-mfma"]
    return float(_run_c(src, flags))


def _run_c(src: str, flags: list[str], *args: str) -> str:
    with tempfile.TemporaryDirectory(prefix="morello-peers-") as d:
        c = Path(d) / "m.c"
        exe = Path(d) / "m"
        c.write_text(src)
        subprocess.run(["gcc", "-O2", "-std=gnu11", *flags, str(c), "-o", str(exe)], check=True)
        taskset = ["taskset", "-c", "0"] if _has("taskset") else []
        return subprocess.run(
            [*taskset, str(exe), *args], check=True, capture_output=True, text=True
        ).stdout.strip()


def _has(tool: str) -> bool:
    return any((Path(p) / tool).exists() for p in os.environ.get("PATH", "").split(os.pathsep))


def _field(doc: dict[str, object], name: str, key: str) -> float | None:
    """`key` ("gflops", "seconds") of implementation `name` in a `bench --json` document."""
    rows: list[dict[str, object]] = doc.get("results", [])  # type: ignore[assignment]
    for r in rows:
        if r["name"] == name and key in r:
            return float(r[key])  # type: ignore[arg-type]
    return None


def _gf(doc: dict[str, object], name: str) -> float | None:
    return _field(doc, name, "gflops")


def table(results: dict[str, dict[str, object]], peaks: dict[str, float]) -> str:
    head = (
        "| target | shape | dtype | thr | morello GF/s | "
        + " | ".join(PEERS)
        + " | ratio to best peer | % FMA peak | matvec: % of a streaming read of B | cold synth s"
        + " | repeats: ratio range (runs) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k in sorted(results, key=_order):
        target, shape = k.split("/", 1)
        dtype, (m, kk, n), threads = parse_shape(shape)
        doc = results[k]
        dims = f"{m}x{kk}x{n}"
        if "error" in doc:
            lines.append(f"| {target} | {dims} | {dtype} | {threads} | error: {doc['error']} |")
            continue
        mo = _gf(doc, MORELLO)
        peers = [_gf(doc, p) for p in PEERS]
        ratio = doc.get("ratio")
        pct = _peak_cell(doc, target, dtype, threads, peaks)
        bw = "-"
        mine, read = _field(doc, MORELLO, "seconds"), _field(doc, "stream-read", "seconds")
        if m == 1 and mine and read:
            bsize = kk * n * (2 if dtype == "bf16" else 4)
            bw = f"{100 * read / mine:.0f}% of {bsize / read / 1e9:.1f} GB/s"
        synth = doc.get("synth_seconds")
        cells = [
            target,
            dims,
            dtype,
            str(threads),
            f"{mo:.1f}" if mo else "-",
            *[f"{p:.1f}" if p else "-" for p in peers],
            f"{ratio:.2f}x" if isinstance(ratio, float) else "-",
            pct,
            bw,
            f"{synth:.1f}" if isinstance(synth, float) else "-",
            _repeats_cell(doc.get("repeat_ratios")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _peak_cell(
    doc: dict[str, object], target: str, dtype: str, threads: int, peaks: dict[str, float]
) -> str:
    """% of the FMA peak: against the reference timed beside the kernel (on all of its
    threads) where the row has the one it counts against (`fma-peak` for f32 FMAs,
    `amx-peak` for AMX tiles), else against the peak measured apart (x threads)."""
    mo = _gf(doc, MORELLO)
    if not mo:
        return "-"
    ref = beside_reference(target, dtype)
    beside = _gf(doc, ref) if ref else None
    if beside:
        return f"{100 * mo / beside:.0f}%"
    peak = peaks.get(peak_key(target, dtype))
    return f"{100 * mo / (peak * threads):.0f}%*" if peak else "-"


def scaling_lines(results: dict[str, dict[str, object]]) -> list[str]:
    """For each threaded row with a one-thread row of the same target, dtype and shape:
    each threaded implementation's GF/s at T threads over its GF/s on one core."""
    rows = []
    for k in sorted(results, key=_order):
        target, shape = k.split("/", 1)
        rows.append((target, *parse_shape(shape), results[k]))
    one = {(target, dtype, dims): doc for target, dtype, dims, thr, doc in rows if thr == 1}
    lines = []
    for target, dtype, dims, threads, doc in rows:
        base = one.get((target, dtype, dims))
        if threads == 1 or base is None:
            continue
        cells = []
        for name in (MORELLO, *(p for p in PEERS if p != "naive")):  # naive: one thread
            hi, lo = _gf(doc, name), _gf(base, name)
            if hi and lo:
                cells.append(f"{name} {hi / lo:.2f}x")
        if cells:
            shape_text = "x".join(map(str, dims))
            lines.append(f"{target} {shape_text} {dtype}, {threads} threads: " + ", ".join(cells))
    return lines


def beside_lines(results: dict[str, dict[str, object]]) -> list[str]:
    """For each threaded row benchmarked with `--scaling`: the kernel's speed-up over its
    one-thread kernel timed round-robin with it, and the range over the row's repeats."""
    lines = []
    for k in sorted(results, key=_order):
        doc = results[k]
        scaling = doc.get("scaling")
        if not isinstance(scaling, float):
            continue
        target, shape = k.split("/", 1)
        dtype, dims, threads = parse_shape(shape)
        shape_text = "x".join(map(str, dims))
        line = f"{target} {shape_text} {dtype}, {threads} threads: {scaling:.2f}x"
        raw = doc.get("repeat_scalings")
        again = [x for x in raw if isinstance(x, float)] if isinstance(raw, list) else []
        if again:
            line += f" (repeats {min(again):.2f}-{max(again):.2f}x, {len(again)} runs)"
        lines.append(line)
    return lines


def _repeats_cell(ratios: object) -> str:
    """`0.978-0.981x (3)` for a row benchmarked again (`--repeats`), else `-`."""
    if not isinstance(ratios, list):
        return "-"
    vals = [r for r in ratios if isinstance(r, float)]
    if not vals:
        return "-"
    return f"{min(vals):.3f}-{max(vals):.3f}x ({len(vals)})"


def _order(k: str) -> tuple[str, bool, str, int, int, int, int]:
    """Rows in the issue's order: per target, f32 shapes by size (threaded ones last), then
    the other dtypes."""
    target, shape = k.split("/", 1)
    dtype, (m, kk, n), threads = parse_shape(shape)
    return (target, dtype != "f32", dtype, threads, m * kk * n, m, n)


def plot(results: dict[str, dict[str, object]], peaks: dict[str, float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = sorted({k.split("/", 1)[0] for k in results})
    fig, axes = plt.subplots(1, len(targets), figsize=(8 * len(targets), 5), squeeze=False)
    for ax, target in zip(axes[0], targets):
        keys = sorted((k for k in results if k.startswith(target + "/")), key=_order)
        labels = []
        for k in keys:
            dtype, (m, kk, n), th = parse_shape(k.split("/", 1)[1])
            label = f"{m}x{kk}x{n}" if not (m == kk == n) else f"{m}^3"
            labels.append(
                ("bf16 " if dtype == "bf16" else "") + label + (f" T{th}" if th > 1 else "")
            )
        xs = list(range(len(keys)))
        for name in (MORELLO, *PEERS):
            ys = [_gf(results[k], name) for k in keys]
            ys2 = [y if y is not None else float("nan") for y in ys]
            ax.plot(xs, ys2, marker="o", label=name, linewidth=2.5 if name == MORELLO else 1.2)
        peak = peaks[split_target(target)[0]]
        if DPBF16_PEAK in peaks and peak_key(target, "bf16") == DPBF16_PEAK:
            dp = peaks[DPBF16_PEAK]
            ax.axhline(dp, color="g", linestyle=":", label=f"vdpbf16ps peak ({dp:.0f})")
        if target == "amx":
            amx_peak = peaks["amx-bf16"]
            ax.axhline(amx_peak, color="r", linestyle=":", label=f"AMX bf16 peak ({amx_peak:.0f})")
        ax.axhline(peak, color="k", linestyle="--", label=f"f32 FMA peak, 1 core ({peak:.0f})")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("GFLOP/s (median)")
        ax.set_title(f"{target}: morello-build vs peers")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--ops" or a.startswith("--ops=") for a in argv):
        return rows_main(argv)  # softmax and activations (benchmarks/peers_rows.py)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--targets",
        default=None,
        help=f"comma-separated subset of {','.join(TARGETS)} [default: those this host can run]",
    )
    ap.add_argument(
        "--shapes",
        default=None,
        help=f"comma-separated shapes [default: {DEFAULT_SHAPES}; amx: {TARGET_SHAPES['amx']}]",
    )
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--results", default="benchmarks/peers_results.json")
    ap.add_argument("--png", default="benchmarks/peers.png")
    ap.add_argument(
        "--ghz",
        type=float,
        default=None,
        help="FMA peak from this clock (2 FMA x lanes x 2 flops x GHz) instead of measuring it"
        " [default: measure]",
    )
    ap.add_argument(
        "--measure-ghz",
        action="store_true",
        help="with --ghz unset: also time a dependent add chain and print the clock",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=0,
        metavar="N",
        help="benchmark each row whose ratio is below --repeat-below N more times (cache warm)"
        " and show the range of those runs' ratios [default: 0]",
    )
    ap.add_argument(
        "--repeat-below",
        type=float,
        default=1.02,
        metavar="RATIO",
        help="only rows whose first ratio is below this are repeated [default: 1.02]",
    )
    ap.add_argument(
        "--tune",
        choices=TUNES,
        default="native",
        help="morello's --tune for every row: native is this host's (zen3 on AMD Zen 3, zen4 on"
        " Zen 4, zen5 on Zen 5; with the last two avx512 bf16 GEMMs use vdpbf16ps); rows of a"
        " tuning other than generic are labelled with it, e.g. avx2-zen3 [default: native]",
    )
    ap.add_argument("--report-only", action="store_true", help="print/plot the results file")
    args = ap.parse_args(argv)
    if args.repeats < 0:
        ap.error(f"--repeats must be >= 0, not {args.repeats}")
    if args.targets is None:
        targets = [t for t in TARGETS if host_supports(t)]
        if not args.report_only and len(targets) < len(TARGETS):
            left = ", ".join(t for t in TARGETS if t not in targets)
            print(
                f"[peers] not benchmarking {left}: this host cannot run that code"
                f" (its best: {native_isa()})",
                file=sys.stderr,
            )
    else:
        targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        unknown = [t for t in targets if t not in TARGETS]
        if unknown or not targets:
            ap.error(f"--targets: unknown {unknown or targets}; expected some of {TARGETS}")
        unable = [t for t in targets if not host_supports(t)]
        if unable and not args.report_only:
            ap.error(
                f"--targets: this host cannot run {', '.join(unable)} code (its best:"
                f" {native_isa()}); its rows would only fail after synthesis"
            )
    if not targets and not args.report_only:
        ap.error(f"this host runs none of {', '.join(TARGETS)} (its best: {native_isa()})")
    plan: list[tuple[str, str]] = []
    for target in targets:
        for shape in (args.shapes or TARGET_SHAPES.get(target, DEFAULT_SHAPES)).split(","):
            try:
                parse_shape(shape)
            except ValueError as exc:
                ap.error(f"--shapes: {exc}")
            plan.append((target, shape))

    res_path = Path(args.results)
    results: dict[str, dict[str, object]] = {}
    if res_path.exists():
        results = json.loads(res_path.read_text())
    meta = results.pop("_meta", {})
    tune = native_tune() if args.tune == "native" else args.tune
    if not args.report_only:
        for target, shape in plan:
            label = row_target(target, tune)
            print(f"[peers] {label} {shape} ...", file=sys.stderr, flush=True)
            results[key(label, shape)] = run_one(
                target, shape, args.min_time, args.repeats, args.repeat_below, tune
            )
            res_path.write_text(json.dumps({**results, "_meta": meta}, indent=1))
    in_file = sorted({split_target(k.split("/", 1)[0])[0] for k in results})
    dpbf16_rows = any(_row_peak_key(k) == DPBF16_PEAK for k in results)
    if args.ghz is not None:
        peaks = {t: 2 * ISA[t].f32_lanes * 2 * args.ghz for t in in_file}
        how = f"formula at {args.ghz:.2f} GHz (2 FMA x lanes x 2 flops x GHz)"
        if "amx" in in_file:  # 1024 bf16 flops per cycle: a 16x16x32 tdpbf16ps per 16 cycles
            peaks["amx-bf16"] = 1024 * args.ghz
    else:
        # Peaks of targets this host cannot run (rows from another machine's results file)
        # are that file's, as measured there; running their code here would fault.
        stored = meta.get("fma_peak", {})
        peaks = {t: float(stored[t]) for t in in_file if t in stored and not host_supports(t)}
        peaks |= {t: fma_peak_gflops(t) for t in in_file if host_supports(t)}
        how = "measured: 24 independent register FMAs (12 on avx2), best of 7"
        if dpbf16_rows and host_supports("avx512"):
            peaks[DPBF16_PEAK] = dpbf16_peak_gflops()
            how += "; avx512-zen4/zen5 bf16: 24 independent vdpbf16ps zmm"
        elif dpbf16_rows and DPBF16_PEAK in stored:
            peaks[DPBF16_PEAK] = float(stored[DPBF16_PEAK])
        if "amx" in in_file and host_supports("amx"):
            peaks["amx-bf16"] = amx_peak_gflops()
            how += "; amx bf16: 4 independent tdpbf16ps tiles"
        elif "amx" in in_file and "amx-bf16" in stored:
            peaks["amx-bf16"] = float(stored["amx-bf16"])
        if args.measure_ghz:
            how += f"; clock {measure_ghz():.2f} GHz"
    meta["fma_peak"] = peaks
    meta.pop("stream", None)  # older files: a separately timed streaming read
    res_path.write_text(json.dumps({**results, "_meta": meta}, indent=1))
    print(
        "FMA peak per core ("
        + how
        + "): "
        + ", ".join(f"{t} {p:.0f} GF/s" for t, p in sorted(peaks.items()))
        + "; avx512/avx2 bf16 rows use the f32 peak (bf16 widens to f32 there),"
        + " avx512-zen4/zen5 bf16 rows the vdpbf16ps peak, amx bf16 rows the AMX tile peak."
        + " The % FMA peak column is against `fma-peak`, the same register FMAs timed"
        + " round-robin with the kernel in its harness on all of its threads (amx bf16 rows:"
        + " `amx-peak`, the same tile products timed so); a value marked *"
        + " is against the peak above (x threads), for rows without it."
    )
    cpus = cpu_line(results)
    if cpus:
        print(cpus)
    print()
    print(table(results, peaks))
    for heading, lines in (
        (
            "Thread scaling (GF/s over the one-thread row's GF/s; the two rows ran apart, so"
            " machine drift between them counts)",
            scaling_lines(results),
        ),
        (
            "Thread scaling of morello-build measured in one harness (the threaded kernel"
            " over its one-thread kernel, timed round-robin, `morello bench --scaling`)",
            beside_lines(results),
        ),
    ):
        if lines:
            print(f"\n{heading}:")
            print("\n".join(f"- {x}" for x in lines))
    limits = sorted(
        {(k.split("/", 1)[0], str(v.get("peer_limit") or "")) for k, v in results.items()}
    )
    for target, limit in limits:
        if limit:
            print(f"\n{target} rows: peers held to the kernel's ISA: {limit}")
    try:
        plot(results, peaks, Path(args.png))
    except ModuleNotFoundError as exc:  # matplotlib is in the `plot` extra
        print(
            f"\nno plot: {exc.name} is not installed (pip install 'morello-build[plot]')",
            file=sys.stderr,
        )
    else:
        print(f"\nplot: {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
