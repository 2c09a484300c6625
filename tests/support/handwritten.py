"""Hand-written C kernels (right ones and deliberately wrong ones) for the harness tests:
they check `verify_kernel` and the benchmark without depending on the synthesizer."""

from __future__ import annotations

import math

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI

_DECODE = """
static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}
"""
_DECODE_SWAPPED = """
static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x;  /* BUG: value placed in the low half */
    return v.f;
}
"""


def _strides(shape: tuple[int, ...], order: tuple[int, ...]) -> list[int]:
    """Element stride of each logical dim when stored with dims in `order`."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return strides


def _index(names: list[str], strides: list[int]) -> str:
    return " + ".join(f"{n} * {s}" for n, s in zip(names, strides, strict=True))


def header(abi: KernelABI) -> str:
    guard = abi.name.upper() + "_H"
    return f"#ifndef {guard}\n#define {guard}\n#include <stdint.h>\n{abi.prototype()};\n#endif\n"


def matmul_kernel(
    name: str,
    b: int,
    m: int,
    k: int,
    n: int,
    *,
    lhs_order: tuple[int, ...] = (0, 1, 2),
    rhs_order: tuple[int, ...] = (0, 1, 2),
    out_order: tuple[int, ...] = (0, 1, 2),
    in_dtype: str = "f32",
    out_dtype: str = "f32",
    accumulate: bool = False,
    bug: str = "",
) -> GeneratedKernel:
    """A plain loop-nest matmul with an optional deliberate bug."""
    rhs_dtype = "s8" if in_dtype == "u8" else in_dtype  # u8 x s8 -> s32, as in VNNI
    lhs = OperandABI("lhs", (b, m, k), in_dtype, lhs_order, "in")
    rhs = OperandABI("rhs", (b, k, n), rhs_dtype, rhs_order, "in")
    out = OperandABI("out", (b, m, n), out_dtype, out_order, "inout" if accumulate else "out")
    abi = KernelABI(name, "matmul", (lhs, rhs, out), accumulate, "x86-64", 2 * b * m * k * n)
    li = _index(["bb", "i", "kk"], _strides(lhs.shape, lhs.order))
    ri = _index(["bb", "kk", "j"], _strides(rhs.shape, rhs.order))
    oi = _index(["bb", "i", "j"], _strides(out.shape, out.order))
    load = "bf16_to_f32" if in_dtype == "bf16" else ""
    decode = ""
    if in_dtype == "bf16":
        decode = _DECODE_SWAPPED if bug == "swap_bf16" else _DECODE
    kmax = k - 1 if bug == "k_off_by_one" else k
    acc_t = out.c_type
    init = f"out[{oi}]" if accumulate and bug != "overwrite" else "0"
    skip = (
        f"if (bb == {b - 1} && i == {m - 1} && j == {n - 1}) continue;"
        if bug == "skip_last"
        else ""
    )
    src = f"""#include "{name}.h"
{decode}
{abi.prototype()} {{
    for (int bb = 0; bb < {b}; bb++)
        for (int i = 0; i < {m}; i++)
            for (int j = 0; j < {n}; j++) {{
                {skip}
                {acc_t} acc = {init};
                for (int kk = 0; kk < {kmax}; kk++)
                    acc += ({acc_t}){load}(lhs[{li}]) * ({acc_t}){load}(rhs[{ri}]);
                out[{oi}] = acc;
            }}
}}
"""
    return GeneratedKernel(abi, src, header(abi), f"Matmul {b}x{m}x{k}x{n}")


def zero_kernel(
    name: str = "zero_k", shape: tuple[int, ...] = (5, 7), bug: str = ""
) -> GeneratedKernel:
    out = OperandABI("out", shape, "f32", tuple(range(len(shape))), "out")
    abi = KernelABI(name, "zero", (out,), False, "x86-64", 0)
    count = math.prod(shape) - (1 if bug == "skip_last" else 0)
    src = f"""#include "{name}.h"
{abi.prototype()} {{
    for (int i = 0; i < {count}; i++) out[i] = 0.0f;
}}
"""
    return GeneratedKernel(abi, src, header(abi), "Zero")


def move_kernel(name: str = "move_k", bug: str = "") -> GeneratedKernel:
    """bf16 column-major [6, 10] -> f32 row-major."""
    rows, cols = 6, 10
    src_op = OperandABI("src", (rows, cols), "bf16", (1, 0), "in")
    dst_op = OperandABI("dst", (rows, cols), "f32", (0, 1), "out")
    abi = KernelABI(name, "move", (src_op, dst_op), False, "x86-64", 0)
    decode = _DECODE_SWAPPED if bug == "swap_bf16" else _DECODE
    src = f"""#include "{name}.h"
{decode}
{abi.prototype()} {{
    for (int i = 0; i < {rows}; i++)
        for (int j = 0; j < {cols}; j++)
            dst[i * {cols} + j] = bf16_to_f32(src[j * {rows} + i]);
}}
"""
    return GeneratedKernel(abi, src, header(abi), "Move")


# ----------------------------------------------------------------------------- helpers
