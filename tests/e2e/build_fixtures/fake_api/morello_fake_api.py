"""A stand-in for morello_build.api used by the build-integration tests.

It emits a naive C matmul with the exact kernel ABI and keeps a tiny on-disk "cache" under
MORELLO_CACHE_DIR, so the build plumbing (incremental rebuilds, cache-hit reporting, the Python
module, dispatch) can be tested quickly and independently of the real synthesizer.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.errors import MorelloError

_SPEC = re.compile(
    r"Matmul(Accum)?\((\d+)x(\d+)x(\d+)x(\d+), (\w+):GL:(row|col), (\w+):GL:(row|col), "
    r"f32:GL:(row|col)(, serial)?\)"
)


@dataclass(frozen=True)
class SynthResult:
    kernel: GeneratedKernel
    cache_hit: bool
    solved: int
    seconds: float


def matmul_spec_text(
    b, m, k, n, *, dtype="f32", layouts=("row", "row", "row"), accumulate=False, threads=1
):
    acc = "Accum" if accumulate else ""
    serial = ", serial" if threads <= 1 else ""
    return (
        f"Matmul{acc}({b}x{m}x{k}x{n}, {dtype}:GL:{layouts[0]}, {dtype}:GL:{layouts[1]}, "
        f"f32:GL:{layouts[2]}{serial})"
    )


def _cache_hit(key: str) -> bool:
    if os.environ.get("MORELLO_NO_CACHE") == "1":
        return False
    root = os.environ.get("MORELLO_CACHE_DIR")
    if not root:
        return False
    p = Path(root) / "fake" / key
    if p.exists():
        return True
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("x")
    return False


def synthesize_kernel(
    spec_text, *, name, target, schedule=None, use_cache=True, threads=1, tune="generic"
):
    if target not in ("amx", "avx512", "avx2", "x86-64"):
        raise MorelloError(f"unknown target {target!r}")
    mt = _SPEC.fullmatch(spec_text)
    if not mt:
        raise MorelloError(f"cannot parse spec {spec_text!r}")
    acc = bool(mt.group(1))
    b, m, k, n = (int(mt.group(i)) for i in range(2, 6))
    dt = mt.group(6)
    la, lb, lc = mt.group(7), mt.group(9), mt.group(10)
    t0 = time.perf_counter()
    key = hashlib.sha256(f"{spec_text}|{target}|{tune}|{schedule}".encode()).hexdigest()
    hit = use_cache and _cache_hit(key)

    def op(nm, r, c, dtype, lay, role):
        shape = (b, r, c) if b > 1 else (r, c)
        order = tuple(range(len(shape)))
        if lay == "col":
            order = (*order[:-2], order[-1], order[-2])
        return OperandABI(nm, shape, dtype, order, role)

    ops = (
        op("a", m, k, dt, la, "in"),
        op("b", k, n, dt, lb, "in"),
        op("c", m, n, "f32", lc, "inout" if acc else "out"),
    )
    abi = KernelABI(
        name=name, op="matmul", operands=ops, accumulate=acc, isa=target, flops=2 * b * m * k * n
    )
    load = "bf16_to_f32" if dt == "bf16" else ""
    ia = f"p * {m * k} + i * {k} + kk" if la == "row" else f"p * {m * k} + kk * {m} + i"
    ib = f"p * {k * n} + kk * {n} + j" if lb == "row" else f"p * {k * n} + j * {k} + kk"
    ic = f"p * {m * n} + i * {n} + j" if lc == "row" else f"p * {m * n} + j * {m} + i"
    init = f"c[{ic}]" if acc else "0.0f"
    src = f"""/* fake morello kernel {name}: {spec_text} for {target} */
#include <stdint.h>
#include <string.h>
#include "{name}.h"

static inline float bf16_to_f32(uint16_t v)
{{
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}}

{abi.prototype()}
{{
    int p, i, j, kk;
    (void)bf16_to_f32;
    for (p = 0; p < {b}; p++)
        for (i = 0; i < {m}; i++)
            for (j = 0; j < {n}; j++) {{
                float s = {init};
                for (kk = 0; kk < {k}; kk++)
                    s += {load}(a[{ia}]) * {load}(b[{ib}]);
                c[{ic}] = s;
            }}
}}
"""
    guard = f"FAKE_{name.upper()}_H"
    hdr = f"#ifndef {guard}\n#define {guard}\n#include <stdint.h>\n{abi.prototype()};\n#endif\n"
    return SynthResult(
        GeneratedKernel(abi, src, hdr, spec_text), hit, 0 if hit else 42, time.perf_counter() - t0
    )
