"""The C interface of a generated kernel, as plain data.

Verification, benchmarking and the build integration all talk to generated kernels through
this description only, so they never need to look inside the Impl tree.

A kernel is one exported C function ``void name(T0 *restrict p0, ..., Tn *restrict pn)``
whose parameters follow the operand order of its Spec (for Matmul: lhs, rhs, out). Inputs
are ``const``. bf16 values travel as ``uint16_t`` (the upper half of an IEEE f32).
Shapes are compile-time constants; every operand is one dense buffer whose physical layout
is described by ``order`` (row-major = ``(0, 1, ..., r-1)``).
"""

from __future__ import annotations

from dataclasses import dataclass

from morello_build.ir.dtypes import Dtype

#: C element type used at the interface for each dtype name (bf16 travels as uint16_t).
C_TYPES: dict[str, str] = {d.value: d.c_type for d in Dtype}

#: Kernel names may not start with this: the generated headers' macros (include guards,
#: ``MORELLO_RESTRICT``) do, and a kernel function named like a macro would be rewritten by it.
RESERVED_PREFIX = "MORELLO_"


def header_guard(name: str) -> str:
    """Include guard of the header declaring kernel `name` (a C identifier).

    The name is kept as it is, between a fixed prefix and suffix, so different names
    (``mm`` and ``MM``, ``kernels`` and the combined ``morello_kernels.h``) never share a
    guard; the headers also say ``#pragma once``.
    """
    return f"MORELLO_KERNEL_{name}_H"


@dataclass(frozen=True)
class OperandABI:
    """One pointer parameter of a kernel."""

    name: str  # C parameter name
    shape: tuple[int, ...]  # logical shape
    dtype: str  # key of C_TYPES
    order: tuple[int, ...]  # physical dim order, slowest -> fastest; row-major = identity
    role: str  # "in" | "out" | "inout"

    @property
    def c_type(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def is_input(self) -> bool:
        return self.role == "in"

    def c_param(self) -> str:
        const = "const " if self.is_input else ""
        return f"{const}{self.c_type} *restrict {self.name}"


@dataclass(frozen=True)
class KernelABI:
    """Everything a caller needs to call (and check) a generated kernel."""

    name: str  # exported C function name
    op: str  # "matmul" | "zero" | "move"
    operands: tuple[OperandABI, ...]
    accumulate: bool  # matmul: out += lhs @ rhs instead of out = lhs @ rhs
    isa: str  # "x86-64" | "avx2" | "avx512": what the CPU must support
    flops: int  # 2*b*m*k*n for matmul, 0 otherwise
    workspace_bytes: int = 0  # heap scratch the kernel takes and keeps for the next call

    def prototype(self) -> str:
        params = ", ".join(o.c_param() for o in self.operands)
        return f"void {self.name}({params})"


@dataclass(frozen=True)
class GeneratedKernel:
    """C source for one kernel plus its header."""

    abi: KernelABI
    c_source: str  # includes its own header by name: '#include "<name>.h"'
    header: str
    spec_text: str  # the Spec it implements, in the text form of morello_build.ir
    tune: str = "generic"  # the tuning its code was generated for (`machine.target.TUNINGS`)
