"""AMX target: bf16 x bf16 -> f32 Matmul on tile registers (`tdpbf16ps`).

Applicability, enumeration and emission run anywhere; compiling and running the kernels
needs a host with AMX (and a kernel that grants tile data), else those tests skip.
"""

from __future__ import annotations

import pytest

from morello_build.actions.enumerate import enumerate_actions
from morello_build.actions.move import Move
from morello_build.codegen.emit import generate_c
from morello_build.codegen.views import CodegenError
from morello_build.ir import layout as lay
from morello_build.ir.levels import Level
from morello_build.ir.text import parse_spec
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine import isa as isa_mod
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule
from tests.support.compilers import verify_with_each_compiler

AMX = "AmxTileMatmulBf16F32"
PACK = "PackBf16Pairs"
PAIRS = "[1,2,1p2]"


def _needs_amx() -> None:
    if not isa_mod.host_supports("amx"):
        pytest.skip("host lacks AMX (amx_tile, amx_bf16)")


def test_amx_isa_is_avx512_plus_tiles():
    assert isa_mod.ISAS[0] == "amx"
    assert (
        isa_mod.ISA_FLAGS["amx"][: len(isa_mod.ISA_FLAGS["avx512"])] == isa_mod.ISA_FLAGS["avx512"]
    )
    assert {"-mamx-tile", "-mamx-bf16"} <= set(isa_mod.ISA_FLAGS["amx"])
    cond = isa_mod.runtime_condition("amx")
    assert cond.startswith(isa_mod.runtime_condition("avx512")) and "morello_cpu_has_amx()" in cond
    assert "__get_cpuid_count" in isa_mod.runtime_helpers_source(["avx512", "amx"])
    assert isa_mod.runtime_helpers_source(["avx512", "avx2"]) == ""
    t, base = get_target("amx"), get_target("avx512")
    assert t.isa == "amx" and t.vector_bytes == base.vector_bytes
    assert t.max_limits == base.max_limits and t.hit_cost == base.hit_cost


def _accum_spec(m: int, k: int, n: int, b_layout: str, level: str = "L1"):
    return parse_spec(
        f"MatmulAccum(1x{m}x{k}x{n}, bf16:{level}:row, bf16:{level}:{b_layout}, "
        f"f32:{level}:row, serial)"
    )


@pytest.mark.parametrize("m,n", [(16, 16), (16, 32), (32, 16), (32, 32)])
def test_tile_kernel_applies_only_on_amx_with_k_pairs(m, n):
    k = KERNELS_BY_NAME[AMX]
    spec = _accum_spec(m, 64, n, PAIRS)
    assert k.applies(spec, get_target("amx"))
    assert not k.applies(spec, get_target("avx512"))
    assert not k.applies(_accum_spec(m, 64, n, "row"), get_target("amx"))
    assert not k.applies(_accum_spec(m, 48, n, PAIRS), get_target("amx"))  # K % 32


def test_tile_kernel_cost_prefers_2x2_tiles():
    k, t = KERNELS_BY_NAME[AMX], get_target("amx")
    big = k.cost(_accum_spec(32, 256, 32, PAIRS), t)
    small = k.cost(_accum_spec(16, 256, 16, PAIRS), t)
    assert big < 4 * small


def test_b_relayout_into_k_pairs_is_enumerated_on_amx_only():
    spec = parse_spec("MatmulAccum(1x64x128x64, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)")
    pairs = lay.parse_layout(PAIRS, (1, 128, 64))

    def pair_moves(isa: str) -> list[Move]:
        return [
            a
            for a in enumerate_actions(spec, get_target(isa))
            if isinstance(a, Move) and a.operand == 1 and a.layout == pairs
        ]

    assert {m.level for m in pair_moves("amx")} == {Level.GL, Level.L1}
    assert pair_moves("avx512") == []


def _hand_schedule(m: int, k: int, n: int, threads: int = 1) -> Schedule:
    """B packed into k-pairs once, then 32x32 (or smaller) output tiles on the AMX kernel."""
    spec = parse_spec(
        f"MatmulAccum(1x{m}x{k}x{n}, bf16:GL:row, bf16:GL:row, f32:GL:row"
        f"{', serial' if threads == 1 else ''})"
    )
    s = Schedule.for_spec(spec, get_target("amx", threads))
    s = s.move(1, "GL", layout=PAIRS).at(0, lambda p: p.select(PACK))
    if (m, n) != (min(m, 32), min(n, 32)):
        s = s.tile_out(min(m, 32), min(n, 32), parallel=threads > 1)
        if n % 32:  # the ragged 16-column boundary tile: the AMX kernel again
            s = s.at((1, 1), lambda p: p.select(AMX))
    return s.select(AMX)


@pytest.mark.parametrize("m,k,n", [(32, 64, 32), (64, 128, 64), (16, 32, 48)])
def test_hand_scheduled_amx_kernel_matches_numpy(m, k, n):
    s = _hand_schedule(m, k, n)
    assert not s.holes()
    kernel = generate_c(s.impl, f"mm_amx_hand_{m}x{k}x{n}", "amx")
    src = kernel.c_source
    assert "_tile_dpbf16ps" in src and "_tile_loadconfig(mb_amx_cfg);" in src
    assert src.index("_tile_loadconfig") < src.index("_tile_loadd")  # once, in the prologue
    assert src.count("_tile_loadconfig(") == 1 and src.count("_tile_release();") == 1
    assert "_mm512_unpacklo_epi16" in src  # B packed with vector shuffles
    assert "which the OS refused" in src  # a refused permission says why before abort()
    _needs_amx()
    verify_with_each_compiler(kernel)


def test_parallel_loops_configure_tiles_per_thread():
    s = _hand_schedule(64, 64, 64, threads=2)
    kernel = generate_c(s.impl, "mm_amx_par", "amx")
    src = kernel.c_source
    # Each thread runs the outlined parallel-loop body, which configures its own tiles.
    body = src[src.index("static void mm_amx_par_par0(") : src.index("void mm_amx_par(")]
    assert "_tile_loadconfig(mb_amx_cfg);" in body and "_tile_release();" in body
    kernel_fn = src[src.index("void mm_amx_par(") :]
    assert "#pragma omp parallel for" in kernel_fn and "mm_amx_par_par0(" in kernel_fn
    assert "_tile_loadconfig" not in kernel_fn
    _needs_amx()
    verify_with_each_compiler(kernel)


def test_tile_kernel_rejects_non_uniform_rows():
    # A 16-column tile of B that crosses into a separate buffer cannot be one tile load;
    # the emitter must refuse rather than guess (here: an L1 copy row-major, not k-pairs).
    from morello_build.codegen.context import Ctx
    from morello_build.codegen.views import MEM, Buffer, View
    from morello_build.kernels.registry import emit_kernel

    spec = _accum_spec(16, 32, 16, PAIRS)
    a = Buffer("a", spec.operands[0].dtype, (1, 16, 32), lay.row_major((1, 16, 32)), MEM)
    b = Buffer("b", spec.operands[1].dtype, (1, 32, 16), lay.row_major((1, 32, 16)), MEM)
    c = Buffer("c", spec.operands[2].dtype, (1, 16, 16), lay.row_major((1, 16, 16)), MEM)
    with pytest.raises(CodegenError):
        emit_kernel(Ctx("amx", False), AMX, spec, tuple(View.whole(x) for x in (a, b, c)))


@pytest.mark.parametrize("m,k,n", [(32, 64, 32), (64, 128, 64), (96, 64, 80)])
def test_synthesized_bf16_matmul_uses_amx_and_matches_numpy(m, k, n):
    from morello_build.api import synthesize

    spec = parse_spec(f"Matmul(1x{m}x{k}x{n}, bf16:GL:row, bf16:GL:row, f32:GL:row, serial)")
    impl = synthesize(spec, "amx", use_cache=False).impl
    kernel = generate_c(impl, f"mm_amx_{m}x{k}x{n}", "amx")
    src = kernel.c_source
    assert "_tile_dpbf16ps" in src
    # The output is computed in zeroed tiles, never zeroed in memory and loaded back.
    assert "_tile_zero(" in src and "memset" not in src
    _needs_amx()
    verify_with_each_compiler(kernel)


def test_tileable_specs_only_get_actions_that_stay_on_tiles():
    """On amx a bf16 Matmul in whole tiles is not widened, not moved into registers and
    only tiled or split in whole tiles (16 rows/columns, 32 along k)."""
    from morello_build.actions.enumerate import amx_tileable
    from morello_build.actions.tile import Split, TileOut

    t = get_target("amx")
    spec = _accum_spec(64, 128, 64, "row", level="GL")
    assert amx_tileable(spec, t) and not amx_tileable(spec, get_target("avx512"))
    assert not amx_tileable(_accum_spec(64, 48, 64, "row", level="GL"), t)  # K % 32
    acts = enumerate_actions(spec, t)
    moves = [a for a in acts if isinstance(a, Move)]
    assert moves and all(m.level in (Level.L1, Level.GL) for m in moves)
    assert all(m.dtype == spec.operands[m.operand].dtype for m in moves)
    for a in acts:
        if isinstance(a, TileOut):
            assert a.shape[1] % 16 == 0 and a.shape[3] % 16 == 0, a
        if isinstance(a, Split):
            assert a.k % 32 == 0, a
    widen = [a for a in enumerate_actions(spec, get_target("avx512")) if isinstance(a, Move)]
    assert any(m.dtype != spec.operands[m.operand].dtype for m in widen)
