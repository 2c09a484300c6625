"""The unfused path a C user writes today: a BLAS sgemm per product (sgemv for a single row,
as numpy calls it), then one C loop per run of elementwise stages (the epilogue, read and written once) and one row loop per softmax.

A stronger baseline than numpy's one pass per operation: gelu's five numpy passes are one
loop here. The loops call libm's `erff`, `tanhf` and `expf` and are built `-O3 -march=native
-ffast-math` by the harness's compiler, so gcc vectorizes them with glibc's vector math
(libmvec) where it has it; the result is checked against the reference like every peer's.
Each sgemm is called through a pointer from the same C function, so a call costs one ctypes
hop like the kernel.
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.harness.compile import compile_object, find_compiler, link
from morello_build.harness.peer_registry import PeerLib
from morello_build.ir.spec import ADD_KINDS, BROADCAST_KINDS, GATE, MATMUL, broadcast_dims

__all__ = ["C_FLAGS", "UnfusedC", "unfused_c", "unfused_c_source"]

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112  # CBLAS_ORDER, CBLAS_TRANSPOSE
#: Each activation as C on `v` (float), as its numpy and onnxruntime forms compute it.
_ACTIVATIONS = {
    "relu": "v = v > 0.0f ? v : 0.0f;",
    "gelu_erf": "v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));",
    "gelu_tanh": "v = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * v * (1.0f + 0.044715f * v * v)));",
    "silu": "v = v / (1.0f + expf(-v));",
    "exp": "v = expf(v);",
}
C_FLAGS = ("-O3", "-march=native", "-ffast-math", "-std=gnu99", "-fPIC")


@dataclass(frozen=True)
class UnfusedC:
    """A built pipeline: `run()` computes into `out` (the last step's buffer)."""

    call: Any  # the ctypes function, bound to its arguments by `run`
    args: tuple[Any, ...]
    out: NDArray[np.float32]
    keep: tuple[object, ...]  # arrays the C code points into

    def run(self) -> None:
        self.call(*self.args)


@dataclass(frozen=True)
class _Value:
    """A 2-D value in the C code: where it is, its shape, its strides in elements."""

    ptr: str  # `in[3]` (an input) or `buf[0]` (a buffer of this function's)
    shape: tuple[int, int]
    strides: tuple[int, int]

    def at(self, i: str = "i", j: str = "j") -> str:
        return f"{self.ptr}[{i} * {self.strides[0]}L + {j} * {self.strides[1]}L]"

    @property
    def owned(self) -> bool:
        return self.ptr.startswith("buf")


def _input(a: NDArray[np.float32], slot: int) -> _Value:
    s0, s1 = (s // a.itemsize for s in a.strides)
    return _Value(f"in[{slot}]", (a.shape[0], a.shape[1]), (s0, s1))


def unfused_c_source(
    head: NDArray[np.float32], stages: Sequence[tuple[str, Any]]
) -> tuple[str, list[NDArray[np.float32]], list[tuple[int, int]]] | str:
    """The C function `mb_unfused(sgemm, sgemv, in, buf)` for these stages (`in`: the head, then
    each stage's operand in order; `buf`: one buffer per value it writes), the inputs, and
    the buffers' shapes; or why the stages have no C form here."""
    inputs: list[NDArray[np.float32]] = [head]
    buffers: list[tuple[int, int]] = []
    body: list[str] = []
    cur = _input(head, 0)
    pending: list[str] = []  # elementwise statements not yet emitted as a loop
    into: _Value | None = None  # where the pending loop writes, if not `written`'s choice

    def written(shape: tuple[int, int]) -> _Value:
        """Where a step that reads `cur` writes: in place if `cur` is ours, else a buffer."""
        if cur.owned and cur.shape == shape:
            return cur
        buffers.append(shape)
        return _Value(f"buf[{len(buffers) - 1}]", shape, (shape[1], 1))

    def flush() -> None:
        nonlocal cur, into
        if not pending:
            return
        rows, cols = cur.shape
        out, into = into or written(cur.shape), None
        body.append(f"    for (long i = 0; i < {rows}; i++)")
        body.append(f"        for (long j = 0; j < {cols}; j++) {{")
        body.append(f"            float v = {cur.at()};")
        body.extend(f"            {statement}" for statement in pending)
        body.append(f"            {out.at()} = v;")
        body.append("        }")
        pending.clear()
        cur = out

    def product(lhs: _Value, rhs: _Value) -> _Value | str:
        """`lhs @ rhs` by one BLAS call into a new buffer, or why not."""
        (m, k), (k2, n) = lhs.shape, rhs.shape
        if k != k2:
            return f"a product of {lhs.shape} by {rhs.shape}"
        blas_args = []
        for v in (lhs, rhs):
            if v.strides[1] == 1:
                blas_args.append(f"{_NO_TRANS}, {v.ptr}, {v.strides[0]}")
            elif v.strides[0] == 1:
                blas_args.append(f"{_TRANS}, {v.ptr}, {v.strides[1]}")
            else:
                return f"a matrix with strides {v.strides} is not a BLAS operand"
        buffers.append((m, n))
        out = _Value(f"buf[{len(buffers) - 1}]", (m, n), (n, 1))
        (ta, pa, lda), (tb, pb, ldb) = (a.split(", ") for a in blas_args)
        if m == 1:  # a row times a matrix is a gemv, as numpy calls it: y = w^T x
            trans = _TRANS if tb == str(_NO_TRANS) else _NO_TRANS
            rows, cols = (k, n) if trans == _TRANS else (n, k)
            body.append(
                f"    sgemv({_ROW_MAJOR}, {trans}, {rows}, {cols}, 1.0f, {pb}, {ldb}, "
                f"{pa}, {lhs.strides[1]}, 0.0f, {out.ptr}, 1);"
            )
        else:
            body.append(
                f"    sgemm({_ROW_MAJOR}, {ta}, {tb}, {m}, {n}, {k}, 1.0f, {pa}, {lda}, "
                f"{pb}, {ldb}, 0.0f, {out.ptr}, {n});"
            )
        return out

    first = cur  # the head's lhs: a gate's product reads it again
    for kind, arg in stages:
        operand = None
        if arg is not None:
            inputs.append(arg)
            operand = f"in[{len(inputs) - 1}]"
        if kind == MATMUL:
            flush()
            got = product(cur, _input(arg, len(inputs) - 1))
            if isinstance(got, str):
                return got
            cur = got
        elif kind == GATE:  # v * (head's lhs @ gate): the product by BLAS, then in place
            got = product(first, _input(arg, len(inputs) - 1))
            if isinstance(got, str):
                return got
            pending.append(f"v = v * {got.at()};")
            into = got  # the loop writes the product's buffer: the last one written
        elif kind in BROADCAST_KINDS:
            op = "+" if kind in ADD_KINDS else "*"
            # b's element for value (i, j): one value, a row's, a column's, or a matrix's
            at = {(): "0", (1,): "j", (0,): "i", (0, 1): f"i * {cur.shape[1]} + j"}[
                broadcast_dims(kind)
            ]
            pending.append(f"v = v {op} {operand}[{at}];")
        elif kind in _ACTIVATIONS:
            pending.append(_ACTIVATIONS[kind])
        elif kind == "softmax":
            flush()
            rows, cols = cur.shape
            out = written(cur.shape)
            x, y = cur.at(j="c"), out.at(j="c")
            body += [
                f"    for (long i = 0; i < {rows}; i++) {{",
                f"        float mx = {cur.at(j='0')}, sum = 0.0f;",
                f"        for (long c = 1; c < {cols}; c++) mx = {x} > mx ? {x} : mx;",
                f"        for (long c = 0; c < {cols}; c++) {{",
                f"            float e = expf({x} - mx);",
                f"            {y} = e;",
                "            sum += e;",
                "        }",
                "        float inv = 1.0f / sum;",
                f"        for (long c = 0; c < {cols}; c++) {y} *= inv;",
                "    }",
            ]
            cur = out
        else:
            return f"no C form for a {kind} stage"
    flush()  # every step that writes a buffer makes it the current value: the last is the result
    if not buffers:
        return "nothing to compute"
    source = "\n".join(
        [
            "#include <math.h>",
            "typedef void (*sgemm_t)(int, int, int, int, int, int, float, const float *, int,",
            "                        const float *, int, float, float *, int);",
            "typedef void (*sgemv_t)(int, int, int, int, float, const float *, int,",
            "                        const float *, int, float, float *, int);",
            "void mb_unfused(void *sgemm_fn, void *sgemv_fn, const float *const *in,",
            "                float *const *buf) {",
            "    sgemm_t sgemm = (sgemm_t)sgemm_fn;",
            "    sgemv_t sgemv = (sgemv_t)sgemv_fn;",
            "    (void)sgemm;",
            "    (void)sgemv;",
            *body,
            "}",
            "",
        ]
    )
    return source, inputs, buffers


def unfused_c(
    head: NDArray[np.float32], stages: Sequence[tuple[str, Any]], blas: PeerLib
) -> UnfusedC | str:
    """Build the pipeline against `blas`'s sgemm (loaded here; thread variables are the
    caller's), or say why not."""
    if not blas.available:
        return blas.reason
    got = unfused_c_source(head, stages)
    if isinstance(got, str):
        return got
    source, inputs, shapes = got
    buffers = [np.zeros(s, dtype=np.float32) for s in shapes]
    dll = ctypes.CDLL(blas.library)
    sgemm_name, sgemv_name = blas.symbol("sgemm"), blas.symbol("sgemv")
    if sgemm_name is None or sgemv_name is None:
        return f"{blas.library} exports no cblas_sgemm or cblas_sgemv"
    sgemm, sgemv = (ctypes.cast(getattr(dll, n), ctypes.c_void_p) for n in (sgemm_name, sgemv_name))
    with tempfile.TemporaryDirectory(prefix="morello-unfused-c-") as tmp:
        cc, src = find_compiler(), Path(tmp) / "unfused.c"
        src.write_text(source)
        obj = compile_object(cc, src, flags=C_FLAGS)
        # Linked without -ffast-math: with it gcc adds crtfastmath.o, which sets flush-to-zero
        # for the whole process when the library loads (the kernels' subnormals would read
        # 0). -lm after the object: libmvec (glibc's vector erff, expf, tanhf) as needed.
        so = link(cc, [obj], Path(tmp) / "libunfused.so", shared=True, libs=["-lm"])
        lib = ctypes.CDLL(str(so))  # never dlclose'd, like the kernels' libraries
    fn = lib.mb_unfused
    fn.restype, fn.argtypes = None, [ctypes.c_void_p] * 4
    in_ptrs = (ctypes.c_void_p * len(inputs))(*(a.ctypes.data for a in inputs))
    buf_ptrs = (ctypes.c_void_p * len(buffers))(*(b.ctypes.data for b in buffers))
    keep = (inputs, buffers, in_ptrs, buf_ptrs, lib)
    return UnfusedC(fn, (sgemm, sgemv, in_ptrs, buf_ptrs), buffers[-1], keep)
