"""Time a pipeline kernel (``gelu(x @ w + b)``) against what a user runs without it: numpy
(an OpenBLAS matmul, then one numpy pass per epilogue operation), onnxruntime's optimized
graph of the same ops (it fuses MatMul+Add+Gelu itself), XLA through `jax.jit` and oneDNN's
matmul primitive with the epilogue as post-ops (`harness.onednn_matmul`).

As in `harness.row_peers` (whose timing loop this reuses), everything runs in this process,
the kernel through ctypes on preallocated numpy buffers, so each call pays Python's
overhead alike. One thread each: the thread variables are 1 while peer libraries load, an
OpenBLAS already loaded (numpy's) is set to 1 thread through its own knob, the process is
pinned to one CPU, onnxruntime gets one intra-op thread and XLA `row_peers.xla_flags(1)`.
Every implementation first runs once on the same inputs and is checked against
`pipeline_reference`'s per-element bound: a peer outside it is reported "wrong" and not
timed; the kernel outside it is a `BenchError`.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib.util
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import GeneratedKernel, OperandABI
from morello_build.harness.arrays import decode, encode, from_physical, placed, to_physical
from morello_build.harness.bench import MIN_SAMPLES, SAMPLE_SECONDS, WARMUP_SECONDS, BenchError
from morello_build.harness.compile import (
    IsaUnavailable,
    build_shared_library,
    find_compiler,
    kernel_files,
)
from morello_build.harness.onednn_matmul import onednn_matmul
from morello_build.harness.peer_registry import (
    PeerLib,
    array_offset_problem,
    find_mkl,
    find_onednn,
    find_openblas,
)
from morello_build.harness.pipeline_reference import pipeline_inputs, pipeline_reference
from morello_build.harness.row_peers import (
    PyImpl,
    jax_flags_problem,
    pinned,
    time_round_robin,
    xla_flags,
)
from morello_build.harness.row_reference import broadcast_operand, compare_rows
from morello_build.harness.unfused_c import C_FLAGS, unfused_c
from morello_build.harness.verify import kernel_compile_flags
from morello_build.ir.spec import (
    ADD_KINDS,
    BROADCAST_KINDS,
    GATE,
    MATMUL,
    broadcast_dims,
    compose_stages,
)
from morello_build.machine.isa import host_cpu_name, host_supports

__all__ = [
    "BF16_PEERS",
    "C_MKL",
    "C_OPENBLAS",
    "DEFAULT_PEERS",
    "JAX",
    "JAX_BF16",
    "MORELLO",
    "ONEDNN",
    "ONNXRUNTIME",
    "peers_for",
]
__all__ += ["UNFUSED", "PipelineBench"]
__all__ += ["PipelineCase", "PipelinePeer", "PipelineRow", "bench_pipeline", "kernel_inputs"]
__all__ += ["peer_inputs"]

MORELLO = "morello"
UNFUSED = "unfused (numpy/OpenBLAS)"
ONNXRUNTIME = "onnxruntime"
JAX = "jax.jit (XLA CPU)"
JAX_BF16 = "jax.jit/bf16 (XLA CPU, bf16 inputs)"
ONEDNN = "oneDNN matmul + post-ops"
C_OPENBLAS = "sgemm (OpenBLAS) + C loops"
C_MKL = "sgemm (MKL) + C loops"
T = TypeVar("T")
_OPERAND_KINDS = (MATMUL, GATE, *BROADCAST_KINDS)  # the stages that read an input
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass(frozen=True)
class PipelineCase:
    """The inputs as peers get them: f32 (bf16 values widen exactly), the kernel's inputs
    in order and in its layouts (matrices 2-D), each with whether it is stored transposed
    (``w.T``: w is [N, K]); `bf16` says which of them the kernel reads as bf16 (a peer
    that takes bf16 may narrow those exactly)."""

    stages: tuple[str, ...]
    inputs: tuple[tuple[NDArray[np.float32], bool], ...]
    out_shape: tuple[int, int]
    bf16: tuple[bool, ...] = ()

    def logical(self) -> list[NDArray[np.float32]]:
        return [a.T if transposed else a for a, transposed in self.inputs]

    def walk(self, items: Sequence[T]) -> tuple[T, list[tuple[str, T | None]]]:
        """Pair `items` (one per input) with the stages: the head's input, then (stage, its
        operand or None) in order; a matmul's operand is its right matrix, a gate's the
        right matrix of its product with the head's input."""
        it = iter(items)
        head = next(it)
        return head, [(k, next(it) if k in _OPERAND_KINDS else None) for k in self.stages]


@dataclass(frozen=True)
class PipelinePeer:
    """An implementation to time beside the kernel: `plan` returns it ready to call, or
    why it cannot run ("not installed (pip install ...)"); `fused`: one library call
    computes the whole pipeline."""

    name: str
    fused: bool
    plan: Callable[[PipelineCase], PyImpl | str]


@dataclass(frozen=True)
class PipelineRow:
    """One implementation's result; `status` is "ok" when timed, else why not."""

    name: str
    fused: bool
    ms: float | None = None  # median milliseconds per call
    gflops: float | None = None  # abi.flops at the median
    speedup: float | None = None  # this ms / morello's ms: > 1 means morello is faster
    checked: float | None = None  # largest error as a fraction of its bound (<= 1 passes)
    status: str = "ok"


@dataclass(frozen=True)
class PipelineBench:
    """A kernel timed with its peers: `rows` holds morello first, then the peers in order."""

    kernel: str
    op: str
    isa: str
    flops: int
    operands: tuple[tuple[str, tuple[int, ...], str], ...]  # name, logical shape, dtype
    rows: tuple[PipelineRow, ...]
    notes: tuple[str, ...]
    array_offset: int | None = None  # bytes past a 64-byte boundary; None: numpy's placement
    cpu: str = ""  # the host's `machine.isa.host_cpu_name`

    def row(self, name: str) -> PipelineRow:
        return next(r for r in self.rows if r.name == name)

    def best(self, *, fused: bool) -> PipelineRow | None:
        """The fastest timed peer (never morello) that is fused, or unfused."""
        timed = [r for r in self.rows[1:] if r.fused == fused and r.ms is not None]
        return min(timed, key=lambda r: r.ms or math.inf, default=None)

    def to_table(self) -> str:
        """Markdown: a caption, the table, then the notes as a list."""
        shapes = ", ".join(f"{n} {'x'.join(map(str, s))} {d}" for n, s, d in self.operands)
        lines = [
            f"`{self.kernel}`: {self.op} ({shapes}), {self.isa}, {self.flops} flop, 1 thread"
            + (f", on {self.cpu}" if self.cpu else "")
            + "\n",
            "| implementation | median ms | GFLOP/s | morello speedup | checked (max error / bound) |",
            "|---|---:|---:|---:|---|",
        ]
        for r in self.rows:
            ok = r.status if r.checked is None or r.status != "ok" else f"{100 * r.checked:.1f}%"
            if r.ms is None or r.gflops is None or r.speedup is None:
                lines.append(f"| {r.name} | - | - | - | {ok} |")
            else:
                lines.append(
                    f"| {r.name} | {r.ms:.4g} | {r.gflops:.1f} | {r.speedup:.2f}x | {ok} |"
                )
        return "\n".join([*lines, "", *(f"- {n}" for n in self.notes)]) + "\n"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- peers


def erf_f32() -> tuple[Callable[[NDArray[Any], NDArray[Any]], object], str]:
    """The fastest erf available for float32 arrays (`erf(v, out)`), and its name."""
    if importlib.util.find_spec("scipy") is not None:
        from scipy.special import erf

        return (lambda v, out: erf(v, out=out)), "scipy.special.erf (its float32 loop)"
    vec = np.vectorize(math.erf, otypes=[np.float32])
    return (lambda v, out: np.copyto(out, vec(v))), "np.vectorize(math.erf) (no scipy)"


def _numpy_passes(
    kind: str, src: NDArray[Any], y: NDArray[Any], t: NDArray[Any], vec: NDArray[Any] | None
) -> list[Callable[[], object]]:
    """y = kind(src) as a numpy user writes it, one pass per operation (`t`: scratch)."""
    P = functools.partial
    if kind in BROADCAST_KINDS:
        assert vec is not None
        b = broadcast_operand(kind, vec)
        return [P(np.add if kind in ADD_KINDS else np.multiply, src, b, out=y)]
    if kind == "relu":
        return [P(np.maximum, src, np.float32(0), out=y)]
    if kind == "softmax":  # exp(x - max) / sum, along each row
        rows = np.empty((src.shape[0], 1), dtype=np.float32)
        return [
            P(np.max, src, axis=1, keepdims=True, out=rows),
            P(np.subtract, src, rows, out=y),
            P(np.exp, y, out=y),
            P(np.sum, y, axis=1, keepdims=True, out=rows),
            P(np.divide, y, rows, out=y),
        ]
    if kind == "exp":
        return [P(np.exp, src, out=y)]
    inc, times = P(np.add, t, np.float32(1), out=t), P(np.multiply, src, t, out=y)
    half = P(np.multiply, y, np.float32(0.5), out=y)
    if kind == "silu":  # x / (1 + exp(-x))
        return [P(np.negative, src, out=t), P(np.exp, t, out=t), inc, P(np.divide, src, t, out=y)]
    if kind == "gelu_erf":  # 0.5 x (1 + erf(x / sqrt 2))
        r2 = np.float32(1 / math.sqrt(2))
        return [P(np.multiply, src, r2, out=t), P(erf_f32()[0], t, t), inc, times, half]
    if kind == "gelu_tanh":  # 0.5 x (1 + tanh(sqrt(2 / pi) x (1 + 0.044715 x^2)))
        k, c = np.float32(0.044715), np.float32(math.sqrt(2 / math.pi))
        cubic = [P(np.multiply, src, src, out=t), P(np.multiply, t, k, out=t), inc]
        scale = [P(np.multiply, t, src, out=t), P(np.multiply, t, c, out=t)]
        return [*cubic, *scale, P(np.tanh, t, out=t), inc, times, half]
    raise ValueError(f"unknown stage {kind!r}")


def plan_unfused(case: PipelineCase) -> PyImpl | str:
    """`np.matmul(x, w, out=y)` (numpy's OpenBLAS), then the epilogue in place, f32."""
    src, stages = case.walk(case.logical())
    first = src
    y = t = np.empty(0, dtype=np.float32)
    steps: list[Callable[[], object]] = []
    for kind, arg in stages:
        if kind == MATMUL:  # a new value: its own output and scratch
            assert arg is not None
            y = np.empty((src.shape[0], arg.shape[1]), dtype=np.float32)
            t = np.empty_like(y)
            steps.append(functools.partial(np.matmul, src, arg, out=y))
        elif kind == GATE:  # y *= first @ arg, the product into its own array
            assert arg is not None
            g = np.empty_like(y)
            steps.append(functools.partial(np.matmul, first, arg, out=g))
            steps.append(functools.partial(np.multiply, y, g, out=y))
        else:
            if src is not y:  # an elementwise head
                y, t = np.empty(src.shape, dtype=np.float32), np.empty(src.shape, dtype=np.float32)
            steps += _numpy_passes(kind, src, y, t, arg)
        src = y

    def run() -> None:
        with np.errstate(over="ignore"):
            for step in steps:
                step()

    return PyImpl(UNFUSED, run, lambda: y)


#: Activations as ONNX ops (domain, op); silu is Sigmoid then Mul.
_ONNX_OPS = {"relu": ("", "Relu"), "exp": ("", "Exp"), "gelu_erf": ("com.microsoft", "Gelu")}
_ONNX_OPS["gelu_tanh"] = ("com.microsoft", "FastGelu")


def _is_column(kind: str) -> bool:
    """A broadcast of a column vector (one value per row: onnxruntime wants it `[M, 1]`)."""
    return kind in BROADCAST_KINDS and broadcast_dims(kind) == (0,)


def onnx_model(case: PipelineCase) -> tuple[bytes, dict[str, NDArray[np.float32]], str]:
    """The graph (opset 17 + com.microsoft 1), its inputs by name, its output's name."""
    from onnx import TensorProto, helper

    feeds: dict[str, NDArray[np.float32]] = {}
    nodes, names = [], []
    col = {i for k, i in case.walk(range(len(case.inputs)))[1] if _is_column(k)}
    for i, (a, transposed) in enumerate(case.inputs):
        feeds[f"in{i}"] = a[:, None] if i in col else a  # a column vector is [M, 1]
        if transposed:
            nodes.append(helper.make_node("Transpose", [f"in{i}"], [f"in{i}T"], perm=[1, 0]))
        names.append(f"in{i}T" if transposed else f"in{i}")
    cur, stages = case.walk(names)
    first = cur
    for i, (kind, arg) in enumerate(stages):
        if kind == GATE:
            assert arg is not None
            nodes.append(helper.make_node("MatMul", [first, arg], [f"g{i}"]))
            nodes.append(helper.make_node("Mul", [cur, f"g{i}"], [f"v{i}"]))
        elif arg is not None:
            op = "MatMul" if kind == MATMUL else "Add" if kind in ADD_KINDS else "Mul"
            nodes.append(helper.make_node(op, [cur, arg], [f"v{i}"]))
        elif kind == "silu":
            nodes.append(helper.make_node("Sigmoid", [cur], [f"s{i}"]))
            nodes.append(helper.make_node("Mul", [cur, f"s{i}"], [f"v{i}"]))
        elif kind == "softmax":
            nodes.append(helper.make_node("Softmax", [cur], [f"v{i}"], axis=-1))
        else:
            domain, op = _ONNX_OPS[kind]
            nodes.append(helper.make_node(op, [cur], [f"v{i}"], domain=domain))
        cur = f"v{i}"
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "morello_pipeline",
        [helper.make_tensor_value_info(n, f32, list(a.shape)) for n, a in feeds.items()],
        [helper.make_tensor_value_info(cur, f32, list(case.out_shape))],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # opset 17's
    return bytes(model.SerializeToString()), feeds, cur


def plan_onnxruntime(case: PipelineCase) -> PyImpl | str:
    """An ORT_ENABLE_ALL session on one thread, inputs and output bound once (no copies)."""
    if importlib.util.find_spec("onnxruntime") is None or importlib.util.find_spec("onnx") is None:
        return "not installed (pip install onnxruntime onnx)"
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.log_severity_level = 3
    model, feeds, out_name = onnx_model(case)
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    binding = sess.io_binding()
    for n, a in feeds.items():
        binding.bind_ortvalue_input(n, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a)))
    ov = ort.OrtValue.ortvalue_from_numpy(np.zeros(case.out_shape, dtype=np.float32))
    binding.bind_ortvalue_output(out_name, ov)
    return PyImpl(ONNXRUNTIME, lambda: sess.run_with_iobinding(binding), lambda: ov.numpy())


def _import_jax() -> str:
    """Import jax with XLA on one thread (row_peers' rule and state): "" or why not."""
    if importlib.util.find_spec("jax") is None:
        return "not installed (pip install 'jax[cpu]')"
    return jax_flags_problem(1)


def plan_jax(case: PipelineCase) -> PyImpl | str:
    """`jax.jit` of the expression (f32 matmul at HIGHEST precision) on device buffers."""
    return _plan_jax(case, JAX, narrow=False)


def plan_jax_bf16(case: PipelineCase) -> PyImpl | str:
    """`jax.jit` given the kernel's bf16 inputs as bf16 arrays, as a user holding bf16
    weights would call it: a product of two of them is a bf16 dot that accumulates in f32
    (`preferred_element_type`; how XLA runs it is XLA's choice), a product with an f32
    value widens the bf16 side and runs at HIGHEST, so the result keeps the kernel's
    accuracy (narrowing softmax's probabilities to bf16 instead fails the reference's
    bound). Timed beside the f32 call: neither was faster at every shape measured
    (docs/performance.md, "The attention core with bf16 inputs on AMD Zen 5")."""
    if not any(case.bf16):
        return "the kernel reads no bf16 input"
    return _plan_jax(case, JAX_BF16, narrow=True)


def _plan_jax(case: PipelineCase, name: str, narrow: bool) -> PyImpl | str:
    why = _import_jax()
    if why:
        return why
    import jax
    import jax.numpy as jnp

    acts: dict[str, Callable[[Any], Any]] = {"relu": jax.nn.relu, "exp": jnp.exp}
    acts |= {"silu": jax.nn.silu, "gelu_erf": functools.partial(jax.nn.gelu, approximate=False)}
    acts["gelu_tanh"] = functools.partial(jax.nn.gelu, approximate=True)
    acts["softmax"] = functools.partial(jax.nn.softmax, axis=-1)
    transposed = [t for _, t in case.inputs]
    f32, bf16 = jnp.float32, jnp.bfloat16

    def matmul(a: Any, b: Any) -> Any:
        if a.dtype == bf16 and b.dtype == bf16:
            return jnp.matmul(a, b, preferred_element_type=f32)
        return jnp.matmul(a.astype(f32), b.astype(f32), precision=jax.lax.Precision.HIGHEST)

    def f(arrays: Sequence[Any]) -> Any:
        v, stages = case.walk([a.T if t else a for a, t in zip(arrays, transposed, strict=True)])
        first = v
        for kind, arg in stages:
            if arg is None:
                v = acts[kind](v.astype(f32))
            elif kind == GATE:
                v = v.astype(f32) * matmul(first, arg)
            elif kind == MATMUL:
                v = matmul(v, arg)
            else:
                b = broadcast_operand(kind, arg)
                v = v.astype(f32) + b if kind in ADD_KINDS else v.astype(f32) * b
        return v.astype(f32)

    jf, cpu = jax.jit(f), jax.devices("cpu")[0]
    narrowed = case.bf16 if narrow else (False,) * len(case.inputs)
    arrays = [
        jax.device_put(a.astype(bf16) if n else a, cpu)  # bf16 values: exact both ways
        for (a, _), n in zip(case.inputs, narrowed, strict=True)
    ]
    last: list[Any] = [None]

    def run() -> None:
        last[0] = jf(arrays)
        last[0].block_until_ready()

    return PyImpl(name, run, lambda: np.asarray(last[0]))


def plan_onednn(case: PipelineCase) -> PyImpl | str:
    """One oneDNN matmul primitive with the epilogue as post-ops (`harness.onednn_matmul`),
    on the inputs in their own layouts; pipelines with a second product or a softmax are
    not one primitive and get why not."""
    head, stages = case.walk(case.logical())
    got = onednn_matmul(head, stages, case.out_shape)
    if isinstance(got, str):
        return got
    return PyImpl(ONEDNN, got.run, lambda: got.out)


def _plan_c(name: str, blas: Callable[[], PeerLib]) -> Callable[[PipelineCase], PyImpl | str]:
    def plan(case: PipelineCase) -> PyImpl | str:
        """A BLAS sgemm per product and a C loop per epilogue (`harness.unfused_c`)."""
        head, stages = case.walk(case.logical())
        got = unfused_c(head, stages, blas())
        if isinstance(got, str):
            return got
        return PyImpl(name, got.run, lambda: got.out)

    return plan


DEFAULT_PEERS: tuple[PipelinePeer, ...] = (
    PipelinePeer(UNFUSED, False, plan_unfused),
    PipelinePeer(C_OPENBLAS, False, _plan_c(C_OPENBLAS, find_openblas)),
    PipelinePeer(C_MKL, False, _plan_c(C_MKL, find_mkl)),
    PipelinePeer(ONNXRUNTIME, True, plan_onnxruntime),
    PipelinePeer(JAX, True, plan_jax),
    PipelinePeer(ONEDNN, True, plan_onednn),
)
#: The peers that only run when the kernel reads bf16 inputs.
BF16_PEERS: tuple[PipelinePeer, ...] = (PipelinePeer(JAX_BF16, True, plan_jax_bf16),)


def peers_for(dtypes: Sequence[str]) -> tuple[PipelinePeer, ...]:
    """The default peers of a kernel whose inputs have `dtypes`: `BF16_PEERS` too when
    one of them is bf16."""
    return DEFAULT_PEERS + (BF16_PEERS if "bf16" in dtypes else ())


# --------------------------------------------------------------------------- the bench


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """THREAD_ENV at 1 (libraries loading now read it), every loaded OpenBLAS at 1 thread
    (its own knob: numpy's loaded before any variable could be set) and this process
    pinned to one CPU; all restored afterwards."""
    saved = {v: os.environ.get(v) for v in THREAD_ENV}
    os.environ.update(dict.fromkeys(THREAD_ENV, "1"))
    undo: list[Callable[[], object]] = []
    with contextlib.suppress(OSError):
        maps = Path("/proc/self/maps").read_text().splitlines()
        for path in sorted({ln.split()[-1] for ln in maps if "openblas" in ln.lower()}):
            lib = ctypes.CDLL(path)
            for fix in (
                "scipy_openblas_{}64_",
                "scipy_openblas_{}",
                "openblas_{}64_",
                "openblas_{}",
            ):
                get = getattr(lib, fix.format("get_num_threads"), None)
                put = getattr(lib, fix.format("set_num_threads"), None)
                if get is not None and put is not None:
                    undo.append(functools.partial(put, int(get())))
                    put(1)
    try:
        with pinned(1):
            yield
    finally:
        for fn in undo:
            fn()
        os.environ.update({v: old for v, old in saved.items() if old is not None})
        for v in (v for v, old in saved.items() if old is None):
            del os.environ[v]


def peer_inputs(
    ins: Sequence[OperandABI], values: Any, offset: int | None
) -> list[NDArray[np.float32]]:
    """The inputs in f32 and physical layouts, placed at `offset` if not None."""
    phys = [to_physical(values[o.name], o.order).astype(np.float32) for o in ins]
    return phys if offset is None else [placed(a, offset) for a in phys]


def kernel_inputs(
    ins: Sequence[OperandABI],
    values: Any,
    phys: Sequence[NDArray[np.float32]],
    offset: int | None,
) -> list[NDArray[Any]]:
    """The kernel's input buffers: the peers' very arrays (`phys`) where its bytes are
    theirs (f32), its own encoding elsewhere (bf16). With copies of its own, the round
    robin would alternate two sets of weights through the cache and time evictions, not
    code (docs/performance.md, "Harness notes")."""
    bufs: list[NDArray[Any]] = []
    for a, o in zip(phys, ins):
        if o.dtype == "f32":
            bufs.append(a)
        else:
            own = to_physical(encode(o.dtype, values[o.name]), o.order)
            bufs.append(own if offset is None else placed(own, offset))
    return bufs


def _peer_case(
    stages: tuple[str, ...],
    ins: Sequence[OperandABI],
    out: OperandABI,
    phys: Sequence[NDArray[np.float32]],
) -> PipelineCase:
    """The peers' view of `phys` (from `peer_inputs`): matrices 2-D with their
    transposition."""
    inputs = [
        (a.reshape(a.shape[-2:]), bool(o.order) and o.order[-1] != len(o.order) - 1)
        for a, o in zip(phys, ins)  # a scalar has no dims (its buffer is one value)
    ]
    m, n = out.shape
    return PipelineCase(stages, tuple(inputs), (m, n), tuple(o.dtype == "bf16" for o in ins))


def bench_pipeline(
    kernel: GeneratedKernel,
    *,
    min_time: float = 0.5,
    compiler: str | None = None,
    seed: int = 0,
    peers: Sequence[PipelinePeer] | None = None,
    offset: int | None = None,
) -> PipelineBench:
    """Compile `kernel` (-O3 and its ISA, as a user's build does), check it and `peers`
    on the same seeded inputs, and time those within their bounds for about `min_time`
    seconds each. Raises `IsaUnavailable` on a host without the kernel's ISA, `BenchError`
    when the kernel's own result is wrong.

    `offset`: every input (the kernel's and the peers') and the kernel's output start this
    many bytes past a 64-byte boundary; None leaves them where numpy puts them, which
    differs from run to run (docs/cli.md). Peers allocate their own outputs. `peers`
    defaults to `peers_for` the kernel's input dtypes."""
    abi = kernel.abi
    stages = compose_stages(abi.op)
    if stages is None:
        raise ValueError(f"{abi.name}: {abi.op!r} is not a pipeline")
    if not host_supports(abi.isa):
        raise IsaUnavailable(abi.isa)
    ins = [o for o in abi.operands if o.is_input]
    out = next(o for o in abi.operands if not o.is_input)
    if peers is None:
        peers = peers_for([o.dtype for o in ins])
    rng = np.random.default_rng(seed)
    values = pipeline_inputs(
        abi.op, {o.name: o.shape for o in ins}, {o.name: o.dtype for o in ins}, rng
    )
    ref, bound = pipeline_reference(abi.op, values)
    problem = None if offset is None else array_offset_problem(offset)
    if problem is not None:
        raise ValueError(problem)
    phys = peer_inputs(ins, values, offset)
    case = _peer_case(stages, ins, out, phys)
    bufs = kernel_inputs(ins, values, phys, offset)
    bufs.append(np.full([out.shape[i] for i in out.order], np.nan, dtype=np.float32))
    if offset is not None:
        bufs[-1] = placed(bufs[-1], offset)
    with tempfile.TemporaryDirectory(prefix="morello-pipeline-bench-") as tmp:
        # -O3, as MorelloBuild.cmake builds kernels for users and `bench_kernel` times them
        # (verification compiles at -O2; docs/pipelines.md, "Verification")
        flags = kernel_compile_flags(kernel, opt="-O3")
        so = build_shared_library(
            find_compiler(compiler), Path(tmp), kernel_files(kernel), abi.name, flags=flags
        )
        fn = getattr(ctypes.CDLL(str(so)), abi.name)  # never dlclose'd (see verify._call)
    fn.restype, fn.argtypes = None, [ctypes.c_void_p] * len(bufs)
    ptrs = [b.ctypes.data for b in bufs]
    result = functools.partial(decode, out.dtype, from_physical(bufs[-1], out.order))
    impls = [PyImpl(MORELLO, lambda: fn(*ptrs), result)]
    fused = {MORELLO: True, **{p.name: p.fused for p in peers}}
    status: dict[str, str] = {}
    checked: dict[str, float] = {}
    with one_thread():
        for peer in peers:
            try:
                got = peer.plan(case)
            except Exception as exc:  # a peer library's failure is the peer's, not ours
                got = f"failed: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
            if isinstance(got, str):
                status[peer.name] = got
            else:
                impls.append(PyImpl(peer.name, got.run, got.result))
        for impl in impls:
            try:
                impl.run()
                res = np.asarray(impl.result(), dtype=np.float64)
                if res.shape != ref.shape:
                    raise ValueError(f"output shape {res.shape}, expected {ref.shape}")
                ok, _, checked[impl.name], msg = compare_rows(ref, bound, res)
            except Exception as exc:
                ok, msg = False, f"{type(exc).__name__}: {exc}"
            if not ok and impl.name == MORELLO:
                raise BenchError(f"{abi.name} computed a wrong result through ctypes: {msg}")
            if not ok:
                status[impl.name] = f"wrong: {msg}"
        passed = [i for i in impls if i.name not in status]
        timed = time_round_robin(passed, SAMPLE_SECONDS, min_time, WARMUP_SECONDS, MIN_SAMPLES)
    med = {n: statistics.median(s) for n, (s, _) in timed.items()}
    rows = []
    for n in (MORELLO, *(p.name for p in peers)):
        if n in med:
            s = med[n]
            rows.append(
                PipelineRow(n, fused[n], s * 1e3, abi.flops / s / 1e9, s / med[MORELLO], checked[n])
            )
        else:
            rows.append(PipelineRow(n, fused[n], checked=checked.get(n), status=status[n]))
    operands = tuple((o.name, o.shape, o.dtype) for o in abi.operands)
    notes = _notes(abi.op, stages, [o.dtype for o in ins], timed)
    if offset is not None:
        where = f"the inputs and the kernel's output start {offset} bytes past a 64-byte boundary (--offset)"
    else:
        starts = ", ".join(map(str, sorted({b.ctypes.data % 64 for b in bufs})))
        where = f"where numpy put them, {starts} bytes past a 64-byte boundary (no --offset)"
    notes += (f"arrays: {where}",)
    return PipelineBench(
        abi.name, abi.op, abi.isa, abi.flops, operands, tuple(rows), notes, offset, host_cpu_name()
    )


def _notes(op: str, stages: Sequence[str], dtypes: Sequence[str], timed: Any) -> tuple[str, ...]:
    """What a reader needs to interpret the table."""
    n = len(timed[MORELLO][0])
    notes = [
        f"one thread each, all called from Python (morello through ctypes); median of {n} "
        f"samples of ~{SAMPLE_SECONDS * 1e3:g} ms per implementation, taken round-robin",
        f"checked: largest |error| as a % of its bound (harness/pipeline_reference.py, {op})",
    ]
    if "bf16" in dtypes:
        who = (
            f"the kernel and {JAX_BF16.split(' ')[0]} read"
            if JAX_BF16 in timed
            else "the kernel reads"
        )
        notes.append(f"bf16 inputs: {who} bf16; the other peers get the same values as f32")
    if "gelu_erf" in stages:
        notes.append(f"unfused gelu_erf: 0.5 x (1 + erf(x / sqrt 2)) with {erf_f32()[1]}")
    if JAX in timed:
        notes.append(f"jax: XLA_FLAGS={xla_flags(1)!r}; matmul at Precision.HIGHEST (f32)")
    if JAX_BF16 in timed:
        notes.append(
            f"{JAX_BF16}: the kernel's bf16 inputs as bf16 arrays; a product of two of them "
            "is a bf16 dot accumulating in f32, a product with an f32 value widens to f32"
        )
    finders = {C_OPENBLAS: find_openblas, C_MKL: find_mkl}
    blas = [finders[name]() for name in finders if name in timed]
    libs = [f"{lib.name} {lib.version}".strip() for lib in blas]
    if libs:
        notes.append(
            f"C loops: one loop per run of elementwise stages (libm, vectorized by gcc with "
            f"glibc's libmvec), built "
            f"{' '.join(C_FLAGS[:3])}; BLAS from {', '.join(libs)}"
        )
    if ONEDNN in timed:
        notes.append(
            f"oneDNN: {find_onednn().version}, weights in the caller's layout (no reorder)"
        )
    mods = ("numpy", "onnxruntime", "jax")
    versions = [
        f"{m} {getattr(sys.modules[m], '__version__', '?')}" for m in mods if m in sys.modules
    ]
    return (*notes, "versions: " + ", ".join(versions))
