"""The arrays of the harness: operand contents, bf16 bits, physical layouts, the numpy
reference and its error bound.

Verification and the benchmark's check of peer libraries both use them, so a peer is held
to exactly the rule a kernel is. The rules (exact and random inputs, sentinels, the
tolerance and why it is sharp) are in `morello_build.harness.verify`'s docstring.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.codegen.abi import KernelABI, OperandABI

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
_LAMBDA = 10.0  # probabilistic bound: lambda * sqrt(n) * u (see `harness.verify`'s docstring)
_F32_DIGITS = 24  # significand bits of f32: integers up to 2^24 are exact
#: Largest integer magnitude the exact run draws per input dtype, and the power-of-two
#: scale of lhs / rhs values (non-integers, so a kernel that truncates is caught too).
_EXACT_INT_MAX = {"f32": 2**12, "bf16": 2**8}
_EXACT_LHS_EXP, _EXACT_RHS_EXP = -7, -3


# --------------------------------------------------------------------------- bf16 / layouts


def f32_to_bf16_bits(x: NDArray[Any]) -> NDArray[np.uint16]:
    """Round f32 values to bf16 (nearest, ties to even) and return the bit patterns."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    # bits + 0x7FFF + (bit 16) in place on one uint32 array: only NaNs (replaced below) can
    # wrap, since the largest finite or infinite pattern plus 0x8000 stays below 2^32.
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits
    rounded >>= 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)  # quiet, sign kept
    return out


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


# --------------------------------------------------------------------------- inputs


def random_logical(op: OperandABI, rng: np.random.Generator) -> NDArray[Any]:
    """Seeded random contents for one operand, in its storage dtype (see `harness.verify`'s docstring)."""
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
    """Integers in [-top, -1] U [1, top], as float64 (one draw each: [-top, top) with the
    non-negative ones moved up by one)."""
    ints = rng.integers(-top, top, size=shape, dtype=np.int64)
    ints += ints >= 0
    return ints.astype(np.float64)


def exact_logical(abi: KernelABI, rng: np.random.Generator) -> dict[str, NDArray[Any]]:
    """Exact-run inputs of a float matmul (see `harness.verify`'s docstring), in storage dtypes.

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


#: `_lowest_bits` markers: a zero (no set bit) and a non-finite value.
_ZERO_MARK, _NONFINITE_MARK = 1 << 20, -(1 << 20)


def _lowest_bits(bits: NDArray[np.uint32]) -> NDArray[np.int32]:
    """Per f32 bit pattern, the exponent of the value's lowest set bit: a value with biased
    exponent E and significand S (the implicit bit included unless E = 0) is
    S * 2^(max(E, 1) - 150), so that bit is 2^(max(E, 1) - 150 + ctz(S)). Zeros and
    non-finite values get `_ZERO_MARK` and `_NONFINITE_MARK`."""
    mag = bits & np.uint32(0x7FFFFFFF)  # the sign does not matter
    biased = (mag >> 23).astype(np.int32)
    sig = mag & np.uint32(0x7FFFFF)
    sig |= np.minimum(biased, 1).astype(np.uint32) << 23
    low = sig & (~sig + np.uint32(1))  # the lowest set bit, below 2^24 (exact in f32)
    exp = (low.astype(np.float32).view(np.uint32) >> 23).astype(np.int32)
    exp += np.maximum(biased, 1) - (127 + 150)
    exp[mag == 0] = _ZERO_MARK
    exp[biased == 0xFF] = _NONFINITE_MARK
    return exp


@functools.cache
def _bf16_lowest_bits() -> NDArray[np.int32]:
    """`_lowest_bits` of all 65536 bf16 patterns: a bf16 operand is then one table lookup
    per element instead of a dozen passes over its widened bits."""
    every = np.arange(1 << 16, dtype=np.uint16)
    return _lowest_bits(bf16_bits_to_f32(every).view(np.uint32))


def _lowest_bit_exponent(op_dtype: str, storage: NDArray[Any]) -> int | None:
    """Largest e with every value of float storage (f32 values, bf16 bit patterns) a
    multiple of 2^e (None: all zero; raises ValueError if one is not finite)."""
    if op_dtype == "bf16":
        lows = _bf16_lowest_bits()[np.asarray(storage, dtype=np.uint16)]
    elif op_dtype == "f32":
        lows = _lowest_bits(np.ascontiguousarray(storage, dtype=np.float32).view(np.uint32))
    else:
        raise ValueError(f"not a float dtype: {op_dtype}")
    low = int(np.min(lows, initial=_ZERO_MARK))
    if low == _NONFINITE_MARK:
        raise ValueError("non-finite")
    return None if low == _ZERO_MARK else low


def _exact_unit(
    operands: tuple[OperandABI, OperandABI, OperandABI],
    logical: Mapping[str, NDArray[Any]],
    a: NDArray[np.float64],
    b: NDArray[np.float64],
    c0: NDArray[Any] | None,
) -> bool:
    """True when every product and every partial sum of any subset of the terms of every
    output element is an exact f32: all terms are multiples of one power of two 2^e, no
    input, term or nonzero partial sum is below FLT_MIN (so flush-to-zero and
    denormals-are-zero change nothing) and ``K max|a| max|b| + max|c0| <= 2^(e + 24)``.
    Then any summation order, FMA or not, gives the exact result. `a`, `b` and `c0` are
    the decoded values of the storage arrays in `logical` of the `(lhs, rhs, out)` operands."""
    lhs, rhs, out = operands
    try:
        ea = _lowest_bit_exponent(lhs.dtype, logical[lhs.name])
        eb = _lowest_bit_exponent(rhs.dtype, logical[rhs.name])
        ec = _lowest_bit_exponent(out.dtype, logical[out.name]) if c0 is not None else None
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
    ``lambda sqrt(n) u`` past n = 25 when `statistical` (see `harness.verify`'s docstring)."""
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
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        exact = np.matmul(a, b)
        scale = np.matmul(np.abs(a), np.abs(b))
        if c0 is not None:
            exact = exact + c0
            scale = scale + np.abs(c0)
        if _exact_unit((lhs, rhs, out), logical, a, b, c0):
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


# --------------------------------------------------------------------------- compare


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


def placed(values: NDArray[Any], offset: int) -> NDArray[Any]:
    """A C-contiguous copy of `values` whose data starts `offset` bytes past a 64-byte
    boundary (numpy's own arrays start wherever its allocator puts them: large ones 16
    bytes past a page). The copy owns a buffer a line longer, so the offset always fits."""
    raw = np.empty(values.nbytes + 128, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start : start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    return out
