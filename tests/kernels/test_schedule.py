"""Manual scheduling: the ported AVX2 6x16 schedule, mixing with synthesis, errors; the
generated C is compiled and checked against numpy."""

import pytest

from morello_build.codegen.emit import generate_c
from morello_build.harness.verify import IsaUnavailable, verify_kernel
from morello_build.impl.nodes import Alloc, Kernel, Loop
from morello_build.impl.printer import iter_nodes
from morello_build.ir.levels import Level
from morello_build.ir.spec import Spec
from morello_build.ir.text import parse_spec
from morello_build.machine.target import get_target
from morello_build.schedule import Schedule, ScheduleError
from morello_build.schedules import (
    avx2_matmul_6x16,
    avx2_matmul_packed_b,
    avx512_matmul_l2_panels,
    matmul_threads_split_columns,
)
from morello_build.search.dp import Search
from tests.support.compilers import verify_with_each_compiler

SPEC = "MatmulAccum(1x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)"


def _verify_with_gcc_and_clang(kernel) -> None:
    verify_with_each_compiler(kernel)


@pytest.fixture(scope="module")
def scheduled():
    t = get_target("avx2")
    s = avx2_matmul_6x16(Schedule.for_spec(parse_spec(SPEC), t))
    return t, s


def test_hand_schedule_structure(scheduled):
    t, s = scheduled
    # Only the 4-row remainder strip is left for the synthesizer.
    assert [h.text() for h in s.holes()] == [
        "MatmulAccum(1x4x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    ]
    nodes = iter_nodes(s.impl)
    c_tile = [
        n for n in nodes if isinstance(n, Alloc) and n.tensor.level is Level.VRF and n.operand == 2
    ]
    assert c_tile[0].tensor.shape == (1, 6, 16) and c_tile[0].tensor.vector_size == 8
    assert any(isinstance(n, Kernel) and n.name == "BroadcastVecMultAdd" for n in nodes)


@pytest.mark.slow
def test_hand_schedule_mixed_with_synthesis_compiles_and_matches_numpy(scheduled):
    t, s = scheduled
    done = s.synthesize_rest()
    assert not done.holes()
    assert done.impl.cost is not None
    best = Search(t).solve(Spec(parse_spec(SPEC), t.max_limits))
    assert best is not None and best.cost.main <= done.impl.cost.main  # the DP's optimum
    _verify_with_gcc_and_clang(generate_c(done.impl, "mm_6x16", "avx2"))


def test_inapplicable_rewrite_is_a_clear_error():
    t = get_target("avx2")
    s = Schedule.for_spec(parse_spec(SPEC), t)
    with pytest.raises(ScheduleError, match="does not apply"):
        s.select("BroadcastVecMultAdd")
    with pytest.raises(ScheduleError, match="out of range"):
        s.tile_out(6, 16).at((5,), lambda x: x)


@pytest.mark.parametrize("isa,panel", [("avx512", "[2,1,2p32]"), ("avx2", "[2,1,2p16]")])
def test_b_panel_packing_copies_whole_vectors_and_matches_numpy(isa, panel):
    """Packing B into N-panels: each vector lands in one run of a panel, so the copy must
    be whole-vector stores (the Spec's layouts prove it) and the result must be right."""
    t = get_target(isa)
    spec = parse_spec("MatmulAccum(1x16x32x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    s = Schedule.for_spec(spec, t).split(16).move(1, "GL", layout=panel)
    kernel = generate_c(s.synthesize_rest().impl, f"mm_panels_{isa}", isa)
    pack = kernel.c_source.split("memcpy(&buf", 1)
    assert len(pack) == 2, "the panel packing is not written with whole-vector stores"
    try:
        r = verify_kernel(kernel)
    except IsaUnavailable:
        pytest.skip(f"host lacks {isa}")
    assert r.ok, r.details


@pytest.mark.parametrize(
    "shape", [pytest.param("100x64x96", marks=pytest.mark.slow), "32x48x16", "130x40x48"]
)
def test_packed_b_schedule_zeroes_c_in_registers_and_matches_numpy(shape):
    """`avx2_matmul_packed_b`: B packed whole into 16-column panels first (unless it is one
    panel), no memset of C (register tiles start from zero), right results with both
    compilers, including ragged row blocks."""
    m, k, n = (int(x) for x in shape.split("x"))
    t = get_target("avx2")
    spec = parse_spec(f"Matmul(1x{m}x{k}x{n}, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    s = avx2_matmul_packed_b(Schedule.for_spec(spec, t))
    impl = s.synthesize_rest().impl
    nodes = iter_nodes(impl)
    kernels = {x.name for x in nodes if isinstance(x, Kernel)}
    assert "MemsetZero" not in kernels and "VectorZero" in kernels
    if n > 16:
        assert isinstance(impl, Alloc) and impl.operand == 1 and not impl.cache_view
        assert str(impl.tensor.layout) == "[2,1,2p16]" and impl.tensor.level is Level.GL
    _verify_with_gcc_and_clang(generate_c(impl, f"mm_packed_b_{m}", "avx2"))


@pytest.mark.slow
def test_packed_b_schedule_splits_columns_between_threads_and_matches_numpy():
    """Built for 2 threads, the threads split C's columns first and each packs only its
    own columns of B (48 of 96: three panels); results right with both compilers."""
    t = get_target("avx2", threads=2)
    spec = parse_spec("Matmul(1x100x64x96, f32:GL:row, f32:GL:row, f32:GL:row)")
    impl = avx2_matmul_packed_b(Schedule.for_spec(spec, t)).synthesize_rest().impl
    assert isinstance(impl, Loop) and impl.parallel
    body = impl.children[0]
    assert body.spec.shape == (1, 100, 64, 48)
    assert isinstance(body, Alloc) and body.operand == 1 and not body.cache_view
    assert body.tensor.shape == (1, 64, 48) and str(body.tensor.layout) == "[2,1,2p16]"
    _verify_with_gcc_and_clang(generate_c(impl, "mm_packed_b_t2", "avx2"))


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_split_columns_schedule_gives_each_thread_its_columns_and_matches_numpy(isa):
    """Built for 2 threads, the threads split C's columns and the search plans each part;
    for one thread the schedule leaves the Spec to the search."""
    text = "Matmul(1x40x24x64, f32:GL:row, f32:GL:row, f32:GL:row)"
    impl = (
        matmul_threads_split_columns(
            Schedule.for_spec(parse_spec(text), get_target(isa, threads=2))
        )
        .synthesize_rest()
        .impl
    )
    assert isinstance(impl, Loop) and impl.parallel
    assert impl.children[0].spec.shape == (1, 40, 24, 32)
    kernel = generate_c(impl, f"mm_split_cols_{isa}", isa)
    try:
        r = verify_kernel(kernel)
    except IsaUnavailable:
        pytest.skip(f"host lacks {isa}")
    assert r.ok, r.details
    one = Schedule.for_spec(parse_spec(text), get_target(isa))
    assert matmul_threads_split_columns(one) == one
    with pytest.raises(ScheduleError, match="N % 32 == 0 .* each of 2 threads"):
        text48 = "Matmul(1x40x24x48, f32:GL:row, f32:GL:row, f32:GL:row)"
        matmul_threads_split_columns(
            Schedule.for_spec(parse_spec(text48), get_target(isa, threads=2))
        )


def test_packed_b_schedule_says_what_it_needs():
    t = get_target("avx2")
    spec = parse_spec("Matmul(1x64x64x60, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    with pytest.raises(ScheduleError, match="N % 16 == 0"):
        avx2_matmul_packed_b(Schedule.for_spec(spec, t))
    spec = parse_spec("Matmul(2x64x64x64, f32:GL:row, f32:GL:row, f32:GL:row, serial)")
    with pytest.raises(ScheduleError, match="1xMxKxN"):
        avx2_matmul_packed_b(Schedule.for_spec(spec, t))
    spec = parse_spec("Matmul(1x64x64x48, f32:GL:row, f32:GL:row, f32:GL:row)")
    with pytest.raises(ScheduleError, match="N % 32 == 0 .* each of 2 threads"):
        avx2_matmul_packed_b(Schedule.for_spec(spec, get_target("avx2", threads=2)))


@pytest.mark.parametrize("threads", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_l2_panels_schedule_sweeps_each_panel_from_l2_and_matches_numpy(threads):
    """`avx512_matmul_l2_panels`: each 64-column panel of B is copied into L2 (a copy, not
    a view) and swept under 6-row tiles, with a 3-row remainder here; on 2 threads each
    thread takes one panel. Right results with both compilers."""
    t = get_target("avx512", threads=threads)
    serial = ", serial" if threads == 1 else ""
    spec = parse_spec(f"Matmul(1x45x256x128, f32:GL:row, f32:GL:row, f32:GL:row{serial})")
    impl = avx512_matmul_l2_panels(Schedule.for_spec(spec, t)).synthesize_rest().impl
    assert isinstance(impl, Loop) and impl.parallel == (threads > 1)
    panels = [
        n
        for n in iter_nodes(impl)
        if isinstance(n, Alloc) and n.operand == 1 and n.tensor.level is Level.L2
    ]
    assert panels and all(not p.cache_view and p.tensor.shape == (1, 256, 64) for p in panels)
    _verify_with_gcc_and_clang(generate_c(impl, f"mm_l2_panels_t{threads}", "avx512"))


def test_l2_panels_schedule_explains_what_it_cannot_do():
    """Bad shapes and targets get a one-line reason, not a traceback from deep inside."""
    text = "Matmul(1x8x{k}x{n}, f32:GL:row, f32:GL:row, f32:GL:row, serial)"
    cases = [
        (text.format(k=64, n=96), "avx512", "N % 64 == 0"),
        (text.format(k=8192, n=64), "avx512", "does not fit"),
        (text.format(k=64, n=64), "avx2", "needs a target with an L2 level"),
    ]
    for spec, isa, why in cases:
        with pytest.raises(ScheduleError, match=why):
            avx512_matmul_l2_panels(Schedule.for_spec(parse_spec(spec), get_target(isa)))
