"""numpy float64 references, sound error bounds and hard inputs for row operations.

A row kernel (softmax, an activation) is checked element by element against the float64
result with a bound derived from how the C computes it (kernels/rows.py): f32 arithmetic
with unit roundoff u = 2^-24 and the vector math functions' <= 2 ulp (kernels/vecmath.py,
docs/vecmath.md). For softmax, out_i = exp(x_i - m) * (1 / d):
- x_i - m: exact when x_i and m are within a factor of 2 (Sterbenz), else off by
  u |x_i - m|, which exp turns into a relative error of about u |x_i - m|;
- exp: 2 ulp (relative 2^-22); the denominator: n positive terms each so perturbed plus
  the summation, relative (n + 1) u + the terms' errors; the reciprocal and product: 2u.
So |out_i - ref_i| <= ref_i u (|x_i - m| + 8 + 2 (n + 2) + |x_max - m|) + floor, with a
floor for results in the subnormal range (where exp's error is absolute, 2^-148). The
chunked kernel (kernels/rows.py, RowSoftmaxChunked) takes exp(x_i - m_c) * (exp(m_c - m) / d)
with its chunk's max m_c: a second exp and product per element and per denominator term,
and the rounding of m_c - m (at most the row's spread, in the element and in the
denominator's terms): u (2 |x_max - m| + 14) more. Every row must also sum to 1 within n
times the largest per-element relative bound.

Inputs: run 0 holds the hard cases (values near +-1e4 that would overflow a naive exp,
rows of -inf with one finite value, a row of equal values, wide spreads that underflow;
for the other operations both tails, signed zeros, subnormal results and a NaN, which
must come out NaN); run 1 is uniform random in [-8, 8] (activations: [-10, 10], covering both tails).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.ir.spec import ADD_KINDS, MAX, SUM, USER_ROW_KINDS, broadcast_dims

U = 2.0**-24  # unit roundoff of f32
#: The vector math functions' accuracy, relative (2 ulp of a result in [2^e, 2^(e+1))
#: is at most 2^-22 of it).
MATH_REL = 2.0**-22
#: Absolute error of a result in the subnormal range (2 ulp of 2^-149).
SUBNORMAL_ABS = 2.0**-148

ROW_OPS = USER_ROW_KINDS

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def hard_rows(
    shape: tuple[int, ...], rng: np.random.Generator, op: str, dtype: str
) -> NDArray[np.float64]:
    """Run-0 inputs (module docstring), as float64 values exact in `dtype`."""
    x = rng.uniform(-8.0, 8.0, size=shape)
    if op != "softmax":
        # Activations: both tails (exp near overflow and underflow, tanh/erf saturated),
        # signed zeros, tiny values, and results in the subnormal range (silu(-95),
        # gelu_tanh(-10.5): e^-w underflows there while e^w would overflow).
        # A NaN must come out NaN (numpy's max and sum too: in the last row, so that the
        # other rows still check the finite values; a single row gets it here, in run 0,
        # and run 1's random row checks its finite values).
        reduce = op in (MAX, SUM)
        edge = np.array(
            [0.0, -0.0, 1e-30, -1e-30, 88.0, -87.0, 30.0, -30.0, 10.0, -10.0, -95.0, -10.5]
            + ([] if reduce else [np.nan])
        )
        flat = x.reshape(-1)
        flat[: min(flat.size, edge.size)] = edge[: flat.size]
        if reduce:
            x[-1, rng.integers(0, shape[-1])] = np.nan
        return exact_in(x, dtype)
    rows, n = shape
    for r in range(rows):
        kind = r % 4
        if kind == 0:
            x[r] = 1e4 + rng.uniform(-4.0, 4.0, size=n)  # exp(x) overflows unless shifted
        elif kind == 1:
            x[r] = -np.inf
            x[r, rng.integers(0, n)] = rng.uniform(-8.0, 8.0)  # one finite value: 1 there
        elif kind == 2:
            x[r] = 3.0  # all equal: 1/n each
        else:
            x[r] = rng.uniform(-200.0, 200.0, size=n)  # most terms underflow to 0
    return exact_in(x, dtype)


def random_rows(
    shape: tuple[int, ...], rng: np.random.Generator, op: str, dtype: str
) -> NDArray[np.float64]:
    top = 8.0 if op == "softmax" else 10.0
    return exact_in(rng.uniform(-top, top, size=shape), dtype)


def exact_in(x: NDArray[np.float64], dtype: str) -> NDArray[np.float64]:
    """`x` rounded to `dtype` (f32, or bf16: 8 significant bits, to nearest even), so the
    kernel reads exactly the values the reference computes with."""
    f = x.astype(np.float32)
    if dtype == "bf16":
        with np.errstate(invalid="ignore", over="ignore"):
            bits = f.view(np.uint32)
            half = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
            rounded = (bits + half) & np.uint32(0xFFFF0000)
            f = np.where(np.isfinite(f), rounded, bits).view(np.float32)
    return f.astype(np.float64)


def compare_rows(
    values: NDArray[np.float64], bound: NDArray[np.float64], got: NDArray[np.float64]
) -> tuple[bool, float, float, str]:
    """(ok, max abs error, largest error / bound, message): every element equal
    (infinities included, NaN where the reference is NaN) or within its bound."""
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(got - values)
        same = (got == values) | (np.isnan(got) & np.isnan(values))
        bad = ~(same | (err <= bound))
        used = np.where(same, 0.0, err / bound)
    finite = err[np.isfinite(err)]
    max_abs = float(np.max(finite, initial=0.0))
    max_used = float(np.max(used, initial=0.0)) if not np.isnan(used).any() else float("inf")
    if not bad.any():
        return True, max_abs, max_used, ""
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    return (
        False,
        max_abs,
        max_used,
        f"{int(bad.sum())} of {bad.size} elements wrong; first at {idx}: got {got[idx]!r}, "
        f"expected {values[idx]!r} +- {bound[idx]:.3g}",
    )


def softmax_reference(
    x: NDArray[np.float64],
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """(values, per-element bound, per-row sum bound) of softmax along the last axis."""
    n = x.shape[-1]
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", over="ignore"):
        shifted = x - m
        e = np.exp(shifted)
        d = np.sum(e, axis=-1, keepdims=True)
        ref = e / d
    spread = np.where(np.isfinite(shifted), np.abs(shifted), 0.0)
    row_spread = np.max(spread, axis=-1, keepdims=True)
    rel = U * (spread + 3.0 * row_spread + 22.0 + 2.0 * (n + 2))
    bound = ref * rel + SUBNORMAL_ABS * (1.0 + 1.0 / np.maximum(d, 1.0))
    row_bound = np.max(rel, axis=-1) * (1.0 + n * U) + n * SUBNORMAL_ABS
    return ref, bound, row_bound


def reduction_reference(op: str, x: NDArray[np.float64]) -> tuple[NDArray[Any], NDArray[Any]]:
    """(values, per-row bound) of a row max (exact) or sum: n terms in any order, the
    smaller of Higham's worst case gamma_n and the probabilistic 10 sqrt(n) u (as the
    matmul check, harness/verify.py's docstring) times sum |x|: sharp enough that a
    dropped term of the random inputs fails."""
    if op == "max":
        ref = np.max(x, axis=-1)
        return ref, np.zeros_like(ref)
    n = x.shape[-1]
    gamma = min(n * U / (1.0 - n * U), 10.0 * math.sqrt(n) * U)
    return np.sum(x, axis=-1), gamma * np.sum(np.abs(x), axis=-1) + SUBNORMAL_ABS


def broadcast_operand(op: str, b: Any) -> Any:
    """`b` of broadcast `op` shaped to broadcast against [rows, n] as numpy (or jax)
    does: a row [1, n], a column [rows, 1], one value [1, 1]; `add` and `mul` take b
    [rows, n] as it is."""
    dims = broadcast_dims(op)
    if dims == (0, 1):
        return b
    return b.reshape(1, -1) if dims == (1,) else b.reshape(-1, 1)


def broadcast_reference(
    op: str, x: NDArray[np.float64], b: NDArray[np.float64]
) -> tuple[NDArray[Any], NDArray[Any]]:
    """(values, per-element bound) of x + b or x * b, b a row vector (`*_row`: length n,
    the same for every row), a column vector (`*_col`: one value per row), one value
    (`*_scalar`) or a matrix like x (`add`, `mul`). One f32 rounding: u |exact| (and an
    underflowed product's half ulp of 2^-149)."""
    bb = broadcast_operand(op, b)
    ref = x + bb if op in ADD_KINDS else x * bb
    return ref, U * np.abs(ref) + SUBNORMAL_ABS / 2


def activation_reference(op: str, x: NDArray[np.float64]) -> tuple[NDArray[Any], NDArray[Any]]:
    """(values, per-element bound) of an activation, as kernels/rows.py computes it."""
    ax = np.abs(x)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if op == "relu":
            ref = np.maximum(x, 0.0)
            return ref, np.zeros_like(ref)
        if op == "exp":
            ref = np.exp(x)
            return ref, MATH_REL * ref + SUBNORMAL_ABS
        if op in ("silu", "gelu_tanh"):
            # v sigmoid(w), computed as v / (1 + e) or v e / (1 + e), e = exp(-|w|) <= 1
            # (kernels/rows.py, _sigmoid_product). A relative error r of e moves the result
            # by (1 - sigmoid(w)) r: exp's 2 ulp, plus (gelu_tanh) the cubic's ~8 roundings
            # of w; then v * e, 1 + e and the division, one rounding each. An e in the
            # subnormal range is off by up to 2^-148, times |v|.
            w = x if op == "silu" else 2.0 * _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
            # (0.5 x (1 + tanh(w / 2)) is the same value but cancels to 0 in the tail.)
            ref = x / (1.0 + np.exp(-w))
            one_minus = 1.0 / (1.0 + np.exp(np.where(np.isnan(w), 0.0, w)))  # 1 - sigmoid(w)
            cubic = 0.0 if op == "silu" else 8.0 * U * np.abs(w)
            rel = one_minus * (MATH_REL + cubic) + 3.0 * U
            bound = rel * np.abs(ref) + (ax + 1.0) * SUBNORMAL_ABS
            if op == "gelu_tanh":
                # The textbook 0.5 v (1 + tanh(w / 2)) that peers compute (onnxruntime, jax)
                # cancels in the negative tail: tanh's 2 ulp and 1 + t's rounding are
                # relative to 1, about |v| u absolute. Accepted: the bound is the larger.
                t = np.tanh(w / 2)
                textbook = 0.5 * ax * (
                    MATH_REL * np.abs(t) + 4.0 * U * np.abs(w) * (1.0 - t * t) + U * (1 + np.abs(t))
                ) + 3.0 * U * np.abs(ref)
                bound = np.maximum(bound, textbook)
            return ref, bound
        if op == "gelu_erf":
            z = x / math.sqrt(2.0)
            erf = np.vectorize(math.erf, otypes=[np.float64])(z) if x.size else z
            ref = 0.5 * x * (1.0 + erf)
            slope = 2.0 / math.sqrt(math.pi) * np.exp(-z * z)
            de = MATH_REL * np.abs(erf) + 2.0 * U * np.abs(z) * slope + U * (1 + np.abs(erf))
            return ref, 0.5 * ax * de + 3.0 * U * np.abs(ref) + SUBNORMAL_ABS
    raise ValueError(f"unknown row operation {op!r}")
