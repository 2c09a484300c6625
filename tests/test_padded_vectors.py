"""Padded vector registers: f32 rows narrower than a register sit in lanes 0..r-1 of their
own register and are loaded/stored with lane masks. The synthesizer uses them for
remainder strips; the generated C is compiled with gcc and clang and checked against numpy
(the harness's guard bytes catch any store past a row)."""

import pytest

from morello_build.api import synthesize
from morello_build.codegen.emit import generate_c
from morello_build.imp.nodes import Alloc
from morello_build.imp.printer import iter_nodes
from morello_build.ir import layout as lay
from morello_build.ir.dtypes import Dtype
from morello_build.ir.levels import Level
from morello_build.ir.tensorspec import make_tensor, tile_tensor
from morello_build.ir.text import parse_spec
from morello_build.verify import IsaUnavailable, verify_kernel


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
    for cc in ("gcc", "clang"):
        try:
            r = verify_kernel(kernel, compiler=cc)
        except IsaUnavailable:
            pytest.skip(f"host lacks {isa}")
        assert r.ok, f"{cc}: {r.details}"
