"""Memory-limit arithmetic and kernel applicability/cost golden values."""

from morello_build.actions.select import Select, takes
from morello_build.ir.limits import next_pow2, subtract
from morello_build.ir.text import parse_spec
from morello_build.kernels.registry import KERNELS_BY_NAME
from morello_build.machine.target import get_target


def test_subtract_snaps_cache_levels_down():
    assert subtract((16, 16, 64, 96, 64), (3, 5, 3, 32, 0)) == (13, 11, 32, 64, 64)
    assert subtract((16, 16, 64, 64, 64), (17, 0, 0, 0, 0)) is None


def test_next_pow2():
    assert next_pow2(129) == next_pow2(200) == 256
    assert next_pow2(257) == 512


def _cost(kernel, text, isa="avx2"):
    t = get_target(isa)
    s = parse_spec(text)
    k = KERNELS_BY_NAME[kernel]
    assert takes(k, s, t), f"{kernel} should apply to {text}"
    return k.cost(s, t)


def test_vector_assign_cost_counts_vectors():
    # Reference: Assign [2,32] u32 VRF vs 8 <-> L1 costs 8 (one per vector, no L1 term).
    assert _cost("VectorAssign", "Move(2x32, f32:L1:row, f32:VRF:row:8)") == 8


def test_broadcast_fma_cost_and_memory():
    text = "MatmulAccum(1x1x1x32, f32:L1:row, f32:VRF:row:8, f32:VRF:row:8)"
    assert _cost("BroadcastVecMultAdd", text) == 2 * 4 + 1
    t = get_target("avx2")
    plan = Select("BroadcastVecMultAdd").plan(parse_spec(text), t)
    assert plan is not None and plan.own == (0, 1, 0, 0, 0)


def test_broadcast_fma_needs_matching_vector_sizes():
    t = get_target("avx512")
    s = parse_spec("MatmulAccum(1x1x1x32, f32:L1:row, f32:VRF:row:8, f32:VRF:row:16)")
    assert not takes(KERNELS_BY_NAME["BroadcastVecMultAdd"], s, t)


def test_vdpbf16ps_accepts_k128_rejects_k16():
    t = get_target("avx512")
    k = KERNELS_BY_NAME["DotProductLoopVdpbf16ps"]
    ok = parse_spec("MatmulAccum(1x1x128x1, bf16:L1:row, bf16:L1:row, f32:RF)")
    bad = parse_spec("MatmulAccum(1x1x16x1, bf16:L1:row, bf16:L1:row, f32:RF)")
    assert takes(k, ok, t) and not takes(k, bad, t)
    assert not takes(k, ok, get_target("avx2"))


def test_kernel_scratch_is_checked_against_limits():
    from morello_build.ir.spec import Spec
    from morello_build.search.dp import Search

    t = get_target("avx2")
    s = parse_spec("MatmulAccum(1x1x1x8, f32:L1:row, f32:VRF:row:8, f32:VRF:row:8)")
    assert Search(t).solve(Spec(s, (0, 0, 0, 0, 0))) is None
    assert Search(t).solve(Spec(s, (0, 1, 0, 0, 0))) is not None
