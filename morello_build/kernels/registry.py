"""Every microkernel, in the order the search enumerates them.

A Spec's action list offers its kind's kernels in `KERNELS` order and the memo stores
indices into that list, so the order is part of what a cached answer means (the schema
stamp covers this module: editing it starts a new cache table).
"""

from __future__ import annotations

from morello_build.codegen.context import Ctx
from morello_build.codegen.views import CodegenError, View
from morello_build.ir.spec import LogicalSpec
from morello_build.kernels.amx import AMX_TILE_MATMUL
from morello_build.kernels.base import Kernel
from morello_build.kernels.broadcast_fma import BROADCAST_VEC_MULT_ADD, BROADCAST_VEC_MULT_ADD_BF16
from morello_build.kernels.dot import (
    DOT_PRODUCT_LOOP,
    DOT_PRODUCT_LOOP_BF16,
    DOT_PRODUCT_LOOP_VDPBF16PS,
)
from morello_build.kernels.dpbf16_tiles import DPBF16_TILE
from morello_build.kernels.k_pairs import PACK_BF16_PAIRS
from morello_build.kernels.matvec_stream import (
    DOT_ROWS_BF16,
    DOT_ROWS_F32,
    DOT_ROWS_F32_BF16,
    VEC_MAT_ROWS_BF16,
    VEC_MAT_ROWS_F32,
    VEC_MAT_ROWS_F32_BF16,
)
from morello_build.kernels.moves import (
    MEMSET_ZERO,
    VECTOR_ASSIGN,
    VECTOR_CAST_BF16_F32,
    VECTOR_ZERO,
)
from morello_build.kernels.rows import ROW_KERNELS
from morello_build.kernels.scalar import ASSIGN, CAST_BF16_F32, MULT_ADD, VALUE_ZERO
from morello_build.kernels.transpose import (
    TRANSPOSE_BF16_F32,
    TRANSPOSE_BF16_PAIRS,
    TRANSPOSE_F32,
)

KERNELS: tuple[Kernel, ...] = (
    # Matmul (accumulating)
    MULT_ADD,
    BROADCAST_VEC_MULT_ADD,
    BROADCAST_VEC_MULT_ADD_BF16,
    DOT_PRODUCT_LOOP,
    DOT_PRODUCT_LOOP_BF16,
    DOT_PRODUCT_LOOP_VDPBF16PS,
    VEC_MAT_ROWS_F32,
    VEC_MAT_ROWS_BF16,
    VEC_MAT_ROWS_F32_BF16,
    DOT_ROWS_F32,
    DOT_ROWS_BF16,
    DOT_ROWS_F32_BF16,
    AMX_TILE_MATMUL,
    DPBF16_TILE,
    # Move
    ASSIGN,
    CAST_BF16_F32,
    VECTOR_ASSIGN,
    VECTOR_CAST_BF16_F32,
    PACK_BF16_PAIRS,
    TRANSPOSE_F32,
    TRANSPOSE_BF16_F32,
    TRANSPOSE_BF16_PAIRS,
    # Zero
    MEMSET_ZERO,
    VALUE_ZERO,
    VECTOR_ZERO,
    # Row operations (softmax parts, activations) and FillNegInf
    *ROW_KERNELS,
)

KERNELS_BY_NAME: dict[str, Kernel] = {k.name: k for k in KERNELS}


def kernels_for(kind: str) -> tuple[Kernel, ...]:
    return tuple(k for k in KERNELS if k.kind == kind)


def emit_kernel(ctx: Ctx, name: str, spec: LogicalSpec, views: tuple[View, ...]) -> None:
    """Write the C of one call of kernel `name` (as an Impl tree's Kernel node names it)."""
    kernel = KERNELS_BY_NAME.get(name)
    if kernel is None:
        raise CodegenError(f"no C emitter for kernel {name!r}")
    kernel.emit(ctx, spec, views)
