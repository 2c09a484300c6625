"""Padded vector registers: an f32 row that does not fill whole registers starts a register
of its own and fills ceil(r / vs) of them, the last one in lanes 0..r % vs - 1, which is
loaded/stored with lane masks. The synthesizer uses them for remainder strips; the
generated C is compiled with gcc and clang and checked against numpy (the harness's guard
bytes catch any store past a row)."""

import pytest

from morello_build.actions.tile import register_aligned
from morello_build.api import synthesize
from morello_build.codegen.emit import generate_c
from morello_build.impl.nodes import Alloc
from morello_build.impl.printer import iter_nodes
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.spec import LogicalSpec
from morello_build.ir.tensorspec import make_tensor, tile_tensor
from morello_build.ir.text import parse_spec
from tests.support.compilers import verify_with_each_compiler


def vrf(shape, vs, dtype=Dtype.F32):
    return make_tensor(shape, dtype, Level.VRF, lay.row_major(shape), vs)


def test_rows_narrower_than_a_register_are_padded():
    t = vrf((1, 8, 10), 16)
    assert t is not None and t.padded_axis == 2
    assert t.registers == 8 and t.memory_units() == 8  # one register per row, not 80/16
    assert tile_tensor(t, (1, 1, 10)) is not None  # a whole padded row
    assert tile_tensor(t, (1, 8, 5)) is None  # part of a row would start mid-register
    # Rows that fill whole registers are not padded; neither are 16-bit lanes (no masks).
    assert vrf((1, 8, 32), 16).padded_axis is None
    assert vrf((1, 8, 10), 16, Dtype.BF16).padded_axis is None
    # A narrow piece of full registers is not a padded tensor either.
    assert tile_tensor(vrf((1, 2, 32), 16), (1, 2, 10)) is None


def test_rows_wider_than_a_register_end_in_a_padded_one():
    t = vrf((1, 8, 26), 16)  # 26 = 16 + 10: two registers per row, the second masked
    assert t is not None and t.padded_axis == 2
    assert t.registers == 16 and t.memory_units() == 16
    assert vrf((1, 8, 32), 16).registers == 16  # whole registers are not padded
    # Pieces that start on a register: whole registers, or the rows' last registers.
    head = tile_tensor(t, (1, 8, 16))
    assert head is not None and head.padded_axis is None and head.registers == 8
    tail = tile_tensor(t, (1, 8, 10))
    assert tail is not None and tail.padded_axis == 2 and tail.registers == 8
    wide = vrf((1, 2, 42), 16)  # 42 = 2 * 16 + 10
    assert tile_tensor(wide, (1, 2, 26)) is not None  # the last 26 start at column 16
    assert tile_tensor(wide, (1, 2, 20)) is None  # the last 20 would start mid-register
    assert tile_tensor(t, (1, 8, 8)) is None  # half a register


def test_loops_over_padded_rows_step_in_whole_registers():
    spec = parse_spec("MatmulAccum(1x1x1x26, f32:L1:row, f32:VRF:row:16, f32:VRF:row:16)")
    assert isinstance(spec, LogicalSpec)
    assert register_aligned(spec, (1, 1, 1, 26))
    assert register_aligned(spec, (1, 1, 1, 16))  # remainder 10 starts at column 16
    assert not register_aligned(spec, (1, 1, 1, 10))  # tiles at 10, 20 start mid-register
    assert not register_aligned(spec, (1, 1, 1, 8))


@pytest.mark.parametrize(
    "isa,dims",
    [("avx512", (8, 37, 26)), ("avx512", (5, 7, 42)), ("avx2", (6, 11, 21))],
)
def test_wide_remainder_rows_are_one_register_tile(isa, dims):
    """The remainder strip is one tile whose rows span several registers, the last one
    masked (8x26 on avx512: 16 accumulators in one pass over A, not 16 + 10 columns)."""
    m, k, n = dims
    spec = parse_spec(f"Matmul(1x{m}x{k}x{n}, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    impl = synthesize(spec, isa, use_cache=False).impl
    wide = [
        node.tensor
        for node in iter_nodes(impl)
        if isinstance(node, Alloc)
        and node.tensor.level is Level.VRF
        and node.tensor.padded_axis is not None
        and node.tensor.shape[node.tensor.padded_axis] > (node.tensor.vector_size or 0)
    ]
    assert wide, "no register tile with rows wider than a register"
    kernel = generate_c(impl, f"mm_wide_{isa}_{m}x{k}x{n}", isa)
    verify_with_each_compiler(kernel)


@pytest.mark.parametrize(
    "isa,dims,intrinsic",
    [
        ("avx512", (8, 37, 26), "_mm512_mask_storeu_ps"),
        ("avx512", (12, 19, 42), "_mm512_maskz_loadu_ps"),
        ("avx2", (6, 9, 13), "_mm256_maskstore_ps"),
    ],
)
def test_remainder_strips_use_masked_rows_and_match_numpy(isa, dims, intrinsic, tmp_path):
    m, k, n = dims
    spec = parse_spec(f"Matmul(1x{m}x{k}x{n}, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    impl = synthesize(spec, isa, use_cache=False).impl
    padded = [
        node.tensor
        for node in iter_nodes(impl)
        if isinstance(node, Alloc) and node.tensor.level is Level.VRF and node.tensor.padded_axis
    ]
    assert padded, "the remainder strip did not use a padded register tile"
    kernel = generate_c(impl, f"mm_pad_{isa}_{m}x{k}x{n}", isa)
    assert intrinsic in kernel.c_source
    verify_with_each_compiler(kernel)
