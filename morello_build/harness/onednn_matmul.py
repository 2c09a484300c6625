"""oneDNN's matmul primitive with post-ops, called through ctypes: the fused peer a C++ user
reaches for when a pipeline is one product followed by elementwise work (`gelu(x @ w + b)`:
bias, then eltwise and binary post-ops applied to each tile before it is stored).

The primitive is created once for the shapes and strides of the caller's arrays (as a
framework caches it) and runs on those arrays in place, the weights in the caller's layout
(`w` or `w.T`, no reorder), like the kernel and the other peers, on the host's ISA (as
onnxruntime and XLA run). oneDNN's v3 C API is declared here by value (no headers): the
libraries the harness finds (`find_onednn`) are v3, and the result is checked against the
reference before anything is timed.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.harness.peer_registry import (
    DNNL_ALGS,
    DNNL_TYPES,
    dnnl_eltwise_alpha,
    find_onednn,
)
from morello_build.harness.row_reference import broadcast_operand
from morello_build.ir.spec import ADD_KINDS, BROADCAST_KINDS, MATMUL, PRODUCT_STAGES

__all__ = ["OneDnnMatmul", "onednn_matmul"]

_F32 = DNNL_TYPES["f32"]
_ARG_SRC, _ARG_SRC_1, _ARG_DST, _ARG_WEIGHTS, _ARG_BIAS = 1, 2, 17, 33, 41
_POST_OP_BASE = 32768  # DNNL_ARG_ATTR_MULTIPLE_POST_OP_BASE (v3)
_ACTIVATIONS = ("relu", "gelu_tanh", "silu", "gelu_erf", "exp")  # eltwise post-ops (DNNL_ALGS)
_BINARY = {"add": 0x1FFF0, "mul": 0x1FFF1}  # dnnl_binary_add, dnnl_binary_mul

_Handle = ctypes.c_void_p


class _ExecArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_int), ("memory", _Handle)]


@dataclass(frozen=True)
class OneDnnMatmul:
    """A created primitive and its arguments: `run()` computes into `out`."""

    run_args: tuple[Any, ...]  # (execute, wait, primitive, stream, count, args, library)
    out: NDArray[np.float32]
    keep: tuple[object, ...]  # arrays and handles the primitive points into

    def run(self) -> None:
        execute, wait, prim, stream, count, args, dll = self.run_args
        with _one_thread(dll):
            if execute(prim, stream, count, args) != 0:
                raise RuntimeError("dnnl_primitive_execute failed")
            wait(stream)


def _plan_post_ops(stages: Sequence[tuple[str, Any]]) -> tuple[list[tuple[str, Any]], str]:
    """The stages after the product as oneDNN post-ops, or why they are not ("" if fine)."""
    ops: list[tuple[str, Any]] = []
    for kind, arg in stages:
        if kind in _ACTIVATIONS:
            ops.append(("eltwise", kind))
        elif kind in BROADCAST_KINDS:
            ops.append(("binary", (kind, arg)))
        else:
            return [], f"a {kind} stage after the product is not a oneDNN post-op"
    return ops, ""


def _library() -> ctypes.CDLL | str:
    lib = find_onednn()
    if not lib.available:
        return lib.reason
    dll = ctypes.CDLL(lib.library)
    dll.dnnl_version.restype = ctypes.POINTER(ctypes.c_int * 3)  # major, minor, patch first
    version = dll.dnnl_version().contents
    if version[0] != 3:
        return f"oneDNN {version[0]}.{version[1]} at {lib.library}: the peer calls its v3 C API"
    return dll


@contextlib.contextmanager
def _one_thread(dll: ctypes.CDLL) -> Iterator[None]:
    """Run oneDNN's OpenMP runtime (when it has one) on this thread alone, as every row of
    the table runs, whatever OMP_NUM_THREADS said when the runtime loaded, and leave the
    process's thread count as it was. A team of threads started here would hang any child
    this process forks to run an OpenMP kernel (`harness.verify` does): libgomp's pool does
    not survive fork. Run alone, the runtime starts no team."""
    get = getattr(dll, "omp_get_max_threads", None)  # dlsym searches the dependencies
    set_threads = getattr(dll, "omp_set_num_threads", None)
    if get is None or set_threads is None:
        yield
        return
    before = get()
    set_threads(1)
    try:
        yield
    finally:
        set_threads(before)


def onednn_matmul(
    x: NDArray[np.float32],
    stages: Sequence[tuple[str, Any]],
    out_shape: tuple[int, int],
) -> OneDnnMatmul | str:
    """`x @ w` then the remaining `stages` ((kind, operand) pairs, the first a matmul) as
    one oneDNN matmul primitive on these arrays, or why it cannot be one."""
    if not stages or stages[0][0] != MATMUL:
        return "the pipeline does not start with a product"
    if any(kind in PRODUCT_STAGES for kind, _ in stages[1:]):
        return "two products are two oneDNN primitives (not one fused call)"
    w = stages[0][1]
    rest = list(stages[1:])
    bias = None
    if rest and rest[0][0] == "add_row":  # oneDNN's own bias argument
        bias = np.ascontiguousarray(rest.pop(0)[1], dtype=np.float32).reshape(1, -1)
    post_ops, why = _plan_post_ops(rest)
    if why:
        return why
    dll = _library()
    if isinstance(dll, str):
        return dll
    with _one_thread(dll):
        return _create(dll, x, w, bias, post_ops, out_shape)


def _create(
    dll: ctypes.CDLL,
    x: NDArray[np.float32],
    w: NDArray[np.float32],
    bias: NDArray[np.float32] | None,
    post_ops: list[tuple[str, Any]],
    out_shape: tuple[int, int],
) -> OneDnnMatmul:
    """The primitive and its memory objects (`onednn_matmul`, inside `_one_thread`)."""
    out = np.zeros(out_shape, dtype=np.float32)
    keep: list[object] = [x, w, out, bias]
    handles: list[_Handle] = []  # kept with the primitive, as long as it may run

    def check(status: int, step: str) -> None:
        if status != 0:  # dnnl_status_t: 3 unimplemented, 2 invalid arguments, ...
            raise RuntimeError(f"{step}: oneDNN status {status}")

    def desc(a: NDArray[np.float32]) -> _Handle:
        if a.dtype != np.float32 or a.ndim != 2:
            raise ValueError(f"expected a 2-D float32 array, got {a.dtype} {a.shape}")
        md = _Handle()
        dims = (ctypes.c_int64 * 2)(*a.shape)
        strides = (ctypes.c_int64 * 2)(*(s // a.itemsize for s in a.strides))
        check(
            dll.dnnl_memory_desc_create_with_strides(ctypes.byref(md), 2, dims, _F32, strides),
            "memory desc",
        )
        handles.append(md)
        return md

    engine, stream, attr, po, pd, prim = (_Handle() for _ in range(6))
    check(
        dll.dnnl_engine_create(ctypes.byref(engine), 1, ctypes.c_size_t(0)),
        "dnnl_engine_create (CPU)",
    )
    check(dll.dnnl_stream_create(ctypes.byref(stream), engine, 1), "dnnl_stream_create")
    check(dll.dnnl_primitive_attr_create(ctypes.byref(attr)), "dnnl_primitive_attr_create")
    check(dll.dnnl_post_ops_create(ctypes.byref(po)), "dnnl_post_ops_create")
    binaries: list[tuple[int, _Handle, NDArray[np.float32]]] = []
    for index, (op, what) in enumerate(post_ops):
        if op == "eltwise":
            alpha = ctypes.c_float(dnnl_eltwise_alpha(what))
            status = dll.dnnl_post_ops_append_eltwise(
                po, DNNL_ALGS[what], alpha, ctypes.c_float(0.0)
            )
            check(status, f"dnnl_post_ops_append_eltwise ({what})")
        else:
            kind, vec = what
            b = np.ascontiguousarray(broadcast_operand(kind, vec), dtype=np.float32)
            alg = _BINARY["add" if kind in ADD_KINDS else "mul"]
            b_md = desc(b)
            check(dll.dnnl_post_ops_append_binary(po, alg, b_md), f"post-op binary ({kind})")
            binaries.append((index, b_md, b))
    check(dll.dnnl_primitive_attr_set_post_ops(attr, po), "dnnl_primitive_attr_set_post_ops")
    src_md, w_md, dst_md = desc(x), desc(w), desc(out)
    bias_md = desc(bias) if bias is not None else None
    status = dll.dnnl_matmul_primitive_desc_create(
        ctypes.byref(pd), engine, src_md, w_md, bias_md, dst_md, attr
    )
    check(status, "dnnl_matmul_primitive_desc_create")
    check(dll.dnnl_primitive_create(ctypes.byref(prim), pd), "dnnl_primitive_create")

    def memory(md: _Handle, a: NDArray[np.float32]) -> _Handle:
        mem = _Handle()
        check(
            dll.dnnl_memory_create(
                ctypes.byref(mem), md, engine, a.ctypes.data_as(ctypes.c_void_p)
            ),
            "dnnl_memory_create",
        )
        return mem

    args = [
        (_ARG_SRC, memory(src_md, x)),
        (_ARG_WEIGHTS, memory(w_md, w)),
        (_ARG_DST, memory(dst_md, out)),
    ]
    if bias is not None and bias_md is not None:
        args.append((_ARG_BIAS, memory(bias_md, bias)))
    for index, b_md, b in binaries:
        args.append((_POST_OP_BASE * (index + 1) | _ARG_SRC_1, memory(b_md, b)))
        keep.append(b)
    exec_args = (_ExecArg * len(args))(*(_ExecArg(a, m) for a, m in args))
    execute = dll.dnnl_primitive_execute
    execute.argtypes = [_Handle, _Handle, ctypes.c_int, ctypes.POINTER(_ExecArg)]
    execute.restype = ctypes.c_int
    run_args = (execute, dll.dnnl_stream_wait, prim, stream, len(args), exec_args, dll)
    return OneDnnMatmul(run_args, out, (*keep, exec_args, dll, engine, handles))
