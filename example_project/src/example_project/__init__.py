"""Kernels synthesized by morello-build when this package was built.

A matmul is ``name(a, b, out=None) -> out``, a row operation (softmax, gelu) is
``name(x, out=None) -> out``, a pipeline (an expression fused into one kernel) takes its
declared inputs in order, e.g. ``mlp(h, w1, b1, w2, b2, out=None) -> out``, over numpy arrays
(see the docstrings for the shapes and dtypes each accepts); the GIL is released while a
kernel runs. ``INFO[name]["op"]`` says which (``"matmul"``, ``"softmax"``, ``"gelu"``,
``"pipeline"``; a pipeline's ``INFO`` also has its ``"expr"`` and ``"inputs"``).

``transformer_block(x, Params.random())`` chains the pipelines into a tiny transformer block
(example_project.block).
"""

from __future__ import annotations

from example_project._kernels import (  # type: ignore[import-not-found]
    __morello_info__,
    __morello_kernels__,
    attn_out,
    gelu_rows,
    matvec_bf16,
    mlp,
    mm64,
    mm_odd,
    proj,
    q_proj,
    softmax_rows,
)
from example_project.block import Params, block_reference, transformer_block

KERNELS: dict[str, object] = {name: globals()[name] for name in __morello_kernels__}
INFO: dict[str, dict[str, object]] = __morello_info__

__all__ = [
    "INFO",
    "KERNELS",
    "Params",
    "attn_out",
    "block_reference",
    "gelu_rows",
    "matvec_bf16",
    "mlp",
    "mm64",
    "mm_odd",
    "proj",
    "q_proj",
    "softmax_rows",
    "transformer_block",
]
