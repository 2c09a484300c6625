"""Check a generated C kernel against a numpy reference.

The kernel is compiled exactly as a user would build it (warnings are errors), loaded with
ctypes and run on seeded random data; the result is compared with a float64 numpy
reference. Only the kernel's C source and its `KernelABI` are used, never the Impl tree.

Inputs and runs. Each kernel runs twice (a fork each), once per output sentinel, and the
two runs use different inputs:

* run 0, *exact inputs* (float matmul only): nonzero dyadic values ``+-i * 2^-7`` (lhs),
  ``+-j * 2^-3`` (rhs) and ``+-c * 2^-10`` (an accumulated output), with the integers
  ``i, j, c >= 1`` capped so that ``K * max|a| * max|b| + max|c0| <= 2^24`` product units
  (and ``i, j <= 256`` for bf16, whose 8-bit significand holds those integers exactly).
  Then every product and every partial sum of any subset of terms, in any order, with or
  without FMA or pairwise dot instructions, is an exact f32, so a correct kernel returns the
  exact result bit for bit and is compared with zero tolerance. Every term is nonzero, so
  dropping one product from any output element (a k term, a row, a column, a remainder
  strip) changes it by at least one unit and fails, at every K up to 2^24. `reference_
  output` proves exactness from the values themselves (`_exact_unit`) instead of trusting
  the generator; past 2^24 terms it falls back to the run-1 bound.
* run 1, *random inputs*: floats uniform in [-1, 1] from ``numpy.random.default_rng(seed)``
  (bf16: those f32 draws rounded to nearest even), which exercises rounding, exponents and
  cancellation that small dyadic values do not. Integer operands cover the whole range of
  8-bit types and [-128, 128) / [0, 256) for wider ones, so that products summed over K
  cannot overflow a 32-bit accumulator for K < 2^16; integer, move and zero kernels use
  random inputs in both runs.

Operands of role "inout" start with those inputs; "out" operands are filled with a sentinel
(NaN in run 0, a huge finite value in run 1; 0xA5.. then 0x5A.. bytes for integers), so an
element the kernel never writes is always caught. Each buffer is 64-byte aligned and
surrounded by guard bytes that must survive the call; inputs must be left unchanged.

Tolerance. Integers must match exactly (with two's-complement wrap to the output type).
Moves and zeros must be exact (narrowing f32 -> bf16 must round to nearest even). A float
matmul output element is a sum of n = K (+1 when accumulating) terms with
``scale = (|A| @ |B|) + |C0|`` (float64). On exact inputs the bound is 0. On random inputs
it is ``err <= coeff * scale + n * FLT_MIN`` (the absolute term for flush-to-zero
instructions such as vdpbf16ps) with ``coeff = min(2 * gamma_n, 10 * sqrt(n) * u)``,
``u = 2^-24``, ``gamma_n = n*u / (1 - n*u)``: the worst-case bound (Higham, "Accuracy and
Stability of Numerical Algorithms", sec. 3.1) for short sums, and past n = 25 the
probabilistic one (Higham & Mary, SISC 2019: ``lambda * sqrt(n) * u`` fails with
probability below ``2n * exp(-lambda^2 / 2)``, ~1e-17 per element for lambda = 10). With
signs drawn at random the partial sums grow like sqrt(n), so even perfectly correlated
rounding errors stay near ``sqrt(n) * u * scale``; correct kernels measure 4e-8 to 1.4e-7
at K = 16384, where the bound is 7.6e-5 and the old ``2 * gamma_n`` was 2e-3 (too loose to
see one dropped term, which the exact run now catches). When the output is bf16,
``2^-8 * |exact|`` is added (its own rounding; such a kernel's exact run is then not
sharp, and no generated kernel has a bf16 output). `reference_output` keeps the worst-case
bound unless asked (``statistical=True``) because the benchmark reuses it to check other
libraries. `max_rel_err` is ``max(err / scale)`` over both runs, the quantity compared with
`tolerance` (the random run's ``coeff``); it stays meaningful where cancellation makes the
result itself tiny.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import math
import mmap
import os
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import GeneratedKernel, KernelABI, OperandABI
from morello_build.errors import MorelloError
from morello_build.harness.compile import (
    CompileError,
    Compiler,
    build_shared_library,
    find_compiler,
)
from morello_build.machine.isa import ISA_FLAGS, host_supports

__all__ = [
    "CompileError",
    "IsaUnavailable",
    "TooBigToVerify",
    "VerifyResult",
    "bf16_bits_to_f32",
    "exact_logical",
    "f32_to_bf16_bits",
    "from_physical",
    "kernel_compile_flags",
    "reference_output",
    "to_physical",
    "verify_kernel",
]

#: numpy storage type of each ABI dtype (bf16 travels as its uint16 bit pattern).
STORAGE: dict[str, type[np.generic]] = {
    "f32": np.float32,
    "bf16": np.uint16,
    "u8": np.uint8,
    "s8": np.int8,
    "u16": np.uint16,
    "s16": np.int16,
    "u32": np.uint32,
    "s32": np.int32,
}
FLOAT_DTYPES = frozenset({"f32", "bf16"})

_U32 = 2.0**-24  # unit roundoff of f32
_FLT_MIN = float(np.finfo(np.float32).tiny)
_BF16_REL = 2.0**-8  # bf16 output rounding, allowing round-toward-zero too
_LAMBDA = 10.0  # probabilistic bound: lambda * sqrt(n) * u (see the module docstring)
_F32_DIGITS = 24  # significand bits of f32: integers up to 2^24 are exact
#: Largest integer magnitude the exact run draws per input dtype, and the power-of-two
#: scale of lhs / rhs values (non-integers, so a kernel that truncates is caught too).
_EXACT_INT_MAX = {"f32": 2**12, "bf16": 2**8}
_EXACT_LHS_EXP, _EXACT_RHS_EXP = -7, -3
_GUARD = 64  # bytes of guard on each side of a buffer (keeps 64-byte alignment)
_GUARD_BYTE = 0xCD

#: Flags every verified kernel must compile with (on top of the ISA flags).
BASE_FLAGS: tuple[str, ...] = ("-O2", "-std=gnu99", "-Wall", "-Wextra", "-Werror")


class IsaUnavailable(MorelloError):
    """The host cannot execute code for this ISA, so the kernel cannot be run here."""

    def __init__(self, isa: str) -> None:
        super().__init__(f"this host cannot run {isa} code; kernel compiled but not executed")
        self.isa = isa


#: Memory verification takes per element of an input / output operand, beyond the
#: operands' own bytes: storage copies, float64 decodes and |A|, |B|, the reference and
#: its error scale, the comparison's temporaries. Measured with tracemalloc (numpy's
#: allocations; the operands' mmap buffers come on top): f32 1x1024x1024 (B dominates)
#: 76.5 bytes per input element, bf16 accumulating 1x2048x1024 72; 2048x16x2048 (the
#: output dominates) 78 per output element, 108 accumulating; 1024^3 f32 43 per element
#: of all three operands.
_VERIFY_BYTES_PER_INPUT = 80
_VERIFY_BYTES_PER_OUTPUT = 112


class TooBigToVerify(MorelloError):
    """Checking this kernel against numpy would need more memory than the budget."""

    def __init__(self, name: str, need: int, budget: int) -> None:
        #: Why, without the kernel's name.
        self.reason = (
            f"checking it against numpy needs about {_gib(need)} of memory, more than "
            f"{_gib(budget)}, half of this machine's memory"
        )
        super().__init__(f"{name}: not verified: {self.reason}")
        self.need = need
        self.budget = budget


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n < 2**50 else f"{n / 2**50:.3g} PiB"


def verification_memory(abi: KernelABI) -> int:
    """Bytes `verify_kernel` needs for `abi`'s operands (an upper bound, see above)."""
    total = 0
    for op in abi.operands:
        elems = 1
        for d in op.shape:
            elems *= d
        per = _VERIFY_BYTES_PER_INPUT if op.is_input else _VERIFY_BYTES_PER_OUTPUT
        total += elems * (per + np.dtype(STORAGE.get(op.dtype, np.float64)).itemsize)
    return total


def memory_budget() -> int:
    """Memory verification may use: half of the physical memory (or of the cgroup's limit
    when that is lower), so that a build next to other work does not swap or get killed."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        phys = 2**34
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            phys = min(phys, int(limit))
    except OSError:
        pass
    return phys // 2


def check_memory(abi: KernelABI) -> None:
    """Raise `TooBigToVerify` when verifying `abi` would not fit in `memory_budget`."""
    need, budget = verification_memory(abi), memory_budget()
    if need > budget:
        raise TooBigToVerify(abi.name, need, budget)


def check_spec_memory(spec_text: str, name: str = "kernel") -> None:
    """`check_memory` for the kernel of `spec_text`, before synthesizing it (its ABI
    follows from the Spec). A Spec without a kernel ABI is left for verification to
    report."""
    from morello_build.codegen.emit import CodegenError, kernel_abi
    from morello_build.ir.text import parse_spec

    try:
        abi = kernel_abi(parse_spec(spec_text), name, "x86-64")
    except CodegenError:
        return
    check_memory(abi)


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of one verification; `details` says why it failed (or what was checked)."""

    ok: bool
    max_abs_err: float
    max_rel_err: float  # err / scale, see module docstring; compared with `tolerance`
    tolerance: float  # 0.0 means exact
    compiler: str
    details: str


# --------------------------------------------------------------------------- bf16 / layouts


def f32_to_bf16_bits(x: NDArray[Any]) -> NDArray[np.uint16]:
    """Round f32 values to bf16 (nearest, ties to even) and return the bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> np.uint64(16)) & np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + lsb) >> np.uint64(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    quiet = (bits >> np.uint64(16)) | np.uint64(0x0040)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def bf16_bits_to_f32(bits: NDArray[Any]) -> NDArray[np.float32]:
    """Decode bf16 bit patterns (uint16) into f32 values (exact)."""
    wide = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return wide.view(np.float32)


def to_physical(logical: NDArray[Any], order: Sequence[int]) -> NDArray[Any]:
    """The dense buffer holding `logical` with dims stored slowest->fastest as `order`."""
    return np.ascontiguousarray(np.transpose(logical, tuple(order)))


def from_physical(physical: NDArray[Any], order: Sequence[int]) -> NDArray[Any]:
    """Inverse of `to_physical`: a logical view of a physical buffer."""
    return np.transpose(physical, tuple(int(i) for i in np.argsort(order)))


def _check_operand(op: OperandABI) -> None:
    if op.dtype not in STORAGE:
        raise ValueError(f"operand {op.name}: unsupported dtype {op.dtype!r}")
    if sorted(op.order) != list(range(len(op.shape))):
        raise ValueError(f"operand {op.name}: order {op.order} is not a permutation of its dims")
    if op.role not in ("in", "out", "inout"):
        raise ValueError(f"operand {op.name}: unknown role {op.role!r}")


# --------------------------------------------------------------------------- inputs


def random_logical(op: OperandABI, rng: np.random.Generator) -> NDArray[Any]:
    """Seeded random contents for one operand, in its storage dtype (see module doc)."""
    shape = op.shape
    if op.dtype == "f32":
        return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
    if op.dtype == "bf16":
        return f32_to_bf16_bits(rng.uniform(-1.0, 1.0, size=shape).astype(np.float32))
    st = STORAGE[op.dtype]
    info = np.iinfo(np.dtype(st))
    lo, hi = int(info.min), int(info.max) + 1
    if info.bits > 8:
        lo, hi = (-128, 128) if lo < 0 else (0, 256)
    return rng.integers(lo, hi, size=shape, dtype=np.int64).astype(st)


def _nonzero_ints(rng: np.random.Generator, shape: tuple[int, ...], top: int) -> NDArray[Any]:
    """Integers in [-top, -1] U [1, top], as float64."""
    mag = rng.integers(1, top + 1, size=shape, dtype=np.int64)
    sign = rng.integers(0, 2, size=shape, dtype=np.int64) * 2 - 1
    return (mag * sign).astype(np.float64)


def exact_logical(abi: KernelABI, rng: np.random.Generator) -> dict[str, NDArray[Any]]:
    """Exact-run inputs of a float matmul (see the module docstring), in storage dtypes.

    The output operand is included (with its C0) only when the kernel accumulates.
    """
    lhs, rhs, out = _matmul_operands(abi)
    k = lhs.shape[-1]
    terms = k + (1 if abi.accumulate else 0)
    per_term = max(1, 2**_F32_DIGITS // terms)  # product units each term may use
    top_a = min(_EXACT_INT_MAX[lhs.dtype], max(1, math.isqrt(per_term)))
    top_b = min(_EXACT_INT_MAX[rhs.dtype], max(1, per_term // top_a))
    unit = 2.0 ** (_EXACT_LHS_EXP + _EXACT_RHS_EXP)
    values = {
        lhs.name: _nonzero_ints(rng, lhs.shape, top_a) * 2.0**_EXACT_LHS_EXP,
        rhs.name: _nonzero_ints(rng, rhs.shape, top_b) * 2.0**_EXACT_RHS_EXP,
    }
    if abi.accumulate:
        values[out.name] = _nonzero_ints(rng, out.shape, per_term) * unit
    return {
        name: encode(op.dtype, values[name]) for op in abi.operands if (name := op.name) in values
    }


def decode(op_dtype: str, values: NDArray[Any]) -> NDArray[Any]:
    """Storage values as float64 (float dtypes) or int64 (integer dtypes)."""
    if op_dtype == "bf16":
        return bf16_bits_to_f32(values).astype(np.float64)
    if op_dtype == "f32":
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values).astype(np.int64)


def encode(op_dtype: str, values: NDArray[Any]) -> NDArray[Any]:
    """float64/int64 values to the storage dtype (bf16 rounds to nearest even, ints wrap)."""
    if op_dtype == "bf16":
        return f32_to_bf16_bits(values.astype(np.float32))
    if op_dtype == "f32":
        return values.astype(np.float32)
    return values.astype(np.int64).astype(STORAGE[op_dtype])


def sentinel_fill(op: OperandABI, which: int) -> NDArray[Any]:
    """Garbage that a correct kernel overwrites: NaN-like (which=0) or huge (which=1)."""
    st = STORAGE[op.dtype]
    if op.dtype == "f32":
        value: NDArray[Any] = np.full(op.shape, np.nan if which == 0 else 3.0e38, np.float32)
    elif op.dtype == "bf16":
        value = np.full(op.shape, 0x7FC1 if which == 0 else 0x7F00, np.uint16)
    else:
        byte = 0xA5 if which == 0 else 0x5A
        size = np.dtype(st).itemsize
        value = np.full(op.shape, int.from_bytes(bytes([byte]) * size, "little"), np.uint64)
        value = value.astype(np.dtype(f"u{size}")).view(st)
    return value


# --------------------------------------------------------------------------- reference


@dataclass(frozen=True)
class Expected:
    """Reference output with the per-element error budget (`scale`) for float outputs."""

    values: NDArray[Any]  # float64 or int64, logical shape
    scale: NDArray[np.float64] | None  # None: must match exactly
    coeff: float  # err <= coeff * scale + floor (+ bf16 rounding)
    floor: float


def _matmul_operands(abi: KernelABI) -> tuple[OperandABI, OperandABI, OperandABI]:
    if len(abi.operands) != 3:
        raise ValueError(f"matmul kernel {abi.name} must have 3 operands (lhs, rhs, out)")
    lhs, rhs, out = abi.operands
    if not (lhs.is_input and rhs.is_input) or out.is_input:
        raise ValueError(f"matmul kernel {abi.name}: expected roles in, in, out/inout")
    if (
        len(lhs.shape) != len(rhs.shape)
        or len(lhs.shape) != len(out.shape)
        or lhs.shape[:-2] != rhs.shape[:-2]
        or lhs.shape[:-2] != out.shape[:-2]
        or lhs.shape[-1] != rhs.shape[-2]
        or out.shape[-2:] != (lhs.shape[-2], rhs.shape[-1])
    ):
        raise ValueError(
            f"matmul kernel {abi.name}: shapes {lhs.shape} @ {rhs.shape} -> {out.shape} disagree"
        )
    return lhs, rhs, out


def _lowest_bit_exponent(x: NDArray[np.float64]) -> int | None:
    """Largest e with every value a multiple of 2^e (None: all zero; raises if non-finite)."""
    nz = x[x != 0]
    if nz.size == 0:
        return None
    if not np.isfinite(nz).all():
        raise ValueError("non-finite")
    mant, exp = np.frexp(nz)  # nz = mant * 2^exp, 0.5 <= |mant| < 1
    ints = np.abs(mant * 2.0**53).astype(np.int64)  # exact: float64 has 53 bits
    low = ints & -ints  # lowest set bit, a power of two
    return int(np.min(exp - 53 + np.frexp(low.astype(np.float64))[1] - 1))


def _exact_unit(a: NDArray[np.float64], b: NDArray[np.float64], c0: NDArray[Any] | None) -> bool:
    """True when every product and every partial sum of any subset of the terms of every
    output element is an exact f32: all terms are multiples of one power of two 2^e, no
    input, term or nonzero partial sum is below FLT_MIN (so flush-to-zero and
    denormals-are-zero change nothing) and ``K max|a| max|b| + max|c0| <= 2^(e + 24)``.
    Then any summation order, FMA or not, gives the exact result."""
    try:
        ea, eb = _lowest_bit_exponent(a), _lowest_bit_exponent(b)
        ec = _lowest_bit_exponent(c0) if c0 is not None else None
    except ValueError:
        return False
    units = [e for e in ((None if ea is None or eb is None else ea + eb), ec) if e is not None]
    if not units:
        return True  # all terms are zero
    e = min(units)
    if min(x for x in (ea, eb, e) if x is not None) < -126:
        return False
    k = a.shape[-1]
    big = k * float(np.max(np.abs(a), initial=0.0)) * float(np.max(np.abs(b), initial=0.0))
    if c0 is not None:
        big += float(np.max(np.abs(c0), initial=0.0))
    return big <= 2.0 ** (e + _F32_DIGITS)


def float_matmul_coeff(n: int, *, statistical: bool) -> float:
    """`Expected.coeff` for random inputs: worst case ``2 gamma_n``, or the smaller
    ``lambda sqrt(n) u`` past n = 25 when `statistical` (see the module docstring)."""
    nu = n * _U32
    gamma2 = 2.0 * nu / (1.0 - nu) if nu < 1.0 else math.inf  # no worst-case bound past 2^24
    return min(gamma2, _LAMBDA * math.sqrt(n) * _U32) if statistical else gamma2


def reference_output(
    abi: KernelABI, logical: Mapping[str, NDArray[Any]], *, statistical: bool = False
) -> Expected:
    """The exact result of `abi.op` on logical storage arrays keyed by operand name.

    For an "inout" output, `logical[out.name]` holds its initial contents. A float matmul
    whose inputs make every partial sum exact (`_exact_unit`) must match exactly; others
    get the worst-case bound, or the probabilistic one with `statistical`.
    """
    if abi.op == "matmul":
        lhs, rhs, out = _matmul_operands(abi)
        a = decode(lhs.dtype, logical[lhs.name])
        b = decode(rhs.dtype, logical[rhs.name])
        c0 = decode(out.dtype, logical[out.name]) if abi.accumulate else None
        if out.dtype not in FLOAT_DTYPES:
            prod = np.matmul(a.astype(np.int64), b.astype(np.int64))
            if c0 is not None:
                prod = prod + c0
            return Expected(decode(out.dtype, encode(out.dtype, prod)), None, 0.0, 0.0)
        a, b = a.astype(np.float64), b.astype(np.float64)
        exact = np.matmul(a, b)
        scale = np.matmul(np.abs(a), np.abs(b))
        if c0 is not None:
            exact = exact + c0
            scale = scale + np.abs(c0)
        if _exact_unit(a, b, c0):
            return Expected(exact, scale, 0.0, 0.0)
        n = lhs.shape[-1] + (1 if c0 is not None else 0)
        return Expected(exact, scale, float_matmul_coeff(n, statistical=statistical), n * _FLT_MIN)
    if abi.op == "zero":
        if len(abi.operands) != 1 or abi.operands[0].is_input:
            raise ValueError(f"zero kernel {abi.name} must have exactly one output operand")
        o = abi.operands[0]
        zeros = np.zeros(o.shape, np.int64 if o.dtype not in FLOAT_DTYPES else np.float64)
        return Expected(zeros, None, 0.0, 0.0)
    if abi.op == "move":
        if len(abi.operands) != 2 or not abi.operands[0].is_input or abi.operands[1].is_input:
            raise ValueError(f"move kernel {abi.name} must have operands (in, out)")
        src, dst = abi.operands
        if src.shape != dst.shape:
            raise ValueError(f"move kernel {abi.name}: shapes {src.shape} -> {dst.shape} differ")
        values = decode(src.dtype, logical[src.name])
        return Expected(decode(dst.dtype, encode(dst.dtype, values)), None, 0.0, 0.0)
    raise ValueError(f"kernel {abi.name}: unknown op {abi.op!r}")


# --------------------------------------------------------------------------- buffers


class _GuardedBuffer:
    """A 64-byte-aligned physical buffer with guard bytes on both sides."""

    def __init__(self, physical: NDArray[Any]) -> None:
        self.dtype = physical.dtype
        self.shape = physical.shape
        self.nbytes = physical.nbytes
        # Anonymous mmap is MAP_SHARED: a forked child's writes are visible here.
        self._mmap = mmap.mmap(-1, self.nbytes + 2 * _GUARD + 64)
        raw = np.frombuffer(self._mmap, dtype=np.uint8)
        raw[...] = _GUARD_BYTE
        start = (-raw.ctypes.data) % 64 + _GUARD
        self._raw = raw
        self._start = start
        self.array: NDArray[Any] = (
            raw[start : start + self.nbytes].view(self.dtype).reshape(self.shape)
        )
        self.array[...] = physical

    @property
    def pointer(self) -> int:
        return int(self.array.ctypes.data)

    def guards_intact(self) -> bool:
        before = self._raw[self._start - _GUARD : self._start]
        after = self._raw[self._start + self.nbytes : self._start + self.nbytes + _GUARD]
        return bool(np.all(before == _GUARD_BYTE) and np.all(after == _GUARD_BYTE))


# --------------------------------------------------------------------------- compile/load


def kernel_compile_flags(kernel: GeneratedKernel, opt: str = "-O2") -> list[str]:
    """Flags a generated kernel is compiled with: strict warnings, its ISA, OpenMP if used."""
    flags = [opt, *BASE_FLAGS[1:], *ISA_FLAGS[kernel.abi.isa]]
    if "#pragma omp" in kernel.c_source:
        flags.append("-fopenmp")
    return flags


def kernel_files(kernel: GeneratedKernel) -> dict[str, str]:
    """The kernel's `<name>.c` and `<name>.h`, as the .c expects to include its header."""
    name = kernel.abi.name
    return {f"{name}.h": kernel.header, f"{name}.c": kernel.c_source}


@contextlib.contextmanager
def _built(
    kernel: GeneratedKernel, compiler: Compiler, extra_flags: Sequence[str]
) -> Iterator[Path]:
    """Build the kernel as a shared library in a temp dir; yield its path."""
    with tempfile.TemporaryDirectory(prefix="morello-verify-") as tmp:
        flags = [*kernel_compile_flags(kernel), *extra_flags]
        yield build_shared_library(
            compiler, Path(tmp), kernel_files(kernel), kernel.abi.name, flags=flags
        )


def _call(lib_path: Path, name: str, pointers: Sequence[int]) -> None:
    """Load the library and call the kernel once (AttributeError if not exported).

    The library is never dlclose'd: an OpenMP kernel leaves worker threads parked inside
    libgomp, and unmapping it under them crashes the process.
    """
    lib = ctypes.CDLL(str(lib_path))
    fn = getattr(lib, name)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * len(pointers)
    fn(*pointers)


def _call_isolated(lib_path: Path, name: str, pointers: Sequence[int], timeout: float) -> str:
    """Call the kernel in a forked child; return "" or why it failed (crash, hang, symbol).

    A wrong kernel may crash or loop forever; that must fail verification, not kill the
    build. Buffers live in shared memory, so the parent sees what the child wrote.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with live BLAS threads
        pid = os.fork()
    if pid == 0:  # child: call and leave without running any Python cleanup
        code = 0
        faulthandler.disable()  # a crash is an expected outcome here, not worth a traceback
        try:
            _call(lib_path, name, pointers)
        except AttributeError:
            code = 3
        except BaseException:
            code = 4
        os._exit(code)
    deadline = time.monotonic() + timeout
    delay = 0.0005
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return f"kernel did not return within {timeout:g} s (killed)"
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    if os.WIFSIGNALED(status):
        return f"kernel crashed with {signal.Signals(os.WTERMSIG(status)).name}"
    code = os.WEXITSTATUS(status)
    if code == 3:
        return f"symbol {name} is not exported by the compiled kernel"
    if code != 0:
        return f"calling the kernel failed in the child process (exit {code})"
    return ""


# --------------------------------------------------------------------------- verify


def compare_output(
    expected: Expected, got: NDArray[Any], out_dtype: str
) -> tuple[bool, float, float, str]:
    """(ok, max_abs_err, max_rel_err, message) for one logical output (decoded)."""
    if expected.scale is None:
        if out_dtype in FLOAT_DTYPES:
            same = (got == expected.values) | (np.isnan(got) & np.isnan(expected.values))
            diff = np.abs(np.where(same, 0.0, got - expected.values))
        else:
            same = got == expected.values
            diff = np.abs(got - expected.values).astype(np.float64)
        bad = ~same
        max_abs = float(np.max(diff, initial=0.0)) if not np.isnan(diff).any() else float("inf")
        max_rel = float("inf") if bad.any() else 0.0
    else:
        err = np.abs(got - expected.values)
        bound = expected.coeff * expected.scale + expected.floor
        if out_dtype == "bf16":
            bound = bound + _BF16_REL * np.abs(expected.values)
        bad = ~(err <= bound)  # NaN counts as bad
        finite = np.isfinite(err)
        max_abs = float(np.max(err)) if finite.all() else float("inf")
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = err / np.maximum(expected.scale, _FLT_MIN)
        max_rel = float(np.max(rel)) if finite.all() else float("inf")
    if not bad.any():
        return True, max_abs, max_rel, ""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    n_bad = int(bad.sum())
    unwritten = int(np.sum(~np.isfinite(got)))
    msg = (
        f"{n_bad} of {bad.size} elements wrong; first at {idx}: "
        f"got {got[idx]!r}, expected {expected.values[idx]!r}"
    )
    if unwritten:
        msg += f"; {unwritten} elements non-finite (left unwritten?)"
    return False, max_abs, max_rel, msg


def verify_kernel(
    kernel: GeneratedKernel,
    *,
    compiler: str | None = None,
    seed: int = 0,
    extra_flags: Sequence[str] = (),
    isolate: bool = True,
    timeout: float = 300.0,
) -> VerifyResult:
    """Compile, run and check `kernel` against numpy; see the module docstring for the rules.

    Raises `CompileError` (with the compiler's stderr) when the C does not build,
    `IsaUnavailable` when it builds but this host cannot run its ISA, and `TooBigToVerify`
    (before allocating anything) when the check would not fit in memory. With `isolate` (the
    default) each call runs in a forked child, so a crashing or hanging kernel (killed
    after `timeout` seconds) yields a failed result instead of taking the caller down.
    """
    abi = kernel.abi
    for op in abi.operands:
        _check_operand(op)
    if abi.isa not in ISA_FLAGS:
        raise ValueError(f"kernel {abi.name}: unknown ISA {abi.isa!r}")
    check_memory(abi)
    cc = find_compiler(compiler)
    rng = np.random.default_rng(seed)
    random_inputs: dict[str, NDArray[Any]] = {}
    for op in abi.operands:
        if op.is_input or op.role == "inout" or (abi.op == "matmul" and abi.accumulate):
            random_inputs[op.name] = random_logical(op, rng)
    outputs = [op for op in abi.operands if not op.is_input]
    if len(outputs) != 1:
        raise ValueError(f"kernel {abi.name}: expected exactly one output operand")
    out = outputs[0]
    float_matmul = abi.op == "matmul" and out.dtype in FLOAT_DTYPES
    # Run 0 uses exactly representable inputs where they exist (float matmul), run 1 random.
    inputs = [exact_logical(abi, rng) if float_matmul else random_inputs, random_inputs]
    expecteds = [
        reference_output(
            abi,
            {**initial, out.name: initial.get(out.name, sentinel_fill(out, 0))},
            statistical=True,
        )
        for initial in inputs
    ]

    worst_abs, worst_rel = 0.0, 0.0
    tol = expecteds[1].coeff if expecteds[1].scale is not None else 0.0

    def failed(why: str) -> VerifyResult:
        return VerifyResult(False, float("inf"), float("inf"), tol, cc.name, why)

    with _built(kernel, cc, extra_flags) as lib_path:
        if not host_supports(abi.isa):
            raise IsaUnavailable(abi.isa)
        for run, (initial, expected) in enumerate(zip(inputs, expecteds, strict=True)):
            buffers: list[_GuardedBuffer] = []
            for op in abi.operands:
                start = initial.get(op.name)
                logical = start if start is not None else sentinel_fill(op, run)
                buffers.append(_GuardedBuffer(to_physical(logical, op.order)))
            pointers = [b.pointer for b in buffers]
            if isolate:
                why = _call_isolated(lib_path, abi.name, pointers, timeout)
                if why:
                    return failed(f"run {run}: {why}")
            else:
                try:
                    _call(lib_path, abi.name, pointers)
                except AttributeError:
                    return failed(f"symbol {abi.name} is not exported by the compiled kernel")
            for op, buf in zip(abi.operands, buffers, strict=True):
                if not buf.guards_intact():
                    return failed(
                        f"run {run}: kernel wrote outside operand {op.name} (guard bytes changed)"
                    )
                if op.is_input and not np.array_equal(
                    buf.array.view(np.uint8),
                    to_physical(initial[op.name], op.order).view(np.uint8),
                ):
                    return failed(f"run {run}: kernel modified input operand {op.name}")
            got = decode(
                out.dtype, from_physical(buffers[abi.operands.index(out)].array, out.order)
            )
            ok, max_abs, max_rel, msg = compare_output(expected, got, out.dtype)
            worst_abs, worst_rel = max(worst_abs, max_abs), max(worst_rel, max_rel)
            if not ok:
                what = "exact inputs" if float_matmul and run == 0 else "random inputs"
                sentinel = "" if out.name in initial else f", output prefilled with sentinel {run}"
                return VerifyResult(
                    False,
                    worst_abs,
                    worst_rel,
                    tol,
                    cc.name,
                    f"run {run} ({what}{sentinel}): {msg}",
                )
    if not float_matmul:
        rule = "exact"
    else:
        rules = ["exact" if e.coeff == 0.0 else f"err <= {e.coeff:.3g} * scale" for e in expecteds]
        rule = f"exact inputs: {rules[0]}; random inputs: {rules[1]}; scale = |A||B| + |C0|"
    return VerifyResult(
        True,
        worst_abs,
        worst_rel,
        tol,
        cc.name,
        f"{abi.op} {abi.name}: 2 runs with seed {seed} match numpy ({rule})",
    )
