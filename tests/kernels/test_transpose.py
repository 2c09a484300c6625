"""TransposeF32: a column-major f32 operand packed into row-major tiles a vector block at a
time. The kernels are compiled, run and compared with numpy (a copy must be exact), and
the search must pick the block transpose where the shapes allow it, including into the
packed B panels of `q @ k.T` (whose panel index is opaque C the kernel trusts the layout
for)."""

from __future__ import annotations

import pytest

from morello_build.actions.select import takes
from morello_build.codegen.emit import generate_c
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from morello_build.impl.nodes import Impl, Kernel
from morello_build.impl.printer import iter_nodes
from morello_build.ir.dtypes import Dtype
from morello_build.ir.text import parse_spec
from morello_build.kernels.transpose import (
    SHUFFLES,
    TRANSPOSE_BF16_F32,
    TRANSPOSE_F32,
    helper_name,
)
from morello_build.machine.target import get_target
from tests.support.shared_search import synthesize_impl

CASES = [
    # (isa, Spec): whole blocks, remainders on both sides, a tall and a wide one
    ("avx512", "Move(32x48, f32:GL:col, f32:GL:row, serial)"),
    ("avx512", "Move(37x21, f32:GL:col, f32:GL:row, serial)"),
    ("avx512", "Move(48x16, f32:GL:row, f32:GL:col, serial)"),
    ("avx2", "Move(24x40, f32:GL:col, f32:GL:row, serial)"),
    ("avx2", "Move(19x30, f32:GL:row, f32:GL:col, serial)"),
    ("avx512", "Move(32x48, bf16:GL:col, f32:GL:row, serial)"),  # widened as loaded
    ("avx2", "Move(21x40, bf16:GL:col, f32:GL:row, serial)"),
    ("avx512", "Matmul(1x32x64x48, f32:GL:row, f32:GL:col, f32:GL:row, serial)"),
    ("avx2", "Matmul(1x16x32x24, f32:GL:row, f32:GL:col, f32:GL:row, serial)"),
]


BLOCKS = {"TransposeF32", "TransposeBf16F32", "TransposeBf16Pairs"}


def _transposes(impl: Impl) -> list[Impl]:
    return [n for n in iter_nodes(impl) if isinstance(n, Kernel) and n.name in BLOCKS]


def _id(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_the_block_transpose_copies_exactly(case: tuple[str, str]) -> None:
    isa, text = case
    impl = synthesize_impl(parse_spec(text), isa)
    blocks = _transposes(impl)
    assert blocks, f"{text} on {isa}: no block transpose in the program"
    lanes = 16 if isa == "avx512" else 8
    assert all(sorted(n.spec.shape)[-2:] == [lanes, lanes] for n in blocks)
    kernel = generate_c(impl, "mb_transpose_test", isa)
    dtype = parse_spec(text).operands[0 if text.startswith("Move") else 1].dtype
    # the vector form, not the element-by-element fallback
    assert f"{helper_name(dtype, lanes)}(&" in kernel.c_source
    try:
        result = verify_kernel(kernel, compiler="gcc")
    except IsaUnavailable:
        pytest.skip(f"compiled; this host cannot run {isa}")
    assert result.ok, f"{text} on {isa}: {result.details}"


def test_the_attention_scores_pack_k_with_block_transposes() -> None:
    """`q @ k.T` packs k into B panels of 32 columns: the blocks land in the panels (the
    panel index is opaque C), and the result is still right."""
    text = "Matmul(1x64x64x128, f32:GL:row, f32:GL:col, f32:GL:row, serial)"
    impl = synthesize_impl(parse_spec(text), "avx512")
    assert _transposes(impl)
    kernel = generate_c(impl, "mb_scores", "avx512")
    calls = [ln for ln in kernel.c_source.splitlines() if "mb_transpose_f32_f32_16(&" in ln]
    assert calls
    try:
        result = verify_kernel(kernel, compiler="gcc")
    except IsaUnavailable:
        pytest.skip("compiled; this host cannot run avx512")
    assert result.ok, result.details


def test_only_square_vector_blocks_apply() -> None:
    """The kernel prices and emits one lanes x lanes block: other shapes are not offered."""
    for isa, lanes in (("avx512", 16), ("avx2", 8)):
        t = get_target(isa)
        assert lanes in SHUFFLES
        ok = parse_spec(f"Move({lanes}x{lanes}, f32:L1:col, f32:L1:row, serial)")
        assert takes(TRANSPOSE_F32, ok, t)
        widening = parse_spec(f"Move({lanes}x{lanes}, bf16:L1:col, f32:L1:row, serial)")
        assert takes(TRANSPOSE_BF16_F32, widening, t) and not takes(TRANSPOSE_F32, widening, t)
        for bad in (
            f"Move({lanes}x{2 * lanes}, f32:L1:col, f32:L1:row, serial)",  # not square
            f"Move({lanes}x{lanes}, f32:L1:row, f32:L1:row, serial)",  # nothing to transpose
            f"Move({lanes}x{lanes}, bf16:L1:col, bf16:L1:row, serial)",  # f32 out only
        ):
            assert not any(
                takes(k, parse_spec(bad), t) for k in (TRANSPOSE_F32, TRANSPOSE_BF16_F32)
            )
    assert not takes(
        TRANSPOSE_F32, parse_spec("Move(4x4, f32:L1:col, f32:L1:row, serial)"), get_target("x86-64")
    )


PAIR_CASES = [
    # bf16 B stored by columns, packed into the k-pairs AMX tiles read (`k.T` of bf16
    # attention inputs); the second has k not a multiple of the 32-value block
    "Matmul(1x32x64x48, bf16:GL:row, bf16:GL:col, f32:GL:row, serial)",
    "Matmul(1x16x80x32, bf16:GL:row, bf16:GL:col, f32:GL:row, serial)",
]


@pytest.mark.parametrize("text", PAIR_CASES)
def test_bf16_columns_go_into_k_pairs_a_block_at_a_time(text: str) -> None:
    impl = synthesize_impl(parse_spec(text), "amx")
    blocks = [n for n in _transposes(impl) if n.name == "TransposeBf16Pairs"]
    assert blocks, f"{text}: no TransposeBf16Pairs in the program"
    assert all(sorted(n.spec.shape)[-2:] == [16, 32] for n in blocks)
    kernel = generate_c(impl, "mb_pairs_test", "amx")
    # the f32 block transpose over bf16 pairs, not the element-by-element fallback
    assert f"{helper_name(Dtype.F32, 16)}((const float *)&" in kernel.c_source
    try:
        result = verify_kernel(kernel, compiler="gcc")
    except IsaUnavailable:
        pytest.skip("compiled; this host cannot run amx")
    assert result.ok, f"{text}: {result.details}"
