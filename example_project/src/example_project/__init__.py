"""Kernels synthesized by morello-build when this package was built.

A matmul is ``name(a, b, out=None) -> out``, a row operation (softmax, gelu) is
``name(x, out=None) -> out``, over numpy arrays (see the docstrings for the shapes and dtypes
each accepts); the GIL is released while a kernel runs. ``INFO[name]["op"]`` says which.
"""

from __future__ import annotations

from example_project._kernels import (  # type: ignore[import-not-found]
    __morello_info__,
    __morello_kernels__,
    gelu_rows,
    matvec_bf16,
    mm64,
    mm_odd,
    softmax_rows,
)

KERNELS: dict[str, object] = {name: globals()[name] for name in __morello_kernels__}
INFO: dict[str, dict[str, object]] = __morello_info__

__all__ = ["INFO", "KERNELS", "gelu_rows", "matvec_bf16", "mm64", "mm_odd", "softmax_rows"]
