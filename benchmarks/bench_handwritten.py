"""Benchmark a hand-written loop-nest matmul against the peers (harness smoke run).

    python benchmarks/bench_handwritten.py [M K N] [--bf16] [--threads T] [--cc clang] [--json]

It exercises verify + bench end to end without the synthesizer: the kernel is the
textbook i-k-j loop nest, so expect it to lose to every BLAS.
"""

from __future__ import annotations

import argparse
import json

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.harness.bench import bench_kernel
from morello_build.harness.verify import verify_kernel


def handwritten_matmul(m: int, k: int, n: int, in_dtype: str = "f32") -> GeneratedKernel:
    """Row-major [1,m,k] @ [1,k,n] -> f32 [1,m,n], overwriting the output."""
    name = f"hand_matmul_{in_dtype}_{m}x{k}x{n}"
    ops = (
        OperandABI("lhs", (1, m, k), in_dtype, (0, 1, 2), "in"),
        OperandABI("rhs", (1, k, n), in_dtype, (0, 1, 2), "in"),
        OperandABI("out", (1, m, n), "f32", (0, 1, 2), "out"),
    )
    abi = KernelABI(name, "matmul", ops, False, "x86-64", 2 * m * k * n)
    load = "bf16_to_f32" if in_dtype == "bf16" else ""
    helper = (
        "static inline float bf16_to_f32(uint16_t x) {\n"
        "    union { uint32_t u; float f; } v;\n    v.u = (uint32_t)x << 16;\n    return v.f;\n}\n"
        if in_dtype == "bf16"
        else ""
    )
    src = f"""#include "{name}.h"
{helper}
{abi.prototype()} {{
    for (int i = 0; i < {m}; i++) {{
        for (int j = 0; j < {n}; j++) out[i * {n} + j] = 0.0f;
        for (int p = 0; p < {k}; p++) {{
            const float a = {load}(lhs[i * {k} + p]);
            for (int j = 0; j < {n}; j++) out[i * {n} + j] += a * {load}(rhs[p * {n} + j]);
        }}
    }}
}}
"""
    guard = name.upper() + "_H"
    header = f"#ifndef {guard}\n#define {guard}\n#include <stdint.h>\n{abi.prototype()};\n#endif\n"
    spec = f"Matmul(1x{m}x{k}x{n}, {in_dtype} x {in_dtype} -> f32, row-major, hand-written)"
    return GeneratedKernel(abi, src, header, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dims", nargs="*", type=int, default=[256, 256, 256])
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cc", default=None)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    m, k, n = (args.dims * 3)[:3] if len(args.dims) == 1 else args.dims
    kernel = handwritten_matmul(m, k, n, "bf16" if args.bf16 else "f32")
    check = verify_kernel(kernel, compiler=args.cc)
    print(f"verify: ok={check.ok} max_rel_err={check.max_rel_err:.3g} tol={check.tolerance:.3g}")
    report = bench_kernel(kernel, threads=args.threads, min_time=args.min_time, compiler=args.cc)
    print(json.dumps(report.to_json(), indent=1) if args.json else report.format_table())


if __name__ == "__main__":
    main()
