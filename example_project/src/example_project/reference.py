"""Random inputs and numpy references for the kernels, shared by the tests and the benchmark."""

from __future__ import annotations

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
