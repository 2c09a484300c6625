"""numpy float64 references and sound error bounds for pipelines (``gelu(x @ w + b)``).

The bound follows the value through the stages, as the kernel computes them (whatever the
DP fused, every stage rounds to f32 once per element, in this order):
- a Matmul head: ``coeff(K) * (|A| @ |B|)``, the matmul check's bound (harness/verify.py:
  the smaller of Higham's worst case and the probabilistic ``10 sqrt(K) u``); a later
  Matmul by C: the error so far times ``|C|``, plus ``coeff(K) * ((|v| + error) @ |C|)``;
- ``+ b`` / ``* b``: the error so far (times ``|b|``), plus one rounding of the result;
- a gate, ``v * (A @ G)`` with the head's A: the product's own bound ``e_g`` as the head's,
  then ``err |g| + (|v| + err) e_g`` plus one rounding of the result;
- an activation f: the error so far times f's largest slope (relu 1, silu 1.1, both
  GELUs 1.13; exp: ``exp(v) * expm1(e)``), plus f's own bound at the exact value
  (harness/row_reference.py) widened by the same relative amount;
- softmax: each value moves by at most ``expm1(2 max|e|)`` of itself (first order
  ``out_i (e_i - sum_j out_j e_j)``), plus softmax's own bound.
Inputs are uniform in ``[-a, a]`` with ``a = 3 / K^(1/4)`` (a later Matmul's
``sqrt(3 / K)``) so that pre-activations have a standard deviation near 3: both tails of every activation are exercised and exp stays
far from f32 overflow at any K.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from morello_build.harness.arrays import float_matmul_coeff
from morello_build.harness.row_reference import (
    SUBNORMAL_ABS,
    U,
    activation_reference,
    broadcast_operand,
    exact_in,
    softmax_reference,
)
from morello_build.ir.spec import (
    ADD_KINDS,
    BROADCAST_KINDS,
    GATE,
    MATMUL,
    SOFTMAX,
    compose_stages,
    param_names,
)

#: Largest |f'(v)| of each activation over the reals.
SLOPES = {"relu": 1.0, "silu": 1.1, "gelu_tanh": 1.13, "gelu_erf": 1.13}


def input_range(name: str, shapes: Mapping[str, tuple[int, ...]]) -> float:
    """Half-width of the uniform values of input `name` (module docstring)."""
    if name == "lhs" or (name in ("rhs", "gate") and "lhs" in shapes):
        return 3.0 / shapes["lhs"][-1] ** 0.25
    if name.startswith("rhs"):  # a later Matmul: keeps the running value's size (about 3)
        return math.sqrt(3.0 / shapes[name][-2])
    return 3.0


def pipeline_inputs(
    kind: str, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str], rng: Any
) -> dict[str, NDArray[np.float64]]:
    """float64 inputs exact in their dtypes, for every input operand of the pipeline."""
    return {
        name: exact_in(
            rng.uniform(-input_range(name, shapes), input_range(name, shapes), size=shape),
            dtypes[name],
        )
        for name, shape in shapes.items()
    }


def pipeline_reference(
    kind: str, inputs: Mapping[str, NDArray[np.float64]]
) -> tuple[NDArray[Any], NDArray[Any]]:
    """(values, per-element bound) of the pipeline `kind` on `inputs` (by operand name)."""
    stages = compose_stages(kind)
    if stages is None:
        raise ValueError(f"not a pipeline: {kind!r}")
    names = iter(param_names(kind))
    if stages[0] == MATMUL:
        lhs, rhs = inputs[next(names)], inputs[next(names)]
        k = int(lhs.shape[-1])
        a, w = lhs.reshape(-1, k), rhs.reshape(k, -1)
        v = a @ w
        err = float_matmul_coeff(k, statistical=True) * (np.abs(a) @ np.abs(w))
        err = err + k * SUBNORMAL_ABS
        rest = stages[1:]
    else:
        v = inputs[next(names)]
        err = np.zeros_like(v)
        rest = stages
    for stage in rest:
        if stage == GATE:  # v * (a @ g): a product like the head's, then one rounding
            g_in = inputs[next(names)]
            k = int(g_in.shape[-2])
            g = g_in.reshape(k, -1)
            gv = a @ g
            eg = float_matmul_coeff(k, statistical=True) * (np.abs(a) @ np.abs(g))
            eg = eg + k * SUBNORMAL_ABS
            err = err * np.abs(gv) + (np.abs(v) + err) * eg
            v = v * gv
            err = err + U * (np.abs(v) + err) + SUBNORMAL_ABS / 2
            continue
        if stage == MATMUL:  # err' = err @ |c| + the product's own rounding of |v| + err
            c = inputs[next(names)]
            k = int(c.shape[-2])
            c = c.reshape(k, -1)
            coeff = float_matmul_coeff(k, statistical=True)
            v, err = v @ c, err @ np.abs(c) + coeff * ((np.abs(v) + err) @ np.abs(c))
            err = err + k * SUBNORMAL_ABS
            continue
        if stage in BROADCAST_KINDS:
            b = inputs[next(names)]
            bb = broadcast_operand(stage, b)
            if stage in ADD_KINDS:
                v = v + bb
            else:
                v, err = v * bb, err * np.abs(bb)
            err = err + U * (np.abs(v) + err) + SUBNORMAL_ABS / 2
            continue
        if stage == SOFTMAX:
            # softmax(v + e) - softmax(v) is out_i (e_i - sum_j out_j e_j) to first order:
            # at most 2 max|e| of each value's own size (with slack for the second order).
            ref, own, _ = softmax_reference(v)
            spread = 2.0 * np.max(err, axis=-1, keepdims=True)
            err = ref * np.expm1(1.01 * spread) + own
            v = ref
            continue
        ref, own = activation_reference(stage, v)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            rel = np.where(ref != 0, own / np.abs(ref), 0.0)
            moved = ref * np.expm1(err) if stage == "exp" else SLOPES[stage] * err
            err = moved * (1.0 + rel) + own
        v = ref
    return v, err
