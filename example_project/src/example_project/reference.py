"""Random inputs and numpy references for the kernels, shared by the tests and the benchmark."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest even) and return the bits as uint16."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def _operand(rng: np.random.Generator, shape: tuple[int, ...], layout: str, dtype: str) -> Any:
    x = rng.standard_normal(shape, dtype=np.float32)
    if dtype == "bf16":
        x = bf16_bits(x)
    if layout == "col":
        x = (
            np.asfortranarray(x)
            if x.ndim == 2
            else np.ascontiguousarray(x.swapaxes(-1, -2)).swapaxes(-1, -2)
        )
    return x


def inputs(info: dict[str, Any], seed: int = 0) -> tuple[Any, Any]:
    """Random (a, b) in the dtype and layout the kernel wants."""
    rng = np.random.default_rng(seed)
    b, m, k, n = info["shape"]
    lead: tuple[int, ...] = (b,) if info["batched"] else ()
    la, lb, _ = info["layouts"]
    a = _operand(rng, (*lead, m, k), la, info["dtype"])
    bb = _operand(rng, (*lead, k, n), lb, info["dtype"])
    return a, bb


def as_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    return bf16_to_f32(x) if dtype == "bf16" else x


def reference(info: dict[str, Any], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in float64, as float32 (bf16 inputs are exact in float32)."""
    af = as_f32(a, info["dtype"]).astype(np.float64)
    bf = as_f32(b, info["dtype"]).astype(np.float64)
    return np.matmul(af, bf).astype(np.float32)


def tolerance(info: dict[str, Any]) -> float:
    """Relative tolerance scaled by K (reductions in float32 accumulate error)."""
    k = info["shape"][2]
    return 1e-6 * max(k, 16)


# -- row operations (x [rows, n] -> out [rows, n]) -----------------------------------------


def row_input(info: dict[str, Any], seed: int = 0) -> Any:
    """A random x in the dtype the kernel wants (values of a few units, both signs)."""
    x = np.random.default_rng(seed).standard_normal(tuple(info["shape"]), dtype=np.float32) * 3
    return bf16_bits(x) if info["dtype"] == "bf16" else x


def softmax(x: np.ndarray) -> np.ndarray:
    """Softmax along the last axis, in x's float type (max subtracted: no overflow)."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def gelu(x: np.ndarray) -> np.ndarray:
    """GELU, erf form, in float64 (numpy has no erf: math.erf per element; exact, slow)."""
    erf = np.vectorize(math.erf, otypes=[np.float64])
    x64 = np.asarray(x, dtype=np.float64)
    return 0.5 * x64 * (1.0 + erf(x64 / math.sqrt(2.0)))


def gelu_numpy(x: np.ndarray) -> np.ndarray:
    """GELU as one would write it in numpy (float32, erf by Abramowitz & Stegun 7.1.26,
    |error| <= 1.5e-7): the benchmark's baseline, not a reference."""
    z = np.abs(x) * np.float32(1.0 / math.sqrt(2.0))
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * z)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = np.copysign(np.float32(1.0) - poly.astype(np.float32) * np.exp(-z * z), x)
    return np.float32(0.5) * x * (np.float32(1.0) + erf)


def row_reference(info: dict[str, Any], x: np.ndarray) -> np.ndarray:
    """The row operation of `info` on x, in float64."""
    x64 = as_f32(x, info["dtype"]).astype(np.float64)
    if info["op"] == "softmax":
        return softmax(x64)
    if info["op"] == "gelu":
        return gelu(x64)
    raise ValueError(f"no reference for op {info['op']!r}")


def row_close(got: np.ndarray, want: np.ndarray) -> bool:
    """Within 1e-5 relative (and 1e-6 absolute where gelu's result cancels to ~0)."""
    return bool(np.all(np.abs(got - want) <= 1e-5 * np.abs(want) + 1e-6))


# -- pipelines (expr over named inputs -> out [rows, n]) -------------------------------------


def _matrices(info: dict[str, Any]) -> list[tuple[int, ...]]:
    """The shapes of a pipeline's matrix inputs after its first (the right sides of its
    products; not a bias [n] nor a column [rows, 1])."""
    shapes = [tuple(s) for s in info["inputs"].values()][1:]
    return [s for s in shapes if len(s) == 2 and s[1] > 1]


def pipeline_inputs(info: dict[str, Any], seed: int = 0) -> tuple[np.ndarray, ...]:
    """Random float32 inputs of a pipeline, in its declared order (its arguments' order):
    standard normal, a product's right side divided by sqrt of its rows, so that every
    product stays of order one."""
    rng = np.random.default_rng(seed)
    args = []
    for i, shape in enumerate(info["inputs"].values()):
        x = rng.standard_normal(tuple(shape), dtype=np.float32)
        if i > 0 and len(shape) == 2 and shape[1] > 1:
            x /= np.float32(math.sqrt(shape[0]))
        args.append(x)
    return tuple(args)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _pipelines(gelu_fn: Callable[[np.ndarray], np.ndarray]) -> dict[str, Callable[..., Any]]:
    """Each pipeline kernel of pyproject.toml written out in numpy (independently of the
    `expr` text the package declares, so a wrong declaration would fail the tests)."""
    return {
        "q_proj": lambda x, w, s: (x @ w) * s,
        "attn_out": lambda q, k, v, wo, x: softmax(q @ k.T) @ v @ wo + x,
        "mlp": lambda h, w1, b1, w2, b2: gelu_fn(h @ w1 + b1) @ w2 + b2,
    }


def pipeline_reference(name: str, *args: np.ndarray) -> np.ndarray:
    """Pipeline kernel `name` on args, in float64 (gelu exact, softmax max-subtracted)."""
    args64 = tuple(np.asarray(a, dtype=np.float64) for a in args)
    return np.asarray(_pipelines(gelu)[name](*args64))


def pipeline_numpy(name: str, *args: np.ndarray) -> np.ndarray:
    """The same pipeline as one would write it in numpy, in float32 (the benchmark's
    baseline: np.matmul, numpy softmax, gelu_numpy)."""
    return np.asarray(_pipelines(gelu_numpy)[name](*args))


def pipeline_tolerance(info: dict[str, Any]) -> float:
    """Tolerance relative to max|out| + 1: float32 rounding grows with a product's reduction
    length (at most the larger side of its right matrix) and the chain adds one such error
    per product."""
    return 1e-6 * sum(max(*shape, 16) for shape in _matrices(info))
