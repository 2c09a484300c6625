"""A tiny transformer block (one attention head and an MLP, each with a residual connection)
built from the pipelines declared in pyproject.toml, with its float64 reference and the same
block in float32 numpy (the baseline `python -m example_project` times it against).

Sizes are fixed by the declarations: sequence length 16, model width 16, MLP hidden width
64, float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from example_project._kernels import (  # type: ignore[import-not-found]
    attn_out,
    mlp,
    proj,
    q_proj,
)
from example_project.reference import gelu, gelu_numpy, softmax

#: Sequence length, model width and MLP hidden width of the declared kernels.
SEQ, D_MODEL, D_HIDDEN = 16, 16, 64

#: The attention scale 1/sqrt(d), q_proj's input `s` (declared [1]: one value; an
#: expression has no constants).
ATTN_SCALE = np.array([1.0 / math.sqrt(D_MODEL)], dtype=np.float32)


@dataclass(frozen=True)
class Params:
    """The weights of one block, float32 and C-contiguous: the attention projections
    (`wq`, `wk`, `wv`, `wo`: [16, 16]) and the MLP (`w1` [16, 64], `b1` [64], `w2`
    [64, 16], `b2` [16])."""

    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray

    @classmethod
    def random(cls, seed: int = 0) -> Params:
        """Random weights, each matrix scaled by 1/sqrt(its fan-in), biases of 0.1 or so."""
        rng = np.random.default_rng(seed)

        def mat(k: int, n: int) -> np.ndarray:
            return rng.standard_normal((k, n), dtype=np.float32) / np.float32(math.sqrt(k))

        def vec(n: int) -> np.ndarray:
            return rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)

        return cls(
            wq=mat(D_MODEL, D_MODEL),
            wk=mat(D_MODEL, D_MODEL),
            wv=mat(D_MODEL, D_MODEL),
            wo=mat(D_MODEL, D_MODEL),
            w1=mat(D_MODEL, D_HIDDEN),
            b1=vec(D_HIDDEN),
            w2=mat(D_HIDDEN, D_MODEL),
            b2=vec(D_MODEL),
        )


def transformer_block(x: np.ndarray, p: Params) -> np.ndarray:
    """One transformer block on x (float32 [16, 16]: 16 positions of width 16), with the
    synthesized kernels; returns a new float32 [16, 16] array::

        q = x @ wq / sqrt(16)                        # q_proj
        k = x @ wk; v = x @ wv                       # proj
        h = softmax(q @ k.T) @ v @ wo + x            # attn_out: one head, no mask
        out = h + gelu(h @ w1 + b1) @ w2 + b2        # mlp (gelu: erf form)

    No layer norm (and no dropout): a pre- or post-norm block would normalize x and h first.
    A wrong shape or dtype raises the kernels' ValueError or TypeError (naming the kernel
    and its argument, e.g. ``q_proj: x must have shape (16, 16), got (16, 8)``).
    """
    q = q_proj(x, p.wq, ATTN_SCALE)
    k = proj(x, p.wk)
    v = proj(x, p.wv)
    h = attn_out(q, k, v, p.wo, x)  # the residual added in the kernel
    out = mlp(h, p.w1, p.b1, p.w2, p.b2)
    out += h
    return out


def block_reference(x: np.ndarray, p: Params) -> np.ndarray:
    """transformer_block in float64 numpy (gelu exact: math.erf per element)."""
    x64 = np.asarray(x, dtype=np.float64)
    w = {f.name: np.asarray(getattr(p, f.name), dtype=np.float64) for f in fields(p)}
    q = x64 @ w["wq"] / math.sqrt(D_MODEL)
    k = x64 @ w["wk"]
    v = x64 @ w["wv"]
    h = x64 + softmax(q @ k.T) @ v @ w["wo"]
    return h + gelu(h @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]


def block_numpy(x: np.ndarray, p: Params) -> np.ndarray:
    """The same block as one would write it in float32 numpy (np.matmul, numpy softmax,
    gelu_numpy): the baseline `python -m example_project` times transformer_block against."""
    q = np.matmul(x, p.wq) * ATTN_SCALE
    k = np.matmul(x, p.wk)
    v = np.matmul(x, p.wv)
    h = x + np.matmul(np.matmul(softmax(np.matmul(q, k.T)), v), p.wo)
    return h + np.matmul(gelu_numpy(np.matmul(h, p.w1) + p.b1), p.w2) + p.b2
