"""Matmul kernels synthesized by morello-build when this package was built.

Each kernel is ``name(a, b, out=None) -> out`` over numpy arrays (see the docstrings for the
shapes and dtypes it accepts); the GIL is released while it runs.
"""

from __future__ import annotations

from example_project._kernels import (  # type: ignore[import-not-found]
    __morello_info__,
    __morello_kernels__,
    matvec_bf16,
    mm64,
    mm_odd,
)

KERNELS: dict[str, object] = {name: globals()[name] for name in __morello_kernels__}
INFO: dict[str, dict[str, object]] = __morello_info__

__all__ = ["INFO", "KERNELS", "matvec_bf16", "mm64", "mm_odd"]
