"""The Python peers of a row operation (onnxruntime, XLA through jax.jit), timed in this
process beside the morello kernel called through ctypes.

Why in Python: these libraries have no C entry point the C harness could call, so they
cannot be timed round-robin there. Comparing their Python-loop times with the kernel's
C-harness time would charge them a Python call (~1 us) the kernel never pays; so the
kernel is also loaded as a shared library and timed through ctypes in the same loop, and
each Python peer's ratio is over that: call overhead on both sides, like with like.

The protocol is the C harness's (`harness.bench`): `WARMUP_SECONDS` of untimed calls per
implementation, a calibrated repetition count so one sample lasts `SAMPLE_SECONDS`, then
rounds of one sample of every implementation with the starting one rotating; medians and
bests of seconds per call. Every implementation runs once on the same input first and is
checked against the numpy reference with `harness.row_reference`'s bounds: a peer outside
them is reported "wrong result" and not timed; the kernel outside them is an error.

Threads: a one-thread run pins this process to one CPU while it builds the sessions and
times (so every pool created then has one CPU), onnxruntime gets
``intra_op_num_threads=threads``, ``inter_op_num_threads=1`` and no spinning (the
implementations alternate; a spinning pool would steal the next one's cores), and XLA
gets ``--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`` for one thread
(XLA_FLAGS is read once, when jax is first imported: a later run with another thread
count in the same process reports jax skipped).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import GeneratedKernel
from morello_build.harness.compile import (
    Compiler,
    build_shared_library,
    kernel_files,
    kernel_flags,
    uses_openmp,
)
from morello_build.harness.peer_registry import PYTHON_PEERS
from morello_build.harness.report import ImplResult
from morello_build.ir.spec import MAX, SUM

__all__ = [
    "JAX",
    "MORELLO_PY",
    "ONNXRUNTIME",
    "PY_PEERS",
    "PyImpl",
    "PythonTiming",
    "time_python_peers",
]

ONNXRUNTIME, JAX = PYTHON_PEERS
#: The Python peers, in table order.
PY_PEERS: tuple[str, ...] = PYTHON_PEERS
#: The kernel's row in the Python loop (called through ctypes).
MORELLO_PY = "morello-build (ctypes)"


@dataclass(frozen=True)
class PyImpl:
    """One implementation in the Python loop: `run()` computes into its output, which
    `result()` returns (float32, the logical shape)."""

    name: str
    run: Callable[[], object]
    result: Callable[[], NDArray[Any]]


@dataclass(frozen=True)
class PythonTiming:
    """The Python loop's results: the kernel first, then the peers (timed or skipped)."""

    results: tuple[ImplResult, ...]
    xla_flags: str = ""  # what jax ran with, when it ran

    def ratio(self, name: str) -> float | None:
        """`name`'s median over the kernel's (> 1: the kernel is faster), if both ran."""
        mine = self.results[0]
        other = next((r for r in self.results if r.name == name), None)
        if other is None or other.skipped is not None or mine.skipped is not None:
            return None
        return other.seconds / mine.seconds


# --------------------------------------------------------------------------- the kernel


def ctypes_kernel(
    kernel: GeneratedKernel, cc: Compiler, workdir: Path, x: NDArray[Any], out: NDArray[Any]
) -> PyImpl:
    """The kernel as a shared library (its own flags, OpenMP when it has parallel loops),
    called through ctypes on `x` and `out` (pointers resolved once, as a caller would)."""
    abi = kernel.abi
    openmp = uses_openmp(kernel)
    flags = [*kernel_flags(abi.isa, openmp=openmp), "-fPIC"]
    lib_path = build_shared_library(
        cc, workdir, kernel_files(kernel), "morello_py", flags=flags, libs=["-lm"]
    )
    fn = getattr(ctypes.CDLL(str(lib_path)), abi.name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    px, po = x.ctypes.data, out.ctypes.data
    return PyImpl(MORELLO_PY, lambda: fn(px, po), lambda: out)


#: Row operations whose output is one value per row.
_REDUCTIONS = (MAX, SUM)


def _out_shape(op: str, rows: int, n: int) -> list[int]:
    return [rows] if op in _REDUCTIONS else [rows, n]


# --------------------------------------------------------------------------- onnxruntime


def _onnx_model(op: str, rows: int, n: int) -> bytes:
    """A one-node ONNX model (opset 20) of `op` on a float [rows, n] input `x` (a
    reduction's output `y` is [rows]: its axes are an initializer, keepdims off)."""
    from onnx import TensorProto, helper

    axes = [helper.make_tensor("axes", TensorProto.INT64, [1], [-1])]
    nodes = {
        "max": [helper.make_node("ReduceMax", ["x", "axes"], ["y"], keepdims=0)],
        "sum": [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        "softmax": [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
        "relu": [helper.make_node("Relu", ["x"], ["y"])],
        "exp": [helper.make_node("Exp", ["x"], ["y"])],
        "gelu_erf": [helper.make_node("Gelu", ["x"], ["y"], approximate="none")],
        "gelu_tanh": [helper.make_node("Gelu", ["x"], ["y"], approximate="tanh")],
        "silu": [
            helper.make_node("Sigmoid", ["x"], ["s"]),
            helper.make_node("Mul", ["x", "s"], ["y"]),
        ],
    }[op]
    graph = helper.make_graph(
        nodes,
        f"morello_bench_{op}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, _out_shape(op, rows, n))],
        initializer=axes if op in _REDUCTIONS else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 10  # opset 20's; what onnxruntime releases since 1.17 read
    return bytes(model.SerializeToString())


def plan_onnxruntime(op: str, x: NDArray[Any], dtype: str, threads: int) -> PyImpl | str:
    """An onnxruntime session of the one-node model, inputs and output bound once
    (IOBinding over numpy buffers: no copy per call)."""
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        return "onnxruntime or onnx is not installed (pip install onnxruntime onnx)"
    if dtype != "f32":
        return f"onnxruntime's CPU kernels of these ops take float input, not {dtype}"
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    rows, n = x.shape
    sess = ort.InferenceSession(_onnx_model(op, rows, n), so, providers=["CPUExecutionProvider"])
    out = np.zeros(_out_shape(op, rows, n), dtype=np.float32)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
    ov = ort.OrtValue.ortvalue_from_numpy(out)
    binding.bind_ortvalue_output("y", ov)
    return PyImpl(
        ONNXRUNTIME,
        lambda: sess.run_with_iobinding(binding),
        lambda: np.asarray(ov.numpy()),
    )


# --------------------------------------------------------------------------- jax


def xla_flags(threads: int) -> str:
    """XLA_FLAGS holding XLA's CPU backend to `threads` as far as flags can."""
    if threads == 1:
        return "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    return f"--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={threads}"


_jax_flags: list[str] = []  # the XLA_FLAGS jax was imported with (by us), once set


def jax_flags_problem(threads: int) -> str:
    """Put `threads`' XLA_FLAGS in the environment before jax's first import (jax reads
    them once): "" when jax runs with them, else why it cannot in this process."""
    flags = xla_flags(threads)
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        _jax_flags.append(flags)
    elif _jax_flags[:1] != [flags] and flags not in os.environ.get("XLA_FLAGS", ""):
        return (
            "jax was imported in this process with other XLA thread flags "
            f"({_jax_flags[0] if _jax_flags else os.environ.get('XLA_FLAGS', 'none')!r})"
        )
    return ""


def plan_jax(op: str, x: NDArray[Any], dtype: str, threads: int) -> PyImpl | str:
    """`jax.jit` of the op on the CPU backend (bf16 input: widened in the jitted function);
    the output is a new device buffer per call (jax has no out= argument)."""
    if importlib.util.find_spec("jax") is None:
        return "jax is not installed (pip install 'jax[cpu]')"
    why = jax_flags_problem(threads)
    if why:
        return why
    import jax
    import jax.numpy as jnp

    fns: Mapping[str, Callable[[Any], Any]] = {
        "max": lambda v: jnp.max(v, axis=-1),
        "sum": lambda v: jnp.sum(v, axis=-1),
        "softmax": lambda v: jax.nn.softmax(v, axis=-1),
        "relu": jax.nn.relu,
        "exp": jnp.exp,
        "silu": jax.nn.silu,
        "gelu_erf": lambda v: jax.nn.gelu(v, approximate=False),
        "gelu_tanh": lambda v: jax.nn.gelu(v, approximate=True),
    }
    body = fns[op]
    if dtype == "bf16":
        import ml_dtypes

        x = x.view(ml_dtypes.bfloat16)
    f = jax.jit(lambda v: body(v.astype(jnp.float32)))
    dev = jax.device_put(x, jax.devices("cpu")[0])
    last: list[Any] = [None]

    def run() -> None:
        last[0] = f(dev)
        last[0].block_until_ready()

    return PyImpl(f"{JAX}", run, lambda: np.asarray(last[0]))


PLANS: dict[str, Callable[[str, NDArray[Any], str, int], PyImpl | str]] = {
    ONNXRUNTIME: plan_onnxruntime,
    JAX: plan_jax,
}


# --------------------------------------------------------------------------- timing


def _block(run: Callable[[], object], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    return time.perf_counter() - t0


def _calibrate(run: Callable[[], object], sample_s: float, warmup_s: float) -> int:
    """Warm up, then the C harness's calibration: double until a block lasts a quarter of
    a sample, scale to a sample, re-measure once and rescale."""
    t0, w = time.perf_counter(), 0
    while w < 2 or time.perf_counter() - t0 < warmup_s:
        run()
        w += 1
    reps = 1
    t = _block(run, reps)
    while t < sample_s / 4 and reps < 1 << 40:
        reps *= 2
        t = _block(run, reps)
    for rescale in range(2):
        reps = max(1, math.ceil(reps * sample_s / (t if t > 0 else 1e-9)))
        if rescale == 0:
            t = _block(run, reps)
    return reps


def time_round_robin(
    impls: Sequence[PyImpl], sample_s: float, min_time: float, warmup_s: float, min_samples: int
) -> dict[str, tuple[list[float], int]]:
    """Seconds per call of each sample and calls per sample, per implementation."""
    reps = [_calibrate(i.run, sample_s, warmup_s) for i in impls]
    samples: list[list[float]] = [[] for _ in impls]
    rounds = min(100_000, max(min_samples, math.ceil(min_time / sample_s)))
    for r in range(rounds):
        for q in range(len(impls)):
            s = (r + q) % len(impls)
            samples[s].append(_block(impls[s].run, reps[s]) / reps[s])
    return {i.name: (samples[k], reps[k]) for k, i in enumerate(impls)}


@contextlib.contextmanager
def pinned(threads: int) -> Iterator[None]:
    """With one thread, this process on one CPU (its first allowed) for the duration."""
    if threads != 1 or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def time_python_peers(
    kernel: GeneratedKernel,
    x_storage: NDArray[Any],
    check: Callable[[NDArray[np.float64]], tuple[bool, str]],
    *,
    peers: Sequence[str],
    threads: int,
    cc: Compiler,
    workdir: Path,
    sample_s: float,
    min_time: float,
    warmup_s: float,
    min_samples: int,
    plans: Mapping[str, Callable[[str, NDArray[Any], str, int], PyImpl | str]] | None = None,
) -> PythonTiming:
    """Check, then time round-robin, the kernel through ctypes and the Python `peers`.

    `check(values)` says whether an output (float64, logical shape) is within the
    reference's bounds, and why not. Raises ValueError if the kernel's own output fails
    (the caller reports it as the kernel's error)."""
    abi = kernel.abi
    op, dtype = abi.op, abi.operands[0].dtype
    plans = PLANS if plans is None else plans
    x = np.ascontiguousarray(x_storage)
    out = np.full(abi.operands[1].shape, np.nan, dtype=np.float32)
    skipped: dict[str, str] = {}
    with pinned(threads):
        impls = [ctypes_kernel(kernel, cc, workdir, x, out)]
        for name in peers:
            plan = plans.get(name)
            try:
                got = plan(op, x, dtype, threads) if plan else f"unknown Python peer {name!r}"
            except Exception as exc:  # a peer library's failure is the peer's, not ours
                got = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if isinstance(got, str):
                skipped[name] = got
            else:
                impls.append(PyImpl(name, got.run, got.result))
        passed: list[PyImpl] = []
        for impl in impls:
            try:
                impl.run()
                ok, msg = check(np.asarray(impl.result(), dtype=np.float64))
            except Exception as exc:
                ok, msg = False, f"{type(exc).__name__}: {exc}"
            if ok:
                passed.append(impl)
            elif impl.name == MORELLO_PY:
                raise ValueError(f"computed a wrong result through ctypes: {msg}")
            else:
                skipped[impl.name] = f"wrong result ({msg})"
        timings = time_round_robin(passed, sample_s, min_time, warmup_s, min_samples)
    results = [_result(MORELLO_PY, *timings[MORELLO_PY])]
    for name in peers:
        if name in timings:
            results.append(_result(name, *timings[name]))
        else:
            results.append(ImplResult(name, skipped=skipped[name]))
    return PythonTiming(tuple(results), _jax_flags[0] if JAX in timings and _jax_flags else "")


def _result(name: str, samples: list[float], reps: int) -> ImplResult:
    med, best = statistics.median(samples), min(samples)
    return ImplResult(name, med, best, 0.0, 0.0, len(samples), reps)
