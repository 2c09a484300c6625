"""Time a generated kernel against peer libraries in one C harness.

Why one harness: timings taken in different processes (or languages) differ by page
placement, frequency ramps and call overhead. Here the kernel and every peer are linked into
one executable, read the same 64-byte-aligned input buffers and are timed round-robin
(the starting implementation rotates each round), so slow drifts hit them all alike.

Protocol, per implementation: `WARMUP_SECONDS` of untimed calls (caches, page mappings,
lazy library initialization, clock ramp); then the calibration doubles the repetition
count until a timed block lasts a quarter of `SAMPLE_SECONDS`, scales it so one sample
lasts about `SAMPLE_SECONDS`, re-measures once and rescales. Then
``max(MIN_SAMPLES, min_time / SAMPLE_SECONDS)`` rounds each time one sample of every
implementation with ``clock_gettime(CLOCK_MONOTONIC)``. A sample gives seconds per call; we
report the median and the best. GFLOP/s uses `KernelABI.flops`.

Before timing, the harness runs every implementation once from the same initial output and
writes the results; they are checked against the numpy reference with the tolerance of
`morello_build.harness.arrays`. A peer that disagrees is reported as skipped ("wrong result"),
and a morello kernel that disagrees is an error: comparing wrong answers is worthless.

With ``threads=1`` the harness pins itself to one CPU and sets every library to one thread
(openblas_set_num_threads, MKL's sequential threading layer, OMP/MKL/OPENBLAS env vars).
With more threads, MKL runs on GNU OpenMP (one runtime shared with OpenMP kernels) and
thread pools spin only briefly after a call, since implementations alternate. The naive
peer is always single-threaded. The peers themselves are `harness.peer_registry`; the C of the
harness is `templates/harness.c`; the report is `harness.report`.

Row operations (softmax, activations) are timed the same way against the loop nest,
oneDNN and `stream-rw` (their memory bound) here, with inputs and bounds of
`harness.row_reference`; their Python peers (onnxruntime, jax) cannot be linked into the
harness, so `harness.row_peers` times them afterwards in this process beside the kernel
called through ctypes, with the same protocol.
"""

from __future__ import annotations

import math
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.errors import MorelloError
from morello_build.harness.arrays import (
    STORAGE,
    compare_output,
    decode,
    from_physical,
    random_logical,
    reference_output,
    sentinel_fill,
    to_physical,
)
from morello_build.harness.compile import (
    Compiler,
    IsaUnavailable,
    compile_object,
    find_compiler,
    kernel_files,
    kernel_flags,
    link,
    uses_openmp,
    write_sources,
)
from morello_build.harness.csources import render
from morello_build.harness.peer_registry import (
    ALL_PEERS,
    COMPUTE_PEAKS,
    HOST_NAIVE_ARCH,
    MORELLO,
    ONE_THREAD,
    PEER_ISAS,
    PEERS,
    PYTHON_PEERS,
    REFERENCES,
    ROW_C_PEERS,
    ROW_OPS,
    ROW_REFERENCES,
    PeerImpl,
    PeerLib,
    array_offset_problem,
    c_call_args,
    onednn_isa_env,
    peer_isa_settings,
    plan_peers,
    reference_iters,
)
from morello_build.harness.report import (
    BenchReport,
    ImplResult,
    parse_check,
    parse_offsets,
    parse_timing,
    timed_result,
)
from morello_build.ir.spec import ROW_KINDS
from morello_build.machine.isa import ISA_FLAGS, host_cpu_name, host_supports

__all__ = ["BenchError", "bench_kernel"]

SAMPLE_SECONDS = 0.015  # one timed sample lasts about this long
MIN_SAMPLES = 5
WARMUP_SECONDS = 0.05  # untimed calls per implementation before calibration


class BenchError(MorelloError):
    """The benchmark could not run, or the morello kernel computed a wrong result."""


# --------------------------------------------------------------------------- C of the harness


def harness_source(
    abi: KernelABI,
    impls: Sequence[PeerImpl],
    thread_setup: str,
    one_thread: bool = False,
    array_offset: int = 0,
) -> str:
    """The harness's main file (`templates/harness.c`): the buffers (each `array_offset`
    bytes past a 64-byte boundary), one table entry per implementation (the kernel first),
    `setup(threads)` and the check/time driver."""
    out_index = next(i for i, op in enumerate(abi.operands) if not op.is_input)
    nbytes = ", ".join(
        f"{math.prod(op.shape) * np.dtype(STORAGE[op.dtype]).itemsize}UL" for op in abi.operands
    )
    # The kernel's run function lives in morello_bench_call.c so that its header never meets
    # the libc headers here (a kernel may be named like a libc function, e.g. `bzero`). It is
    # the table entry itself: every implementation is one indirect call away from the timing
    # loop, as a caller of the kernel would be (docs/performance.md, "Harness notes").
    parts = ["void morello_bench_run(void);"]
    entries = [f'    {{"{MORELLO}", morello_bench_run, 0, 0}}']
    if one_thread:
        parts.append("void morello_bench_run1(void);")
        entries.append(f'    {{"{ONE_THREAD}", morello_bench_run1, 0, 0}}')
    first = len(entries)  # the kernel (and its one-thread kernel) come first
    for i, impl in enumerate(impls, start=first):
        if impl.decls:
            parts.append(impl.decls)
        parts.append(f"static void run_{i}(void) {{\n{impl.code}\n}}")
        entries.append(f'    {{"{impl.name}", run_{i}, 0, {int(impl.reference)}}}')
    table = ",\n".join(entries)
    parts.append(f"static struct impl impls[] = {{\n{table}\n}};")
    parts.append(f"#define N_IMPLS {len(entries)}")
    setup = "".join(impl.setup.replace("IDX", str(i)) for i, impl in enumerate(impls, start=first))
    parts.append(f"static void setup(int threads) {{\n{thread_setup}{setup}    (void)threads;\n}}")
    return render(
        "harness.c",
        naive_prototype=replace(abi, name="morello_bench_naive").prototype(),
        n_operands=len(abi.operands),
        out_index=out_index,
        accumulate=1 if (abi.op == "matmul" and abi.accumulate) else 0,
        min_samples=MIN_SAMPLES,
        warmup_seconds=repr(WARMUP_SECONDS),
        array_offset=array_offset,
        nbytes=nbytes,
        implementations="\n".join(parts),
    )


def call_source(abi: KernelABI, run: str) -> str:
    """`void run(void)` calling the kernel on the harness buffers, in a file of its own so
    the kernel's header never meets the harness's libc headers (see `harness_source`)."""
    return render(
        "call.c",
        header=abi.name,
        run=run,
        kernel=abi.name,
        args=c_call_args(abi, "morello_bench_buf"),
    )


# --------------------------------------------------------------------------- driver


def _run(cmd: Sequence[str], env: dict[str, str], what: str) -> str:
    try:
        proc = subprocess.run(
            list(cmd), capture_output=True, text=True, env=env, timeout=3600, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"benchmark harness timed out during {what}") from exc
    if proc.returncode != 0:
        raise BenchError(
            f"benchmark harness failed during {what} (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()}"
        )
    return proc.stdout


def _build(
    cc: Compiler,
    workdir: Path,
    kernel: GeneratedKernel,
    impls: Sequence[PeerImpl],
    libs: Sequence[PeerLib],
    thread_setup: str,
    naive_arch: Sequence[str] = HOST_NAIVE_ARCH,
    threads: int = 1,
    one_thread: GeneratedKernel | None = None,
    array_offset: int = 0,
) -> Path:
    """Write and compile the kernel, the peers' own sources and the harness; link them
    with the peer libraries into `workdir/morello_bench`."""
    abi = kernel.abi
    timed = {impl.name for impl in impls}
    always = [p.source for p in PEERS.values() if p.source and p.source.always]
    beside = [  # only when timed
        p.source for p in PEERS.values() if p.source and not p.source.always and p.name in timed
    ]
    files = dict(kernel_files(kernel))
    if one_thread is not None:
        files |= kernel_files(one_thread)
        files["morello_bench_call1.c"] = call_source(one_thread.abi, "morello_bench_run1")
    files |= {src.file: src.render(abi) for src in always}
    files["morello_bench_call.c"] = call_source(abi, "morello_bench_run")
    files["morello_bench_harness.c"] = harness_source(
        abi, impls, thread_setup, one_thread is not None, array_offset
    )
    files |= {src.file: src.render(abi) for src in beside}
    write_sources(workdir, files)
    openmp = uses_openmp(kernel) or threads > 1
    flags = {
        "isa": kernel_flags(abi.isa, openmp=openmp),  # as the kernel
        "arch": kernel_flags(None, arch=naive_arch),  # held to the kernel's ISA like the peers
        "harness": kernel_flags(None, opt="-O2"),
    }

    def compile_file(name: str, kind: str) -> Path:
        return compile_object(cc, workdir / name, flags=flags[kind])

    objects = [
        compile_file(f"{abi.name}.c", "isa"),
        compile_file("morello_bench_call.c", "harness"),
        *(compile_file(src.file, src.flags) for src in always),
        compile_file("morello_bench_harness.c", "harness"),
        *(compile_file(src.file, src.flags) for src in beside),
    ]
    if one_thread is not None:
        objects.append(compile_file(f"{one_thread.abi.name}.c", "isa"))
        objects.append(compile_file("morello_bench_call1.c", "harness"))
    libargs = [a for lib in libs for a in lib.link_args]
    return link(
        cc,
        objects,
        workdir / "morello_bench",
        shared=False,
        flags=["-fopenmp"] if openmp else [],
        libs=[*libargs, "-lm"],
    )


def _write_inputs(
    abi: KernelABI, workdir: Path, seed: int
) -> tuple[dict[str, NDArray[Any]], OperandABI]:
    """Random inputs (as in verify) as raw physical files; returns the logical arrays."""
    rng = np.random.default_rng(seed)
    logical: dict[str, NDArray[Any]] = {}
    out = next(op for op in abi.operands if not op.is_input)
    for i, op in enumerate(abi.operands):
        if op.is_input:
            logical[op.name] = random_logical(op, rng)
            to_physical(logical[op.name], op.order).tofile(workdir / f"in_{i}.bin")
    accumulate = out.role == "inout" or (abi.op == "matmul" and abi.accumulate)
    init = random_logical(out, rng) if accumulate else sentinel_fill(out, 0)
    logical[out.name] = init
    to_physical(init, out.order).tofile(workdir / "init.bin")
    return logical, out


def _write_row_inputs(abi: KernelABI, workdir: Path, seed: int) -> tuple[Any, Any]:
    """A row operation's input (uniform, `row_reference.random_rows`: the timed case,
    no infinities or subnormal paths) as a raw file and the NaN-like initial output;
    returns (the input as float64 values, as stored)."""
    from morello_build.harness.arrays import encode
    from morello_build.harness.row_reference import random_rows

    x, out = abi.operands
    rng = np.random.default_rng(seed)
    values = random_rows(x.shape, rng, abi.op, x.dtype)
    stored = encode(x.dtype, values)
    to_physical(stored, x.order).tofile(workdir / "in_0.bin")
    to_physical(sentinel_fill(out, 0), out.order).tofile(workdir / "init.bin")
    return values, stored


def split_row_peers(peers: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(C harness peers, Python peers) of a row benchmark; None: the defaults (the loop
    nest, oneDNN, `stream-rw`; onnxruntime and jax)."""
    from morello_build.harness.row_peers import PY_PEERS

    if peers is None:
        return [*ROW_C_PEERS, *ROW_REFERENCES], list(PY_PEERS)
    return [p for p in peers if p not in PY_PEERS], [p for p in peers if p in PY_PEERS]


def _check_one_thread(kernel: GeneratedKernel, one: GeneratedKernel, threads: int) -> None:
    """`one` must compute what `kernel` does, on one thread, under another C name."""
    if threads < 2:
        raise ValueError("one_thread is the baseline of a threaded run: needs threads >= 2")
    a, b = kernel.abi, one.abi
    if replace(b, name=a.name, workspace_bytes=a.workspace_bytes) != a:
        raise ValueError(
            f"one_thread kernel {b.name!r} does not have the ABI of {a.name!r} "
            "(the same Spec, target and layouts are needed)"
        )
    if b.name == a.name or b.name.startswith("morello_bench_"):
        raise ValueError(
            f"one_thread kernel needs a C name of its own (not {b.name!r}, the kernel's or "
            "the harness's)"
        )
    if uses_openmp(one):
        raise ValueError(
            f"one_thread kernel {b.name!r} has parallel loops: synthesize it for 1 thread"
        )


def bench_kernel(
    kernel: GeneratedKernel,
    *,
    peers: Sequence[str] | None = None,
    threads: int = 1,
    min_time: float = 0.5,
    compiler: str | None = None,
    seed: int = 0,
    peer_isa: str = "kernel",
    one_thread: GeneratedKernel | None = None,
    array_offset: int = 0,
) -> BenchReport:
    """Benchmark `kernel` against `peers` (default: all of `ALL_PEERS`).

    `min_time` is the minimum total timed seconds per implementation (at least
    `MIN_SAMPLES` samples of ~`SAMPLE_SECONDS` each). Peers that are missing, cannot express
    the kernel, or compute a wrong result are reported as skipped with the reason.
    `peer_isa="kernel"` holds the peers to the kernel's ISA (`PEER_ISA_LIMITS`); "host"
    lets them use everything this machine has.
    `one_thread`: with `threads` > 1, the same Spec synthesized for one thread, timed
    beside the kernel as `ONE_THREAD` (never a peer); `BenchReport.scaling` is then the
    kernel's speed-up over it.
    `array_offset`: every array starts this many bytes past a 64-byte boundary (a multiple
    of 4 below 64), for the kernel and its peers alike: callers' arrays are often placed so
    (numpy's large arrays start 16 bytes past a page), and some plans are slower on them
    (docs/cost-model.md, "Unaligned rows"). Matmul only.
    """
    if peer_isa not in PEER_ISAS:
        raise ValueError(f"peer_isa must be one of {PEER_ISAS}, got {peer_isa!r}")
    abi = kernel.abi
    if threads < 1:
        raise ValueError("threads must be >= 1")
    if abi.isa not in ISA_FLAGS:
        raise ValueError(f"kernel {abi.name}: unknown ISA {abi.isa!r}")
    if not host_supports(abi.isa):
        raise IsaUnavailable(abi.isa)
    if abi.name.startswith("morello_bench_"):
        raise BenchError(
            f"kernel name {abi.name!r}: names starting with 'morello_bench_' are the "
            "benchmark harness's own; choose another --name"
        )
    if one_thread is not None:
        _check_one_thread(kernel, one_thread, threads)
    rows = abi.op in ROW_OPS
    problem = array_offset_problem(array_offset)
    if problem is not None:
        raise BenchError(problem)
    if array_offset and abi.op != "matmul":
        raise BenchError(
            "an array offset applies to matmul kernels and pipelines, not to row operations"
        )
    if abi.op in ROW_KINDS and not rows:
        raise BenchError(
            f"{abi.op} kernels have no benchmark peers yet; morello bench takes matmul and "
            f"the row operations {', '.join(ROW_OPS)} (morello verify checks any kernel)"
        )
    py_peers: list[str] = []
    if rows:
        wanted, py_peers = split_row_peers(peers)
    else:
        wanted = list(ALL_PEERS if peers is None else peers)
    cc = find_compiler(compiler)
    impls, skipped, libs, thread_setup = plan_peers(abi, wanted, threads)
    for name in set(wanted) & set(PYTHON_PEERS):  # only row operations reach split_row_peers
        skipped[name] = f"{name} is a peer of row operations (softmax, activations) only"
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1:
        env["MKL_THREADING_LAYER"] = "SEQUENTIAL"
    else:
        # Round-robin timing alternates thread pools; a pool that keeps spinning after its
        # call (Intel OpenMP spins 200 ms by default) would steal cores from the next one.
        # MKL uses the GNU OpenMP layer so that it shares one runtime with OpenMP kernels.
        env.update(
            MKL_THREADING_LAYER="GNU",
            KMP_BLOCKTIME="0",
            GOMP_SPINCOUNT="10000",
            OPENBLAS_THREAD_TIMEOUT="4",
        )

    limit_env, naive_arch = peer_isa_settings(abi.isa, peer_isa)
    if rows:
        limit_env = onednn_isa_env(abi.isa, peer_isa)
    env.update(limit_env)
    peer_limit = " ".join(f"{k}={v}" for k, v in limit_env.items())
    if naive_arch != HOST_NAIVE_ARCH:
        peer_limit += f", naive {' '.join(naive_arch)}"

    with tempfile.TemporaryDirectory(prefix="morello-bench-") as tmp:
        workdir = Path(tmp)
        exe = _build(
            cc,
            workdir,
            kernel,
            impls,
            libs,
            thread_setup,
            naive_arch,
            threads,
            one_thread,
            array_offset,
        )
        if rows:
            from morello_build.harness.verify import check_rows

            out = abi.operands[1]
            x_values, x_stored = _write_row_inputs(abi, workdir, seed)

            def check(got: NDArray[Any]) -> tuple[bool, str]:
                ok, _, _, msg = check_rows(abi.op, {"x": x_values}, got)
                return ok, msg
        else:
            logical, out = _write_inputs(abi, workdir, seed)
            expected = reference_output(abi, logical)

            def check(got: NDArray[Any]) -> tuple[bool, str]:
                ok, _, _, msg = compare_output(expected, got, out.dtype)
                return ok, msg

        one_thread_name = one_thread.abi.name if one_thread is not None else ""
        # 1. Check every implementation once against numpy.
        stdout = _run([str(exe), "check", tmp, str(threads)], env, "the correctness check")
        placed = parse_offsets(stdout)
        if placed != [array_offset] * len(abi.operands):
            raise BenchError(f"the harness placed its arrays at {placed}, not {array_offset}")
        passed: list[str] = []
        for line in parse_check(stdout):
            if line.word == "skip":
                skipped[line.name] = line.reason
            elif line.word == "reference":
                passed.append(line.name)
            else:
                name = line.name
                raw = np.fromfile(workdir / f"out_{name}.bin", dtype=STORAGE[out.dtype])
                phys = raw.reshape(tuple(out.shape[d] for d in out.order))
                ok, msg = check(decode(out.dtype, from_physical(phys, out.order)))
                if ok:
                    passed.append(name)
                elif name in (MORELLO, ONE_THREAD):
                    which = abi.name if name == MORELLO else f"{name} ({one_thread_name})"
                    raise BenchError(f"kernel {which} computed a wrong result: {msg}")
                else:
                    skipped[name] = f"wrong result ({msg})"
        if MORELLO not in passed:
            raise BenchError(f"kernel {abi.name} was not run by the harness")

        # 2. Time the ones that passed, round-robin.
        stdout = _run(
            [str(exe), "time", tmp, str(threads), repr(SAMPLE_SECONDS), repr(min_time), *passed],
            env,
            "timing",
        )
        python = None
        if rows and (py_peers or peers is None):
            from morello_build.harness.row_peers import time_python_peers

            try:
                python = time_python_peers(
                    kernel,
                    x_stored,
                    check,
                    peers=py_peers,
                    threads=threads,
                    cc=cc,
                    workdir=workdir / "py",
                    sample_s=SAMPLE_SECONDS,
                    min_time=min_time,
                    warmup_s=WARMUP_SECONDS,
                    min_samples=MIN_SAMPLES,
                )
            except ValueError as exc:
                raise BenchError(f"kernel {abi.name} {exc}") from exc
    samples, reps = parse_timing(stdout, passed)

    def timed(name: str) -> ImplResult:
        peak = name in COMPUTE_PEAKS  # counts its own flops, not the kernel's
        flops = reference_iters(name, abi.isa, abi.flops, threads)[1] if peak else abi.flops
        return timed_result(name, samples[name], reps.get(name, 0), flops)

    results = [timed(MORELLO)]
    for name in wanted:
        results.append(timed(name) if name in passed else ImplResult(name, skipped=skipped[name]))
    if one_thread is not None:
        results.append(timed(ONE_THREAD))
    not_peers = (*REFERENCES, ONE_THREAD)
    if rows:
        report = BenchReport(
            spec=kernel.spec_text,
            kernel=abi.name,
            target=abi.isa,
            threads=threads,
            flops=abi.flops,
            compiler=cc.name,
            results=tuple(results),
            best_peer=None,
            ratio=None,
            peer_limit=peer_limit,
            tune=kernel.tune,
            bytes=sum(
                math.prod(op.shape) * np.dtype(STORAGE[op.dtype]).itemsize for op in abi.operands
            ),
            python_results=python.results if python is not None else (),
            xla_flags=python.xla_flags if python is not None else "",
            cpu=host_cpu_name(),
        )
        ratios = report.peer_ratios()
        best_name = min(ratios, key=lambda k: ratios[k], default=None)
        return replace(
            report,
            best_peer=best_name,
            ratio=ratios[best_name] if best_name is not None else None,
        )
    timed_peers = [r for r in results[1:] if r.skipped is None and r.name not in not_peers]
    best = min(timed_peers, key=lambda r: r.seconds, default=None)
    ratio = best.seconds / results[0].seconds if best is not None else None
    return BenchReport(
        spec=kernel.spec_text,
        kernel=abi.name,
        target=abi.isa,
        threads=threads,
        flops=abi.flops,
        compiler=cc.name,
        results=tuple(results),
        best_peer=best.name if best else None,
        ratio=ratio,
        peer_limit=peer_limit,
        tune=kernel.tune,
        array_offset=array_offset,
        cpu=host_cpu_name(),
    )
